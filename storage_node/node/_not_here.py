"""What an I/O worker remembers about shards it looked up and does not serve (a negative cache).

A request naming a shard this node does not serve costs a Meta Service lookup
(``GetShard``, on a control thread). A client that keeps naming a shard that
does not exist, or that this node does not lead, would cost one lookup per
request; so the answer is remembered for a moment and given again at once:
``NotLeader`` for :data:`NOT_LEADER_TTL_S`, ``ShardNotFound`` /
``TopicNotFound`` for :data:`NOT_FOUND_TTL_S`. At most :data:`MAX_SHARDS`
shards are remembered (the oldest go first).

A remembered "not found" must not refuse a topic created since (deleted and
created again under the same name within that moment). The Meta Service's
"not found" answer names the newest topic incarnation handed out so far
(``last_incarnation``); a request that names a newer incarnation
(``ProduceRequest.incarnation``, ``FetchRequest.incarnation``) is for a topic
created after the answer, so it is looked up again. Such look-ups are rate
limited to one per ``NOT_FOUND_TTL_S`` per shard (a request naming a future
incarnation is not served either way), plus those that join a lookup already
under way. A request naming no incarnation gets the remembered answer.

Thread-safety: none; one I/O worker owns an instance.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import NotLeader, RobustMQError, ShardNotFound, TopicNotFound

__all__ = ["MAX_SHARDS", "NOT_FOUND_TTL_S", "NOT_LEADER_TTL_S", "NotHere", "named_incarnation"]

NOT_LEADER_TTL_S = 0.5  # a NotLeader answer is reused this long (a hot loop of misrouted requests)
NOT_FOUND_TTL_S = 1.0  # a ShardNotFound / TopicNotFound from the Meta Service is reused this long
MAX_SHARDS = 1024


@dataclass(slots=True)
class _Miss:
    until: float  # monotonic time the answer is given again until
    error: RobustMQError
    last_incarnation: int | None  # None: no request can prove the answer outdated (NotLeader)
    looked_again: float = float("-inf")  # when a request naming a newer incarnation last looked it up


class NotHere:
    """The remembered answers of one I/O worker's lookups; see the module docstring."""

    def __init__(self) -> None:
        self._misses: OrderedDict[str, _Miss] = OrderedDict()

    def __len__(self) -> int:
        return len(self._misses)

    def remember(self, shard: str, error: RobustMQError, now: float) -> None:
        """Remember a lookup's ``error`` for ``shard`` if it is one worth remembering."""
        if isinstance(error, NotLeader):
            miss = _Miss(now + NOT_LEADER_TTL_S, error, None)
        elif isinstance(error, ShardNotFound | TopicNotFound):
            last = error.fields.get("last_incarnation")
            miss = _Miss(now + NOT_FOUND_TTL_S, error, int(last) if isinstance(last, int) else -1)
        else:
            return
        previous = self._misses.pop(shard, None)
        if previous is not None:  # the rate limit of look-ups for newer incarnations carries over
            miss.looked_again = previous.looked_again
        self._misses[shard] = miss
        while len(self._misses) > MAX_SHARDS:
            self._misses.popitem(last=False)

    def forget(self, shard: str) -> None:
        self._misses.pop(shard, None)

    def answer(self, shard: str, incarnation: int, now: float, *, looking: bool) -> RobustMQError | None:
        """The remembered answer for a request naming ``incarnation`` (-1: none), or None: look it up.

        ``looking``: a lookup of ``shard`` is under way (a request for a newer
        incarnation joins it without counting against the rate limit).
        """
        miss = self._misses.get(shard)
        if miss is None:
            return None
        if now >= miss.until:
            del self._misses[shard]
            return None
        if miss.last_incarnation is None or incarnation <= miss.last_incarnation:
            return miss.error
        if looking:
            return None
        if now - miss.looked_again < NOT_FOUND_TTL_S:
            return miss.error
        miss.looked_again = now
        return None


def named_incarnation(message: pb.NodeRequest) -> int:
    """The topic incarnation a produce or fetch request names (-1: none, or another request)."""
    body = message.WhichOneof("body")
    if body == "produce":
        ask: pb.ProduceRequest | pb.FetchRequest = message.produce
    elif body == "fetch":
        ask = message.fetch
    else:
        return -1
    return int(ask.incarnation) if ask.HasField("incarnation") else -1
