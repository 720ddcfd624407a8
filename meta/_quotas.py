"""Quotas on what the Meta Service stores: topics, partitions, segments per shard, seal rate.

Without them one client can grow the metadata without bound: every topic, partition
and seal adds keys that each lookup, listing, placement and restart reads
(400 produce-and-seal rounds made ``GetShard`` answers of 28.8 KB, three times
slower). Each quota is a Meta Service setting (``robustmq meta --max-...``,
docs/operators.md "Limits"); passing one is :class:`~robustmq.errors.QuotaExceeded`
(fields ``quota``, ``max`` and the count it would have made), counted in a
rate-limited warning, and changes nothing.

What each one bounds:

- ``max_topics``: topics in the cluster (a deleted topic stops counting once
  its deletion is recorded);
- ``max_partitions``: partitions of every topic together;
- ``max_partitions_per_topic``: partitions of one topic (at creation; the
  protocol's hard ceiling is :data:`~robustmq.meta._validation.MAX_PARTITIONS`);
- ``max_segments_per_shard``: segments in one shard's chain, whatever their
  state (the chain's metadata is what grows). A seal that would make the chain
  longer is refused; the storage node treats the refusal as definite (writes go
  on in the active segment, which grows past ``segment_bytes_max``) and tries
  its roll again later, which succeeds once retention has removed old segments.
  Seals the Meta Service itself asks for (a failover that did not finish, an
  under-replicated or draining leader's epoch) and failovers are never refused:
  availability comes before a metadata bound;
- ``min_seal_interval_ms``: the least time between two seals of one shard that
  the Meta Service did not ask for (0: no minimum), so a seal storm costs at
  most one seal per shard per interval;
- ``producer_id_expiration_ms``: how long the record of who a producer id was
  handed to is kept (Kafka's ``producer.id.expiration.ms``, default 7 days;
  :mod:`robustmq.meta._acls`): the retention pass deletes older ones.

Thread-safety: :class:`QuotaLog` is called under the controller's lock only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from robustmq.errors import InvalidConfig, QuotaExceeded

from ._validation import MAX_PARTITIONS

__all__ = ["DEFAULT_QUOTAS", "MetaQuotas", "QuotaLog"]

logger = logging.getLogger("robustmq.meta")

MAX_PRODUCER_ID_EXPIRATION_MS = 3_650 * 86_400_000  # ten years
_LOG_EVERY_S = 10.0  # the least time between two warnings about one quota


@dataclass(frozen=True, slots=True)
class MetaQuotas:
    """The Meta Service's metadata quotas (see the module docstring)."""

    max_topics: int = 10_000
    max_partitions: int = 100_000
    max_partitions_per_topic: int = MAX_PARTITIONS
    max_segments_per_shard: int = 1_000
    min_seal_interval_ms: int = 0
    producer_id_expiration_ms: int = 7 * 86_400_000

    def __post_init__(self) -> None:
        for name, low, high in (
            ("max_topics", 1, 10_000_000),
            ("max_partitions", 1, 100_000_000),
            ("max_partitions_per_topic", 1, MAX_PARTITIONS),
            ("max_segments_per_shard", 2, 10_000_000),
            ("min_seal_interval_ms", 0, 86_400_000),
            ("producer_id_expiration_ms", 1_000, MAX_PRODUCER_ID_EXPIRATION_MS),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidConfig(
                    f"{name} must be an integer from {low:,} to {high:,}, got {value!r}",
                    field=name,
                    value=str(value)[:40],
                )


DEFAULT_QUOTAS = MetaQuotas()


class QuotaLog:
    """Counts refusals by quota and logs them, at most once per quota every 10 s."""

    def __init__(self) -> None:
        self.refused: dict[str, int] = {}
        self._logged: dict[str, tuple[float, int]] = {}  # quota -> (when, count then)

    def refuse(self, error: QuotaExceeded) -> QuotaExceeded:
        """Count ``error`` (log it if due) and return it, to be raised."""
        quota = str(error.fields.get("quota", "?"))
        count = self.refused.get(quota, 0) + 1
        self.refused[quota] = count
        now = time.monotonic()
        last, at_last = self._logged.get(quota, (-_LOG_EVERY_S, 0))
        if now - last >= _LOG_EVERY_S:
            self._logged[quota] = (now, count)
            logger.warning(
                "quota %s: %d request(s) refused (%d since the last warning); last: %s",
                quota,
                count,
                count - at_last,
                error.message,
            )
        return error
