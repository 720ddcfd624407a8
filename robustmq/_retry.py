"""The client's one retry policy: what is retried, how long one attempt may take, the back-off.

Every request to a storage node (the producer's batches, the consumer's
fetches, :class:`robustmq.Client`'s reads, produces and seals) follows it:

- **What is retried**: the retriable errors (``Unavailable``, ``Busy``,
  ``NotLeader``, ``SegmentSealed``, ``RequestTimeout``, ``NotEnoughReplicas``,
  ``ShardFailed``) and ``StaleEpoch`` (the node's view of the segment chain
  differs from ours). Before a retry the partition's cached metadata is
  dropped, so the next attempt asks the Meta Service (``GetShard``) where the
  active segment is now: after a failover, that is the new leader and epoch.
  An idempotent producer keeps its producer id and the batch's sequence, so a
  retry of a batch the old leader had stored is answered as a duplicate.
- **One attempt** waits at most :attr:`RetryPolicy.attempt_timeout_s`
  (15 s: above a node's default ``ack_timeout_ms`` of 10 s, so an ``acks=all``
  wait is never cut short by the client), a long-poll fetch its wait plus
  :attr:`RetryPolicy.fetch_margin_s`. A node that dies or stops answering
  does not cost that long: the transport sees the connection drop (a killed
  process) or its ZeroMQ heartbeats go unanswered (a paused process, a cut
  link) and fails the requests sent to it at once (see
  :mod:`robustmq._transport`).
- **Back-off** between attempts: :attr:`RetryPolicy.backoff_first_s` doubling
  up to :attr:`RetryPolicy.backoff_max_s` (0.05 s to 0.4 s, with +-20 %
  jitter so many clients do not retry in step); the first two retries after
  ``SegmentSealed`` go at once (a seal is routine: the refreshed metadata
  names the next epoch). The cap is low because a failover takes about a
  second: a client that backed off for longer would add its own wait to it.
- **Overall bound**: the caller's deadline (the client's ``timeout_s``, a
  producer's ``delivery_timeout_s``); the last error is raised when it passes.
  Every request tells the node its timeout, and a node answers what it holds
  (a write waiting for replicas or for a seal) before then, with an error that
  names the shard. No retry starts with less than :meth:`RetryPolicy.floor_s`
  left (:attr:`RetryPolicy.min_attempt_s`, 0.5 s, or a quarter of a shorter
  overall timeout), counted when the request would go out (a slow metadata
  lookup counts): that attempt would end in the client's own timeout before a
  node could say why, so the last error is raised instead.

Reads of a sealed segment move to another member of its ``isr`` after a
failure that is the node's (:meth:`RetryPolicy.moves_to_another_replica`).

Immutable; shared by every thread of a client.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from robustmq.errors import NotLeader, RequestTimeout, RobustMQError, SegmentSealed, StaleEpoch, Unavailable

__all__ = ["DEFAULT_RETRY", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """See the module docstring."""

    attempt_timeout_s: float = 15.0
    fetch_margin_s: float = 5.0
    min_attempt_s: float = 0.5
    backoff_first_s: float = 0.05
    backoff_max_s: float = 0.4

    @staticmethod
    def retriable(error: BaseException) -> bool:
        """Whether a request that failed with ``error`` may succeed when sent again."""
        return isinstance(error, RobustMQError) and (error.retriable or isinstance(error, StaleEpoch))

    def floor_s(self, timeout_s: float) -> float:
        """The least time worth a retry under an overall ``timeout_s`` (see the module docstring)."""
        return min(self.min_attempt_s, timeout_s / 4)

    def worth_another_attempt(self, error: BaseException, remaining_s: float, timeout_s: float) -> bool:
        """Whether to send again after ``error`` with ``remaining_s`` left of the caller's ``timeout_s``."""
        return self.retriable(error) and remaining_s > self.floor_s(timeout_s)

    @staticmethod
    def moves_to_another_replica(error: BaseException) -> bool:
        """Whether a read should go to another replica next: the node is down, cut off or slow
        (a ``NotLeader`` is an ``Unavailable`` but an answer: the metadata is refreshed instead)."""
        return isinstance(error, Unavailable | RequestTimeout) and not isinstance(error, NotLeader)

    def backoff_s(self, error: BaseException, attempts: int) -> float:
        """Seconds to wait before attempt ``attempts + 1`` after ``error`` ended attempt ``attempts``."""
        if isinstance(error, SegmentSealed) and attempts <= 2:
            return 0.0
        base = min(self.backoff_first_s * 2 ** max(attempts - 1, 0), self.backoff_max_s)
        return base * random.uniform(0.8, 1.2)

    def attempt_s(self, remaining_s: float, *, wait_ms: int = 0) -> float:
        """How long one attempt may take: its own bound, at most ``remaining_s`` (never below 0.1 s)."""
        own = self.attempt_timeout_s if wait_ms <= 0 else wait_ms / 1000 + self.fetch_margin_s
        return max(0.1, min(own, remaining_s))


DEFAULT_RETRY = RetryPolicy()
