"""Topics and their shards' segment chains, as stored (keys ``T``, ``S`` and ``R``).

A topic record holds its full config (defaults filled). Each shard
``{topic}_{partition}`` has a chain of segments, one key per epoch; epochs
start at 0 and are contiguous, every segment but the last is SEALED (or
TIERED) with an exclusive ``end_offset`` equal to the next one's
``start_offset``, and the last is ACTIVE (``end_offset`` -1, a leader set).
``R`` records which node sealed an epoch, so a repeated seal request can be
recognised and answered again. ``A`` records how many replicas an epoch was
placed on, if repair grew its replicas while it was active (earlier versions
did; now an under-replicated active segment is sealed instead, so nothing
writes it): the replica sets it had are the prefixes of ``replicas`` from
that length on, which failover needs (see :mod:`._failover_rules`). ``I``
holds the last incarnation handed out: a new topic gets
``max(last + 1, now in ms)``, unique for the store's life and, through the
clock, even after a store is wiped and started afresh.

Reads go straight to the store. A lookup of part of a chain (its ends, the
segments from the one holding an offset: ``GetShard`` with ``tail`` or
``offset``, ``DescribeTopic`` with ``tail`` for each shard) reads about
``log2(length)`` segments plus those it answers, by a reverse scan, point
reads by epoch and a short scan, never the whole chain.
Writes are staged into a
:class:`~robustmq.meta._store.WriteSet` that the caller commits with everything
else the operation changes. Not locked here: the controller's lock covers it.
"""

from __future__ import annotations

from collections.abc import Iterator

from robustmq._proto import robustmq_pb2 as pb
from robustmq._topics import shard_name
from robustmq.errors import ShardNotFound, TopicNotFound

from . import _keys as keys
from ._store import MetaStore, WriteSet

__all__ = ["TopicTable"]


class TopicTable:
    """Topic records and segment chains in a :class:`MetaStore`."""

    def __init__(self, store: MetaStore) -> None:
        self._store = store

    # -- topics ------------------------------------------------------------

    def get(self, name: str) -> pb.Topic | None:
        raw = self._store.get(keys.topic_key(name))
        return None if raw is None else pb.Topic.FromString(raw)

    def require(self, name: str) -> pb.Topic:
        """The topic, or :class:`TopicNotFound`."""
        topic = self.get(name)
        if topic is None:
            raise TopicNotFound(f"topic {name!r} does not exist", topic=name)
        return topic

    def all(self) -> list[pb.Topic]:
        """Every topic, sorted by name."""
        topics = [pb.Topic.FromString(raw) for _, raw in self._store.scan(keys.TOPIC)]
        return sorted(topics, key=lambda topic: topic.name)

    def page(self, after: str, limit: int) -> tuple[list[pb.Topic], str]:
        """Up to ``limit`` topics after the topic named ``after`` ("" for the first) in store
        order (shorter names first, then by name), and the next page's token: the page's last
        name, or "" when no topic follows. Reads ``limit + 1`` records at most."""
        start = keys.topic_key(after) + b"\x00" if after else b""
        page: list[pb.Topic] = []
        for _, raw in self._store.scan(keys.TOPIC, start=start):
            if len(page) == limit:
                return page, page[-1].name
            page.append(pb.Topic.FromString(raw))
        return page, ""

    def last_incarnation(self) -> int:
        """The newest incarnation handed out so far (0: none yet)."""
        raw = self._store.get(keys.INCARNATION_KEY)
        return keys.decode_incarnation(raw) if raw is not None else 0

    def next_incarnation(self, now_ms: int) -> int:
        """The incarnation for a topic created now (see the module docstring)."""
        return max(self.last_incarnation() + 1, now_ms)

    def stage_create(self, topic: pb.Topic, first_segments: list[pb.Segment], ws: WriteSet) -> None:
        ws.put(keys.topic_key(topic.name), topic.SerializeToString())
        ws.put(keys.INCARNATION_KEY, keys.encode_incarnation(topic.incarnation))
        for partition, segment in enumerate(first_segments):
            self.stage_segment(topic.name, partition, segment, ws)

    def stage_topic(self, topic: pb.Topic, ws: WriteSet) -> None:
        """Stage rewriting an existing topic's record (``AlterTopic``: its config)."""
        ws.put(keys.topic_key(topic.name), topic.SerializeToString())

    def stage_delete(self, name: str, ws: WriteSet) -> list[pb.Segment]:
        """Stage removing the topic, its chains and seal records; returns its segments."""
        segments: list[pb.Segment] = []
        for key, raw in self._store.scan(keys.segments_prefix(name)):
            segments.append(pb.Segment.FromString(raw))
            ws.delete(key)
        for prefix in (keys.seals_prefix(name), keys.placed_prefix(name), keys.progress_prefix(name)):
            for key, _ in self._store.scan(prefix):
                ws.delete(key)
        ws.delete(keys.topic_key(name))
        return segments

    # -- segments ----------------------------------------------------------

    def chain(self, topic: str, partition: int) -> list[pb.Segment]:
        """A shard's segments, oldest first; :class:`ShardNotFound` if it has none."""
        chain = [
            pb.Segment.FromString(raw) for _, raw in self._store.scan(keys.segments_prefix(topic, partition))
        ]
        if not chain:
            shard = shard_name(topic, partition)
            raise ShardNotFound(f"shard {shard!r} does not exist", shard=shard)
        return chain

    def chain_ends(self, topic: str, partition: int, tail: int) -> tuple[pb.Segment, list[pb.Segment]]:
        """A shard's first segment and its last ``tail`` (at least 1) segments, oldest first,
        reading only those from the store (a chain's epochs are contiguous: see the module
        docstring); :class:`ShardNotFound` if it has none."""
        prefix = keys.segments_prefix(topic, partition)
        last: list[pb.Segment] = []
        for _, raw in self._store.scan_reverse(prefix):
            last.append(pb.Segment.FromString(raw))
            if len(last) >= tail:
                break
        if not last:
            shard = shard_name(topic, partition)
            raise ShardNotFound(f"shard {shard!r} does not exist", shard=shard)
        last.reverse()
        if len(last) < tail or last[0].epoch == 0:  # the whole chain
            return last[0], last
        first = next(iter(self._store.scan(prefix)), None)
        return (pb.Segment.FromString(first[1]) if first is not None else last[0]), last

    def segments_from(
        self, topic: str, partition: int, offset: int, first: pb.Segment, before: int, count: int
    ) -> list[pb.Segment]:
        """Up to ``count`` segments of the shard, oldest first, from the one holding ``offset``
        and below epoch ``before``: none if ``offset`` is below ``first`` (the chain's first
        segment) or at or past the start of epoch ``before``.

        A bisection by start offset over the epochs ``first.epoch .. before - 1`` (point reads,
        start offsets grow with the epoch), then one short scan: about ``log2(length) + count``
        segments read, whatever the chain's length.
        """
        if offset < first.start_offset:
            return []
        low, high = first.epoch, before - 1  # the holder is the last epoch starting at or below
        while low < high:
            middle = (low + high + 1) // 2
            probed = self.segment(topic, partition, middle)
            if probed is None:  # a gap in the epochs: the invariant does not hold, find nothing
                return []
            if probed.start_offset <= offset:
                low = middle
            else:
                high = middle - 1
        start = keys.segment_key(topic, partition, low)
        found: list[pb.Segment] = []
        for _, raw in self._store.scan(keys.segments_prefix(topic, partition), start=start):
            segment = pb.Segment.FromString(raw)
            if segment.epoch >= before:
                break
            found.append(segment)
            if len(found) == count:
                break
        if found and not found[0].start_offset <= offset < found[0].end_offset:
            return []  # at or past epoch ``before``'s start
        return found

    def chains(self, topic: str) -> dict[int, list[pb.Segment]]:
        """Every shard's chain of one topic, by partition (one scan)."""
        chains: dict[int, list[pb.Segment]] = {}
        prefix = keys.segments_prefix(topic)
        for key, raw in self._store.scan(prefix):
            partition = int.from_bytes(key[len(prefix) : len(prefix) + 4], "big")
            chains.setdefault(partition, []).append(pb.Segment.FromString(raw))
        return chains

    def segment(self, topic: str, partition: int, epoch: int) -> pb.Segment | None:
        raw = self._store.get(keys.segment_key(topic, partition, epoch))
        return None if raw is None else pb.Segment.FromString(raw)

    def all_segments(self) -> Iterator[pb.Segment]:
        """Every segment of every topic, by topic, partition and epoch (one scan)."""
        for _, raw in self._store.scan(keys.SEGMENT):
            yield pb.Segment.FromString(raw)

    def active_segments(self) -> Iterator[pb.Segment]:
        """Every ACTIVE segment of every topic (to rebuild load counts at start)."""
        for _, raw in self._store.scan(keys.SEGMENT):
            segment = pb.Segment.FromString(raw)
            if segment.state == pb.ACTIVE:
                yield segment

    def stage_segment(self, topic: str, partition: int, segment: pb.Segment, ws: WriteSet) -> None:
        ws.put(keys.segment_key(topic, partition, segment.epoch), segment.SerializeToString())

    def placed_count(self, topic: str, partition: int, epoch: int) -> int | None:
        """How many replicas ``epoch`` was placed on, if an earlier version's repair grew it while
        active (else None)."""
        raw = self._store.get(keys.placed_key(topic, partition, epoch))
        return None if raw is None else int.from_bytes(raw, "big")

    def sealed_by(self, topic: str, partition: int, epoch: int) -> str | None:
        """The node whose seal request closed ``epoch``, if it was sealed by request."""
        raw = self._store.get(keys.seal_key(topic, partition, epoch))
        return None if raw is None else raw.decode("utf-8")

    def stage_sealed_by(self, topic: str, partition: int, epoch: int, node_id: str, ws: WriteSet) -> None:
        ws.put(keys.seal_key(topic, partition, epoch), node_id.encode("utf-8"))
