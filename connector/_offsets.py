"""The source's offsets and the pure decisions made on them: what a micro-batch covers, the checks
that catch records going missing between two micro-batches, and admission control.

Format, as Spark checkpoints it (JSON-friendly primitives)::

    {"orders": {"0": 1200, "1": 1187},                       next offset per partition
     "@topics": {"orders": {"created_ms": 1763800000000}},   identity of each topic read
     "@start": {"orders": {"0": 1000, "1": 990}},            only in the end of a query's first batch
     "@restart": {"orders": [1]}}                             only after a loss read again from 0

``@`` cannot start a topic name, so these entries never collide with a
topic. A topic's identity (:func:`identity_of`) is its creation time, plus
its ``incarnation`` where the Meta Service's ``Topic`` message has that
field; two identities are compared on the keys both have, so checkpoints
written before an identity key existed stay readable. Checkpoints without
``@topics`` (written before it existed) have unknown identities, which are
never taken for a change.

Where a query starts is decided once: the stream's ``initialOffset()`` is
the placeholder ``{"@initial": true}``, the start positions are computed
when the first batch is planned, and that batch's end carries them
(``@start``). Spark logs that end before it runs the batch, and asks for
``initialOffset()`` again whenever it runs (or, after a crash, replays) the
first batch; the batch is planned from ``@start``, so a start that moves with
the topic (``latest``, a timestamp with strategy ``latest``) cannot move a
replayed batch. ``@restart`` names the partitions a batch reads from the
beginning of their log after a data loss it reported (``failOnDataLoss=false``):
a batch whose start is past its end is never read from the beginning unless
its end says so (or its end was logged before ``@restart`` existed, when such
a batch was planned only after reporting that the partition's offsets went
back; see :func:`starts_past_end`). A first batch whose end has no ``@start``
(logged by an older version) has its start computed again, and a start past
the end is reported as data loss (:func:`find_start_past_end`).

Data loss (Kafka's ``failOnDataLoss``): between the end of one micro-batch
and the next planning, :func:`find_data_loss` reports a topic that vanished,
a topic deleted and re-created (another identity), and a partition whose
high watermark is below the offset already read (offsets gone back: the
topic was re-created, or a node lost acknowledged records). Records removed
by retention are found when a read starts below the log start. With
``failOnDataLoss=false`` the query goes on: a vanished topic is dropped, and
a re-created topic or a partition whose offsets went back is read again
from the beginning of its log (Kafka's source would jump to the latest
offset instead, skipping what the new topic already holds).
:func:`find_unsubscribed` reports the partitions a restarted query no longer
reads because its options changed (Kafka's "partitions are gone"): with
``failOnDataLoss=false`` they are dropped.

Everything here is pure (values in, values out, time passed in), so it is
tested without Spark or a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "IDENTITY_KEY",
    "INITIAL_KEY",
    "RESTART_KEY",
    "START_KEY",
    "Admission",
    "DataLoss",
    "LastSeen",
    "Range",
    "SourceOffsets",
    "admit",
    "find_data_loss",
    "find_start_past_end",
    "find_unsubscribed",
    "identity_of",
    "plan_ranges",
    "same_topic",
    "starts_past_end",
]

IDENTITY_KEY = "@topics"
START_KEY = "@start"
RESTART_KEY = "@restart"
INITIAL_KEY = "@initial"

TopicPartition = tuple[str, int]
Identity = Mapping[str, int]


def identity_of(topic: Any) -> dict[str, int]:
    """The identity of a ``robustmq_pb2.Topic``: ``created_ms``, and ``incarnation`` where the
    message has such a field (set)."""
    identity = {"created_ms": int(topic.created_ms)}
    incarnation = int(getattr(topic, "incarnation", 0) or 0)
    if incarnation:
        identity["incarnation"] = incarnation
    return identity


def same_topic(first: Identity | None, second: Identity | None) -> bool:
    """False only when both identities are known and differ on a key they share."""
    if not first or not second:
        return True
    return all(first[key] == second[key] for key in first.keys() & second.keys())


@dataclass(frozen=True, slots=True)
class SourceOffsets:
    """Where a micro-batch ends: the next offset per (topic, partition), and the topics' identities.

    ``start`` is set only in the end of a query's first batch: the positions that batch starts
    from. ``restart`` holds the partitions the batch reads from the beginning of their log after a
    reported loss. ``initial`` marks the placeholder a stream's ``initialOffset()`` returns (no
    positions: the start is computed when the first batch is planned).
    """

    positions: Mapping[TopicPartition, int]
    identities: Mapping[str, Identity] = field(default_factory=dict)
    start: Mapping[TopicPartition, int] | None = None
    restart: frozenset[TopicPartition] = frozenset()
    initial: bool = False

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> SourceOffsets:
        identities = {t: dict(i) for t, i in data.get(IDENTITY_KEY, {}).items()}
        start = _positions(data[START_KEY]) if START_KEY in data else None
        restart = frozenset(
            (topic, int(partition))
            for topic, partitions in data.get(RESTART_KEY, {}).items()
            for partition in partitions
        )
        return SourceOffsets(_positions(data), identities, start, restart, bool(data.get(INITIAL_KEY)))

    def to_json(self) -> dict[str, Any]:
        data = _positions_json(self.positions)
        identities = {t: dict(sorted(i.items())) for t, i in sorted(self.identities.items()) if t in data}
        if identities:
            data[IDENTITY_KEY] = identities
        if self.start is not None:
            data[START_KEY] = _positions_json(self.start)
        if self.restart:
            restart: dict[str, list[int]] = {}
            for topic, partition in sorted(self.restart):
                restart.setdefault(topic, []).append(partition)
            data[RESTART_KEY] = restart
        if self.initial:
            data[INITIAL_KEY] = True
        return data

    @property
    def topics(self) -> set[str]:
        return {topic for topic, _ in self.positions}

    def by_topic(self) -> dict[str, dict[int, int]]:
        grouped: dict[str, dict[int, int]] = {}
        for (topic, partition), offset in self.positions.items():
            grouped.setdefault(topic, {})[partition] = offset
        return grouped


def _positions(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in data.items()
        if not topic.startswith("@")
        for partition, offset in partitions.items()
    }


def _positions_json(positions: Mapping[TopicPartition, int]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for (topic, partition), offset in sorted(positions.items()):
        data.setdefault(topic, {})[str(partition)] = offset
    return data


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Records a query had not read that are gone; ``restart`` lists the partitions to read again
    from the beginning of their log when the query goes on (``failOnDataLoss=false``)."""

    topic: str
    message: str
    restart: frozenset[TopicPartition] = frozenset()


@dataclass(frozen=True, slots=True)
class LastSeen:
    """The partitions' high watermarks as a stream last saw them (``ends.positions``), the topics'
    identities then, and when (ms since the epoch). Kept in memory for one run: it lets a loss
    message say what the query had not read, and that it had read all it saw."""

    ends: SourceOffsets
    at_ms: int


def find_data_loss(
    start: SourceOffsets,
    high_watermarks: Mapping[TopicPartition, int],
    identities: Mapping[str, Identity],
    vanished: set[str],
    last_seen: LastSeen | None = None,
) -> list[DataLoss]:
    """What went missing since ``start``, given the partitions' current high watermarks, the
    topics' current identities and the topics that no longer exist; ``last_seen`` (the ends of
    an earlier planning of this run, if any) says how much of a vanished topic was unread."""
    losses = []
    for topic, partitions in sorted(start.by_topic().items()):
        if topic in vanished:
            lost = _what_was_lost(topic, partitions, start.identities.get(topic), last_seen)
            losses.append(DataLoss(topic, f"topic {topic} was deleted; {lost}"))
            continue
        if not same_topic(start.identities.get(topic), identities.get(topic)):
            current = sorted(tp for tp in high_watermarks if tp[0] == topic)
            old, new = _created(start.identities[topic]), _created(identities[topic])
            lost = _what_was_lost(topic, partitions, start.identities.get(topic), last_seen)
            losses.append(
                DataLoss(
                    topic,
                    f"topic {topic} was deleted and re-created (the old one created {old}, the new one "
                    f"{new}); of the old topic, {lost}; the new topic's offsets start again from 0, and "
                    "failOnDataLoss=false reads it from there",
                    frozenset(current),
                )
            )
            continue
        for partition, offset in sorted(partitions.items()):
            high = high_watermarks.get((topic, partition))
            if high is None:
                losses.append(
                    DataLoss(topic, f"partition {partition} of topic {topic} is gone (read up to {offset:,})")
                )
            elif high < offset:
                losses.append(
                    DataLoss(
                        topic,
                        f"offsets of topic {topic} partition {partition} went back from {offset} to {high}: "
                        "the topic was probably deleted and re-created, or a node lost records it had "
                        "acknowledged",
                        frozenset({(topic, partition)}),
                    )
                )
    return losses


def find_unsubscribed(
    start: SourceOffsets, dropped: Mapping[TopicPartition, int], topics: set[str]
) -> list[DataLoss]:
    """The partitions of ``start`` a restarted query no longer reads because its options changed,
    given their high watermarks (``dropped``) and the topics it reads now: a topic removed from
    ``topic`` (or no longer matching ``topicPattern``), or partitions removed from ``assign``.
    Kafka's source reports these as partitions that "are gone"; they still exist here."""
    losses = []
    grouped: dict[str, dict[int, int]] = {}
    for (topic, partition), high in dropped.items():
        grouped.setdefault(topic, {})[partition] = high
    for topic, highs in sorted(grouped.items()):
        unread = {
            p: (start.positions[(topic, p)], high)
            for p, high in sorted(highs.items())
            if high > start.positions[(topic, p)]
        }
        count = sum(high - first for first, high in unread.values())
        if count:
            ranges = _listed(
                [f"partition {p} offsets {first:,}-{high - 1:,}" for p, (first, high) in unread.items()]
            )
            left = f"{count:,} records it holds past what the query read will not be read ({ranges})"
        else:
            left = "the query had read all it holds"
        if topic in topics:
            numbers = sorted(highs)
            what = (
                f"partition {numbers[0]} of topic {topic} is"
                if len(numbers) == 1
                else f"partitions {_listed([str(n) for n in numbers])} of topic {topic} are"
            )
            why = "the query's 'assign' option no longer names it"
        else:
            what, why = f"topic {topic} is", "the query's topics no longer include it, though it still exists"
        losses.append(DataLoss(topic, f"{what} no longer read by this query ({why}); {left}"))
    return losses


def starts_past_end(start: SourceOffsets, end: SourceOffsets) -> frozenset[TopicPartition]:
    """Partitions of the micro-batch ``(start, end]`` whose start is past their planned end, of the
    same topic, that the end does not name in ``@restart``. A batch planned by this version never
    has one unless its start was computed again (a replayed first batch logged without ``@start``);
    an end logged before ``@restart`` existed has one where its planning reported that the
    partition's offsets went back and read it again from the beginning."""
    return frozenset(
        (topic, partition)
        for (topic, partition), stop in end.positions.items()
        if (first := start.positions.get((topic, partition))) is not None
        and first > stop
        and (topic, partition) not in end.restart
        and same_topic(start.identities.get(topic), end.identities.get(topic))
    )


def find_start_past_end(start: SourceOffsets, end: SourceOffsets) -> list[DataLoss]:
    """:func:`starts_past_end` of a first batch whose start Spark computed again after the batch
    was planned (a first batch logged before ends carried ``@start``, replayed): reading such a
    partition from the beginning would read records twice; it is reported instead, and the batch
    reads nothing of it."""
    losses = []
    for topic, partition in sorted(starts_past_end(start, end)):
        first, stop = start.positions[(topic, partition)], end.positions[(topic, partition)]
        losses.append(
            DataLoss(
                topic,
                f"the micro-batch Spark is running reads topic {topic} partition {partition} from a "
                f"start computed again since the batch was planned: it starts at offset {first}, after "
                f"its planned end {stop} (a first batch logged by an older connector version, replayed "
                f"after a crash); the batch reads nothing of it, so records it was planned to read "
                f"below offset {stop} may be missing",
            )
        )
    return losses


_LISTED_MAX = 8  # partitions named in a message; the rest are counted


def _listed(items: list[str]) -> str:
    more = len(items) - _LISTED_MAX
    return ", ".join(items[:_LISTED_MAX]) + (f" and {more} more partitions" if more > 0 else "")


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _created(identity: Identity) -> str:
    return _utc(int(identity["created_ms"])) if "created_ms" in identity else "at an unknown time"


def _what_was_lost(
    topic: str, read: Mapping[int, int], identity: Identity | None, last_seen: LastSeen | None
) -> str:
    """What of a topic that is gone the query had not read, as exactly as this run knows it."""
    below = _listed([f"partition {p} below offset {o:,}" for p, o in sorted(read.items())])
    seen = None
    if last_seen is not None and identity and same_topic(identity, last_seen.ends.identities.get(topic)):
        ends = {p: o for (t, p), o in last_seen.ends.positions.items() if t == topic}
        seen = ends if set(read) <= set(ends) and topic in last_seen.ends.identities else None
    if seen is None:
        return f"the query had read {below}; any records it held past those are lost"
    when = _utc(last_seen.at_ms) if last_seen is not None else ""
    unread = {p: (o, seen[p]) for p, o in sorted(read.items()) if seen[p] > o}
    if not unread:
        return (
            f"the query had read all it held when last seen at {when} ({below}): nothing it saw is lost, "
            "only records written after that, if any"
        )
    count = sum(end - first for first, end in unread.values())
    ranges = _listed([f"partition {p} offsets {first:,}-{end - 1:,}" for p, (first, end) in unread.items()])
    return (
        f"{count:,} records the query had not read when it last saw it at {when} are lost: {ranges} "
        "(and any written after that)"
    )


@dataclass(frozen=True, slots=True)
class Range:
    """Records ``[start, end)`` of one partition; ``from_beginning`` when ``start`` is the start of a
    log the query had not read before (a new partition, or one read again after data loss), so a
    log start above ``start`` is not a loss."""

    topic: str
    partition: int
    start: int
    end: int
    from_beginning: bool


def plan_ranges(
    start: SourceOffsets, end: SourceOffsets, *, max_records: int, min_pieces: int
) -> list[Range]:
    """The ranges of a micro-batch ``(start, end]``: at most ``max_records`` each, and at least
    ``min_pieces`` while ranges can be split. Deterministic in ``start`` and ``end``, so a
    replayed batch reads exactly the same records.

    A partition is read from the beginning of its log when it is new, when its topic's identity
    differs between ``start`` and ``end``, or when ``end.restart`` names it (a loss reported when
    the batch was planned). A partition whose start is past its end is read nothing of
    (:func:`find_start_past_end` reports it), never silently from the beginning.
    """
    ranges = []
    for (topic, partition), stop in sorted(end.positions.items()):
        first = start.positions.get((topic, partition))
        fresh = (
            first is None
            or not same_topic(start.identities.get(topic), end.identities.get(topic))
            or (topic, partition) in end.restart
        )
        first = 0 if fresh else first
        assert first is not None
        if stop > first:
            ranges.append(Range(topic, partition, first, stop, fresh))
    pieces = [
        Range(r.topic, r.partition, s, min(s + max_records, r.end), r.from_beginning and s == r.start)
        for r in ranges
        for s in range(r.start, r.end, max_records)
    ]
    while len(pieces) < min_pieces:
        widest = max(range(len(pieces)), key=lambda i: pieces[i].end - pieces[i].start, default=None)
        if widest is None or pieces[widest].end - pieces[widest].start < 2:
            break
        piece = pieces.pop(widest)
        middle = (piece.start + piece.end) // 2
        pieces[widest:widest] = [
            Range(piece.topic, piece.partition, piece.start, middle, piece.from_beginning),
            Range(piece.topic, piece.partition, middle, piece.end, False),
        ]
    return pieces


@dataclass(frozen=True, slots=True)
class Admission:
    """Admission control settings: Spark's read limit plus ``minRecordsPerTrigger``."""

    max_rows: int | None = None
    min_rows: int | None = None
    max_delay_ms: int = 15 * 60_000


def admit(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    admission: Admission,
    *,
    now_ms: int,
    last_trigger_ms: int,
) -> tuple[dict[TopicPartition, int], int]:
    """The end of the next micro-batch and the new last-trigger time (Kafka's rules).

    ``start`` holds where each partition's batch starts (0 for a partition read from its
    beginning). With ``min_rows``, a batch waits until that many records are available or
    ``max_delay_ms`` has passed since the last trigger (the first call always triggers, as in
    Kafka). With ``max_rows``, the budget is shared among partitions in proportion to what each
    has waiting.
    """
    available = {tp: max(0, high - start.get(tp, 0)) for tp, high in latest.items()}
    total = sum(available.values())
    if admission.min_rows is not None:
        if now_ms - last_trigger_ms >= admission.max_delay_ms:
            last_trigger_ms = now_ms
        elif total < admission.min_rows:
            return {tp: start.get(tp, 0) for tp in latest}, last_trigger_ms
        else:
            last_trigger_ms = now_ms
    if admission.max_rows is None or total <= admission.max_rows:
        return dict(latest), last_trigger_ms
    budget = admission.max_rows
    shares = {tp: budget * count // total for tp, count in available.items()}
    left = budget - sum(shares.values())
    for tp in sorted(available, key=lambda tp: (available[tp] - shares[tp], tp), reverse=True):
        if left <= 0:
            break
        if shares[tp] < available[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: start.get(tp, 0) + share for tp, share in shares.items()}, last_trigger_ms
