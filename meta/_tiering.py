"""The tiering side of the controller: seal sequence numbers, ListSealed, MarkTiered,
the cluster config, and the pending deletions of objects (docs/tiering.md).

:class:`TieringControl` is a mixin of :class:`~robustmq.meta._controller.MetaController`
under the controller's rules (one lock, validate first, one atomic batch,
derived state updated only once it is durable).

Seal sequence numbers. Every seal the controller commits (the seal RPC,
failover seals, repair reseals: all go through ``_commit_seal``) is stamped
here with ``sealed_seq`` = the last one + 1 and ``sealed_ms`` = now (never
below the last one handed out), and indexed under ``L`` (and ``U`` while it is
SEALED) in the same batch as the seal, with ``Q`` holding the last pair. So
sequence numbers are unique, only grow, survive restarts, and a segment is
listed exactly when it is in a chain. A store from before them (format 1 or
2) gets them when it is opened (:func:`assign_sequences`): every non-active
segment in key order, that is in chain order within a shard, ``sealed_ms`` =
the time of the upgrade (time-based retention then counts from it: late,
never early).

Object deletions. A segment's object is deleted only after the segment left
its chain (whole-log retention, a deleted topic): the same batch that removes
it writes an ``X`` record of the object's URL; :meth:`TieringControl.pending_object_deletions`
lists them and :meth:`TieringControl.forget_object_deletions` drops the ones
done. The object store is called outside the lock (the retention worker does
it), so a slow store never stalls the Meta Service; a crash between the two
leaves the record, and the delete is retried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, ObjectStoreError, ShardNotFound, TopicNotFound
from robustmq.tier._store import ObjectStore, segment_key

from . import _keys as keys
from ._load import AssignmentVersions
from ._store import MetaStore, WriteSet
from ._topics import TopicTable
from ._validation import split_shard

__all__ = [
    "LIST_SEALED_DEFAULT",
    "LIST_SEALED_MAX",
    "MAX_OBJECT_URL_CHARS",
    "TieringControl",
    "assign_sequences",
    "decode_last_seal",
    "encode_last_seal",
]

LIST_SEALED_DEFAULT = 1_000
LIST_SEALED_MAX = 10_000
MAX_OBJECT_URL_CHARS = 2_048
_UPGRADE_BATCH = 5_000
_LIST_CHUNK = 500  # index entries ListSealed reads per hold of the lock

logger = logging.getLogger("robustmq.meta")


def encode_last_seal(seq: int, sealed_ms: int) -> bytes:
    return seq.to_bytes(8, "big") + max(sealed_ms, 0).to_bytes(8, "big")


def decode_last_seal(raw: bytes | None) -> tuple[int, int]:
    """``(last sealed_seq, last sealed_ms)`` of the ``Q`` record (``(0, 0)``: none yet)."""
    if raw is None:
        return 0, 0
    return int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big")


def _stage_index(topic: str, partition: int, segment: pb.Segment, ws: WriteSet) -> None:
    entry = keys.encode_sealed_entry(topic, partition, segment.epoch)
    ws.put(keys.sealed_index_key(keys.SEALED_INDEX, segment.sealed_seq), entry)
    if segment.state == pb.SEALED:
        ws.put(keys.sealed_index_key(keys.UNTIERED_INDEX, segment.sealed_seq), entry)
    else:
        ws.delete(keys.sealed_index_key(keys.UNTIERED_INDEX, segment.sealed_seq))


def stage_unindex(segment: pb.Segment, ws: WriteSet) -> None:
    """Stage removing a segment that leaves its chain from the seal indexes."""
    if segment.sealed_seq:
        ws.delete(keys.sealed_index_key(keys.SEALED_INDEX, segment.sealed_seq))
        ws.delete(keys.sealed_index_key(keys.UNTIERED_INDEX, segment.sealed_seq))


def assign_sequences(store: MetaStore, now_ms: int) -> int:
    """Give every non-active segment without a ``sealed_seq`` one, in key (chain) order; how many.

    Written in batches that each carry the new ``Q``, so a crash part way
    leaves a consistent store and the next open carries on where it stopped.
    """
    last_seq, last_ms = decode_last_seal(store.get(keys.LAST_SEAL_KEY))
    sealed_ms = max(now_ms, last_ms)
    assigned = 0
    ws = WriteSet()
    for key, raw in store.scan(keys.SEGMENT):
        segment = pb.Segment.FromString(raw)
        if segment.state == pb.ACTIVE or segment.sealed_seq:
            continue
        last_seq += 1
        segment.sealed_seq = last_seq
        segment.sealed_ms = sealed_ms
        topic, partition = _shard_of_segment_key(key)
        ws.put(key, segment.SerializeToString())
        _stage_index(topic, partition, segment, ws)
        assigned += 1
        if len(ws.puts) >= _UPGRADE_BATCH:
            ws.put(keys.LAST_SEAL_KEY, encode_last_seal(last_seq, sealed_ms))
            ws.commit(store)
            ws = WriteSet()
    ws.put(keys.LAST_SEAL_KEY, encode_last_seal(last_seq, sealed_ms))
    ws.commit(store)
    return assigned


def _shard_of_segment_key(key: bytes) -> tuple[str, int]:
    start = len(keys.SEGMENT) + 2
    end = start + int.from_bytes(key[start - 2 : start], "big")
    return key[start:end].decode("utf-8"), int.from_bytes(key[end : end + 4], "big")


def _now_ms() -> int:
    return int(time.time() * 1000)


class TieringControl:
    """Tiering operations of the Meta Service (see the module docstring)."""

    _store: MetaStore
    _topics: TopicTable
    _versions: AssignmentVersions
    _tier_url: str
    _tier_store: ObjectStore | None
    _last_seal: tuple[int, int]  # (last sealed_seq, last sealed_ms), as stored in "Q"

    def _locked(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # the controller's

    # -- seals -------------------------------------------------------------

    def _stage_seal_stamp(
        self, topic: str, partition: int, sealed: pb.Segment, ws: WriteSet
    ) -> tuple[int, int]:
        """Stamp ``sealed`` with the next ``sealed_seq`` and ``sealed_ms``, index it, stage ``Q``.

        Returns the new ``(seq, ms)``, for :attr:`_last_seal` once the batch is durable.
        """
        seq = self._last_seal[0] + 1
        sealed_ms = max(_now_ms(), self._last_seal[1])
        sealed.sealed_seq = seq
        sealed.sealed_ms = sealed_ms
        _stage_index(topic, partition, sealed, ws)
        ws.put(keys.LAST_SEAL_KEY, encode_last_seal(seq, sealed_ms))
        return seq, sealed_ms

    def _stage_object_deletion(self, url: str, ws: WriteSet) -> None:
        if url:
            ws.put(keys.object_deletion_key(url), b"")

    def _would_be_url(self, topic: str, partition: int, incarnation: int, segment: pb.Segment) -> str:
        """Where the tiering job puts ``segment``'s object in the current store ("" without one).

        Never raises: a segment with no valid key (an invariant broken elsewhere) has no
        object that could have been put, so there is nothing to delete or accept ("").
        """
        if self._tier_store is None:
            return ""
        key = segment_key(topic, partition, segment.epoch, segment.start_offset, incarnation=incarnation)
        try:
            return self._tier_store.url_of(key)
        except ObjectStoreError as error:
            logger.error("%s_%d epoch %d has no object key: %s", topic, partition, segment.epoch, error)
            return ""

    def _stage_forget_segments(
        self, topic: str, partition: int, incarnation: int, segments: Iterable[pb.Segment], ws: WriteSet
    ) -> int:
        """Stage the deletion of the objects of segments leaving their chain, and unindex them.

        A SEALED one may have an upload in flight: its would-be object is deleted too (absent is
        fine). Returns how many were still SEALED while a tier URL is set (never tiered).
        """
        untiered = 0
        for segment in segments:
            stage_unindex(segment, ws)
            if segment.state in (pb.TIERED, pb.REMOTE):
                self._stage_object_deletion(segment.object_url, ws)
            elif segment.state == pb.SEALED and self._tier_store is not None:
                self._stage_object_deletion(self._would_be_url(topic, partition, incarnation, segment), ws)
                untiered += 1
        return untiered

    # -- RPCs --------------------------------------------------------------

    def cluster_config(self) -> pb.ClusterConfig:
        return pb.ClusterConfig(tier_url=self._tier_url)

    def list_sealed(
        self, after_seq: int, limit: int = 0, untiered_only: bool = False
    ) -> pb.ListSealedResponse:
        """Segments in a chain with ``sealed_seq > after_seq``, in ``sealed_seq`` order (one page).

        ``limit`` 0 means :data:`LIST_SEALED_DEFAULT`; more than :data:`LIST_SEALED_MAX` is
        cut to it. ``untiered_only``: only those still SEALED. ``last_seq`` is the last
        ``sealed_seq`` handed out, whether or not its segment is still listed.
        """
        if limit < 0 or after_seq < 0:
            raise InvalidRequest(
                f"limit and after_seq must not be negative, got {limit} and {after_seq}",
                limit=limit,
                after_seq=after_seq,
            )
        limit = min(limit or LIST_SEALED_DEFAULT, LIST_SEALED_MAX)
        index = keys.UNTIERED_INDEX if untiered_only else keys.SEALED_INDEX
        start = keys.sealed_index_key(index, min(after_seq + 1, 2**64 - 1))
        found: list[pb.SealedSegment] = []
        incarnations: dict[str, int] = {}
        while True:
            # In chunks, each under the lock: a 10,000-segment page never holds it for long.
            with self._locked():
                read = 0
                for key, value in self._store.scan(index, start=start):
                    read += 1
                    start = key + b"\x00"  # the next chunk starts after it
                    entry = self._sealed_entry(index, key, value, incarnations)
                    if entry is not None:
                        found.append(entry)
                    if len(found) >= limit or read >= _LIST_CHUNK:
                        break
                last_seq = self._last_seal[0]  # at least every sealed_seq listed so far
            if len(found) >= limit or read < _LIST_CHUNK:
                return pb.ListSealedResponse(segments=found, last_seq=last_seq)

    def _sealed_entry(
        self, index: bytes, key: bytes, value: bytes, incarnations: dict[str, int]
    ) -> pb.SealedSegment | None:
        """The listed segment a seal index entry points at (None, with a warning, if it is not there)."""
        topic, partition, epoch = keys.decode_sealed_entry(value)
        segment = self._topics.segment(topic, partition, epoch)
        seq = int.from_bytes(key[len(index) :], "big")
        if segment is None or segment.sealed_seq != seq:
            logger.warning(
                "seal index entry %d points at a missing %s_%d epoch %d", seq, topic, partition, epoch
            )
            return None
        if topic not in incarnations:
            incarnations[topic] = self._topics.require(topic).incarnation
        return pb.SealedSegment(
            topic=topic, partition=partition, incarnation=incarnations[topic], segment=segment
        )

    def mark_tiered(
        self,
        shard: str,
        incarnation: int,
        epoch: int,
        object_url: str,
        object_bytes: int,
        max_timestamp_ms: int,
    ) -> pb.Segment:
        """Record that sealed ``epoch`` of ``shard`` is in the object store: it becomes TIERED.

        Idempotent (the same request again answers the segment as stored, TIERED or REMOTE).
        Refused, changing nothing, with ``InvalidRequest`` (its ``reason`` field says which):
        no tier URL is configured (``no tier url``); ``object_url`` is not the segment's key in
        the tier URL's store (``wrong url``); the segment is active (``active``), is not in the
        chain yet (``unknown epoch``), left the chain through retention (``removed``), or is
        already tiered at another URL or size (``another object``); ``object_bytes`` is not
        positive. ``ShardNotFound`` / ``TopicNotFound`` for a deleted topic or another
        incarnation. For a segment that left the chain or a deleted incarnation, the object
        the job just put is recorded for deletion in the same step, so it never leaks.
        """
        topic, partition = split_shard(shard)
        where = {"shard": shard, "epoch": epoch}
        if not isinstance(object_url, str) or not 0 < len(object_url) <= MAX_OBJECT_URL_CHARS:
            raise InvalidRequest("object_url must be 1-2,048 characters", **where, reason="wrong url")
        if object_bytes <= 0 or max_timestamp_ms < -1:
            raise InvalidRequest(
                f"object_bytes must be positive and max_timestamp_ms at least -1, got {object_bytes} "
                f"and {max_timestamp_ms}",
                **where,
                object_bytes=object_bytes,
                max_timestamp_ms=max_timestamp_ms,
            )
        if self._tier_store is None:
            raise InvalidRequest(
                "no tier URL is configured on the Meta Service (robustmq meta --tier-url)",
                **where,
                reason="no tier url",
            )
        with self._locked():
            record = self._topics.get(topic)
            try:
                chain = self._topics.chain(topic, partition) if record is not None else []
            except ShardNotFound:
                chain = []
            if record is None or record.incarnation != incarnation or not chain:
                self._refuse_gone(topic, partition, incarnation, epoch, object_url, record)
            assert record is not None
            if epoch < chain[0].epoch:
                self._drop_stray_object(topic, partition, incarnation, epoch, object_url)
                raise InvalidRequest(
                    f"shard {shard!r} epoch {epoch} left the chain (retention); its object is deleted",
                    **where,
                    reason="removed",
                )
            if epoch > chain[-1].epoch:
                raise InvalidRequest(f"shard {shard!r} has no epoch {epoch}", **where, reason="unknown epoch")
            segment = chain[epoch - chain[0].epoch]
            expected = self._would_be_url(topic, partition, incarnation, segment)
            if segment.state == pb.ACTIVE:
                raise InvalidRequest(
                    f"shard {shard!r} epoch {epoch} is active: only sealed segments are tiered",
                    **where,
                    reason="active",
                )
            if segment.state in (pb.TIERED, pb.REMOTE):
                if segment.object_url == object_url and segment.object_bytes == object_bytes:
                    return segment
                raise InvalidRequest(
                    f"shard {shard!r} epoch {epoch} is already tiered as {segment.object_url} "
                    f"({segment.object_bytes} bytes), not {object_url[:200]} ({object_bytes} bytes)",
                    **where,
                    reason="another object",
                    object_url=segment.object_url,
                )
            if object_url != expected:
                raise InvalidRequest(
                    f"shard {shard!r} epoch {epoch}: object URL {object_url[:200]} is not the segment's "
                    f"key in the tier URL's store ({expected})",
                    **where,
                    reason="wrong url",
                    expected=expected,
                )
            tiered = pb.Segment()
            tiered.CopyFrom(segment)
            tiered.state = pb.TIERED
            tiered.object_url = object_url
            tiered.object_bytes = object_bytes
            tiered.max_timestamp_ms = max_timestamp_ms
            ws = WriteSet()
            self._topics.stage_segment(topic, partition, tiered, ws)
            _stage_index(topic, partition, tiered, ws)
            ws.commit(self._store)
            self._versions.bump_segments((tiered,))
        logger.info("%s epoch %d is tiered at %s (%d bytes)", shard, epoch, object_url, object_bytes)
        return tiered

    def _refuse_gone(
        self,
        topic: str,
        partition: int,
        incarnation: int,
        epoch: int,
        object_url: str,
        record: pb.Topic | None,
    ) -> None:
        """Raise for a MarkTiered of a deleted topic or incarnation, recording its object for deletion."""
        shard = f"{topic}_{partition}"
        self._drop_stray_object(topic, partition, incarnation, epoch, object_url)
        if record is None:
            raise TopicNotFound(f"topic {topic!r} does not exist", topic=topic, shard=shard)
        raise ShardNotFound(
            f"shard {shard!r} of incarnation {incarnation} was deleted (the topic's incarnation is "
            f"{record.incarnation})",
            shard=shard,
            incarnation=incarnation,
            current_incarnation=record.incarnation,
        )

    def _drop_stray_object(self, topic: str, partition: int, incarnation: int, epoch: int, url: str) -> None:
        """Record ``url`` for deletion if it is the key of that (gone) segment in the current store."""
        assert self._tier_store is not None
        try:
            key = self._tier_store.key_of(url)
        except ObjectStoreError:
            return
        if key.startswith(f"{topic}/{partition}/{incarnation}/{epoch:010d}-") and key.endswith(".parquet"):
            ws = WriteSet()
            self._stage_object_deletion(url, ws)
            ws.commit(self._store)
            logger.info("%s_%d epoch %d is gone: its object %s is deleted", topic, partition, epoch, url)

    # -- object deletions (the retention worker's side) ----------------------

    def pending_object_deletions(self, limit: int, after: str = "") -> list[str]:
        """Up to ``limit`` object URLs still to delete, in key order, those after ``after`` only."""
        start = keys.object_deletion_key(after) + b"\x00" if after else b""
        with self._locked():
            urls = []
            for key, _ in self._store.scan(keys.OBJECT_DELETION, start=start):
                urls.append(key[len(keys.OBJECT_DELETION) :].decode("utf-8"))
                if len(urls) >= limit:
                    break
            return urls

    def forget_object_deletions(self, urls: Iterable[str]) -> None:
        """Drop the records of objects that were deleted."""
        ws = WriteSet()
        for url in urls:
            ws.delete(keys.object_deletion_key(url))
        with self._locked():
            ws.commit(self._store)
