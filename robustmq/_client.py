"""``robustmq.connect``: the client handle for admin, reads, producers and consumers.

A :class:`Client` talks to the Meta Service (gRPC, through ``MetaClient``) for
topics, shard placement and group offsets, and to storage nodes (ZeroMQ,
through ``NodeTransport``) for records. Node calls follow the client's one
retry policy (:mod:`robustmq._retry`): a retriable failure drops the
partition's cached metadata and the call is sent again (to the new leader
after a failover, to another replica of a sealed segment after a replica
failed) with back-off, until the client's timeout.

Reads return ``pyarrow.Table``\\ s with a ``partition`` and an ``offset``
column in front of the record columns (``key, value, timestamp, tags,
headers``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from robustmq._acks import DEFAULT_ACKS, acks_wire
from robustmq._consumer import Consumer
from robustmq._frame import decode_frames
from robustmq._metadata import Metadata, Route
from robustmq._partitioner import partition_for_key
from robustmq._producer import Producer
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import READ_SCHEMA, encode_batch, partition_column
from robustmq._retry import DEFAULT_RETRY, RetryPolicy
from robustmq._transport import NodeTransport
from robustmq.errors import IncarnationMismatch, InvalidRequest, RobustMQError, ShardNotFound, StaleEpoch
from robustmq.security._client_auth import Credentials, MetaSession
from robustmq.security._curve import ClientSecurity

__all__ = ["Client", "connect"]

# A batched list_offsets that failed with one of these is asked again partition by partition,
# each with a refreshed route.
_ASK_ONE_BY_ONE = (StaleEpoch, ShardNotFound, IncarnationMismatch)


def connect(
    address: str | Sequence[str] = "127.0.0.1:7070",
    *,
    timeout_s: float = 30.0,
    credentials: Credentials | None = None,
) -> Client:
    """A client for the cluster whose Meta Service listens at ``address`` (``host:port``).

    Several addresses (``"h1:7070,h2:7070"`` or a list) are the instances of a highly
    available Meta Service: calls go to its leader and follow it when it changes.

    ``timeout_s`` bounds every call's waiting, retries included: a Meta Service
    or storage node that is down (or restarting) is asked again until then. A
    malformed ``address`` raises ``InvalidConfig`` at once; nothing connects
    until the first call. ``credentials`` (a secured cluster, docs/security.md):
    the cluster CA and a password or client certificate, e.g.
    ``Credentials.from_env()``; the client logs in at its first call.
    """
    return Client(address, timeout_s=timeout_s, credentials=credentials)


class Client:
    """See the module docstring; close it (or use ``with``) to release sockets and threads."""

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        credentials: Credentials | None = None,
        session: MetaSession | None = None,
    ) -> None:
        from robustmq._meta_addresses import parse_meta_addresses
        from robustmq._meta_client import MetaClient

        self.address = ",".join(parse_meta_addresses(address))  # every Meta Service address given
        self.timeout_s = timeout_s
        self.retry = retry  # every node call of this client, its producers and consumers follows it
        # Every wait of this client is bounded by timeout_s: a Meta Service call
        # retries Unavailable (a restart, a failover) for that long, no shorter.
        self.meta = MetaClient(address, timeout_s=timeout_s, credentials=credentials, session=session)
        self.metadata = Metadata(self.meta)
        # Security on: requests to storage nodes go over CURVE with this process's key pair and
        # carry the session token the Meta Service bound to it (docs/security.md).
        self.security: ClientSecurity | None = None
        if self.meta.session is not None:
            from robustmq.security import KeyBook, meta_lookup
            from robustmq.security._client_auth import process_curve_keypair

            self.security = ClientSecurity(
                process_curve_keypair(), self.meta.session_token, KeyBook(meta_lookup(self.meta))
            )
        self.transport = NodeTransport(timeout_s=timeout_s, security=self.security)
        self.closed = False  # set by close(): calls in flight then end instead of retrying

    def close(self) -> None:
        self.closed = True
        self.transport.close()
        self.meta.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admin ------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        replication_factor: int = 1,
        engine: str = "segment",
        **settings: Any,
    ) -> pb.Topic:
        """Create a topic. Settings: min_insync_replicas (``acks="all"`` needs an ISR of at least
        this many; default a majority of ``replication_factor``), segment_bytes_max,
        roll_interval_ms, retention_bytes, retention_ms, retention_records, cleanup_policy,
        max_batch_bytes."""
        return self.meta.create_topic(
            name, partitions=partitions, replication_factor=replication_factor, engine=engine, **settings
        )

    def alter_topic(self, name: str, **settings: Any) -> pb.Topic:
        """Change settings of an existing topic, as ``robustmq topic alter`` (Kafka's
        ``kafka-configs --alter``); returns the topic as stored.

        Settings: retention_ms, retention_bytes, retention_records, local_retention_ms,
        local_retention_bytes, min_insync_replicas, segment_bytes_max, roll_interval_ms,
        max_batch_bytes, each checked as by :meth:`create_topic`. ``partitions``,
        ``replication_factor``, ``engine`` and ``cleanup_policy`` are fixed at creation
        (``InvalidConfig``). The storage nodes apply the new values without a restart,
        within a heartbeat or two; retention on its next pass (``--retention-check-ms``).
        """
        topic = self.meta.alter_topic(name, **settings)
        self.metadata.invalidate(name)
        return topic

    def list_topics(self) -> list[str]:
        return sorted(topic.name for topic in self.meta.list_topics())

    def describe_topic(self, name: str, *, tail: int = 0) -> pb.TopicDescription:
        """The topic and each shard's chain (with ``tail``, only each chain's last ``tail``
        segments)."""
        return self.meta.describe_topic(name, tail=tail)

    def delete_topic(self, name: str, *, incarnation: int | None = None) -> None:
        """Delete a topic; returns once no storage node can take writes of it any more.

        Raises ``DeletionPending`` (retriable) if a node that held it has not confirmed
        dropping it within the client's timeout: the deletion is recorded (the topic is
        gone for everyone) and completes in the background; calling again waits for it.
        ``incarnation`` (``create_topic(...).incarnation``, ``describe_topic``) names the
        topic meant: a call repeated after a lost answer then never deletes a topic
        another client created again under the name meanwhile (without it, the name's
        current incarnation is deleted).
        """
        try:
            self.meta.delete_topic(name, incarnation=incarnation)
        finally:
            self.metadata.invalidate(name)

    def list_nodes(self) -> list[pb.NodeInfo]:
        return list(self.meta.list_nodes())

    def remove_node(self, node_id: str, *, force: bool = False) -> pb.RemoveNodeResponse:
        """Remove a storage node's registration for good (``robustmq node remove``).

        Refused while the node is alive or leads active segments, unless
        ``force``; the answer lists the shards it still led (they have no leader
        until a node registers with that id again).
        """
        return self.meta.remove_node(node_id, force=force)

    def drain_node(self, node_id: str, *, undrain: bool = False) -> pb.NodeInfo:
        """Stop placing segments on a node and move the leadership of its active segments off it
        (``robustmq node drain``); ``undrain`` places on it again. Its replicas of sealed segments
        stay readable."""
        return self.meta.drain_node(node_id, undrain=undrain)

    # -- producers and consumers ---------------------------------------------------------

    def producer(self, **options: Any) -> Producer:
        """A batching, idempotent producer; see :class:`robustmq.Producer` for options."""
        return Producer(self, **options)

    def consumer(self, topic: str, **options: Any) -> Consumer:
        """A long-polling consumer; see :class:`robustmq.Consumer` for options."""
        return Consumer(self, topic, **options)

    # -- reads ------------------------------------------------------------------------

    def read(self, topic: str, partition: int = 0, offset: int = 0, max_records: int = 1000) -> pa.Table:
        """Up to ``max_records`` records from ``offset`` (fewer if the log ends first)."""
        tables = []
        position, end = offset, offset + max_records
        while position < end:
            records, following, high_watermark = self.fetch_records(
                topic, partition, position, end_offset=end
            )
            if following <= position:
                break
            position = following
            tables.append(records)
            if position >= high_watermark:
                break
        return _with_partition(pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table(), partition)

    def read_by_key(self, topic: str, key: bytes | str, *, partition: int | None = None) -> pa.Table:
        """The latest record with ``key`` (zero or one row), in the key's hash partition by default."""
        raw = key.encode() if isinstance(key, str) else key
        if partition is None:
            partition = partition_for_key(raw, self.metadata.partitions(topic))
        _response, frames = self._call(
            topic,
            partition,
            lambda route: pb.NodeRequest(
                read_by_key=pb.ReadByKeyRequest(shard=route.shard, key=raw, incarnation=_named(route))
            ),
        )
        return _with_partition(_ipc_table(frames), partition)

    def read_by_tag(
        self,
        topic: str,
        tag: str,
        *,
        partitions: Iterable[int] | None = None,
        start_offset: int = 0,
        max_records: int = 10_000,
    ) -> pa.Table:
        """Records carrying ``tag``, per partition in offset order, at most ``max_records`` each."""
        chosen = list(partitions) if partitions is not None else range(self.metadata.partitions(topic))
        tables = []
        for partition in chosen:
            _response, frames = self._call(
                topic,
                partition,
                lambda route: pb.NodeRequest(
                    read_by_tag=pb.ReadByTagRequest(
                        shard=route.shard,
                        tag=tag,
                        start_offset=start_offset,
                        max_records=max_records,
                        incarnation=_named(route),
                    )
                ),
            )
            tables.append(_with_partition(_ipc_table(frames), partition))
        return pa.concat_tables(tables) if tables else _with_partition(READ_SCHEMA.empty_table(), 0)

    def scan(
        self,
        topic: str,
        partition: int,
        *,
        start_offset: int = 0,
        end_offset: int | None = None,
        key: bytes | str | None = None,
        tags: Iterable[str] = (),
        min_timestamp_ms: int | None = None,
        max_timestamp_ms: int | None = None,
        max_records: int | None = None,
    ) -> pa.Table:
        """Records of ``[start_offset, end_offset)`` that match every filter, filtered on the node.

        The node uses its time, key and tag indexes to read as little as it can
        (see ``StorageAdapter.scan``); only matching records cross the network.
        ``end_offset`` defaults to the high watermark when the scan starts.
        """
        raw_key = key.encode() if isinstance(key, str) else key
        tag_list = list(tags)
        if end_offset is None:
            end_offset = self.list_offsets(topic)[partition][1]
        tables = []
        position, found = start_offset, 0
        while position < end_offset and (max_records is None or found < max_records):
            page = 10_000 if max_records is None else min(10_000, max_records - found)

            def scan_request(route: Route, at: int = position, limit: int = page) -> pb.NodeRequest:
                ask = pb.ScanRequest(
                    shard=route.shard,
                    start_offset=at,
                    end_offset=end_offset,
                    tags=tag_list,
                    max_records=limit,
                    incarnation=_named(route),
                )
                if raw_key is not None:
                    ask.key = raw_key
                if min_timestamp_ms is not None:
                    ask.min_timestamp_ms = min_timestamp_ms
                if max_timestamp_ms is not None:
                    ask.max_timestamp_ms = max_timestamp_ms
                return pb.NodeRequest(scan=ask)

            response, frames = self._call(topic, partition, scan_request, offset=position)
            table = _ipc_table(frames)
            tables.append(table)
            found += table.num_rows
            if response.read.next_offset <= position:
                break
            position = response.read.next_offset
        result = pa.concat_tables(tables) if tables else READ_SCHEMA.empty_table()
        return _with_partition(result, partition)

    def node_status(self) -> list[pb.StatusResponse]:
        """Every live node's status, including the records it served and scanned."""
        statuses = []
        for node in self.list_nodes():
            if node.alive:
                response, _ = self.transport.call(node.address, pb.NodeRequest(status=pb.StatusRequest()))
                statuses.append(response.status)
        return statuses

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """Offset of the first record with timestamp >= ``timestamp_ms``, or None."""
        response, _ = self._call(
            topic,
            partition,
            lambda route: pb.NodeRequest(
                offset_for_timestamp=pb.OffsetForTimestampRequest(
                    shard=route.shard, timestamp_ms=timestamp_ms, incarnation=_named(route)
                )
            ),
        )
        return int(response.offset.offset) if response.offset.found else None

    def list_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (earliest offset, high watermark)}`` for every partition."""
        return {partition: ends for (_, partition), ends in self.offsets_of([topic]).items()}

    def offsets_of(self, topics: Iterable[str]) -> dict[tuple[str, int], tuple[int, int]]:
        """``{(topic, partition): (earliest, high watermark)}``, one request per node (cheap to poll)."""
        by_address: dict[str, list[Route]] = {}
        for topic in topics:
            for partition in range(self.metadata.partitions(topic)):
                route = self.metadata.read_route(topic, partition)
                by_address.setdefault(route.address, []).append(route)
        result: dict[tuple[str, int], tuple[int, int]] = {}
        for address, routes in by_address.items():
            ask = pb.ListOffsetsRequest(
                shards=[r.shard for r in routes], incarnations=[r.incarnation for r in routes]
            )
            try:
                response, _ = self.transport.call(
                    address, pb.NodeRequest(list_offsets=ask), timeout_s=self.retry.attempt_s(self.timeout_s)
                )
                infos = list(response.list_offsets.shards)
            except RobustMQError as error:
                if not (
                    error.retriable or isinstance(error, StaleEpoch | ShardNotFound | IncarnationMismatch)
                ):
                    raise
                infos = []  # ask partition by partition, refreshing routes as needed
            if len(infos) != len(routes):
                infos = [self._offsets_one(r.topic, r.partition) for r in routes]
            for route, info in zip(routes, infos, strict=True):
                topic, partition = route.topic, route.partition
                result[(topic, partition)] = (int(info.log_start_offset), int(info.high_watermark))
        return result

    def _offsets_one(self, topic: str, partition: int) -> pb.ShardOffsetsInfo:
        response, _ = self._call(
            topic,
            partition,
            lambda route: pb.NodeRequest(
                list_offsets=pb.ListOffsetsRequest(shards=[route.shard], incarnations=[route.incarnation])
            ),
        )
        return response.list_offsets.shards[0]

    def fetch_records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_bytes: int = 16 << 20,
        incarnation: int | None = None,
    ) -> tuple[pa.Table, int, int]:
        """One fetch from ``offset``: ``(records, next offset, high watermark)``; no waiting.

        ``incarnation``: the topic incarnation the caller planned its offsets for
        (default: the one the cached metadata names); a node serving another one
        raises ``IncarnationMismatch`` instead of reading another log at these offsets.

        ``records`` has the read columns (offset first), at most up to ``end_offset``.
        The next offset is the node's (capped at ``end_offset``), which may be past
        ``offset + records.num_rows`` where the log has no records at some offsets.
        Raises ``OffsetOutOfRange`` (with ``earliest_offset``) below the log start.
        """

        def fetch_request(route: Route) -> pb.NodeRequest:
            limit = 0 if end_offset is None else max(end_offset - offset, 1)
            expected = route.incarnation if incarnation is None else incarnation
            return pb.NodeRequest(
                fetch=pb.FetchRequest(
                    shard=route.shard,
                    offset=offset,
                    max_bytes=max_bytes,
                    max_records=limit,
                    incarnation=expected if expected >= 0 else None,
                )
            )

        response, frames = self._call(
            topic, partition, fetch_request, offset=offset, follow_incarnation=False
        )
        fetch = response.fetch
        stop = fetch.next_offset if end_offset is None else min(fetch.next_offset, end_offset)
        records = decode_frames([f.buffer for f in frames], offset, stop)
        return records, max(stop, offset), int(fetch.high_watermark)

    def produce(
        self,
        topic: str,
        partition: int,
        records: pa.Table,
        *,
        producer_id: int = -1,
        sequence: int = -1,
        acks: str | int = DEFAULT_ACKS,
        token: bytes = b"",
    ) -> pb.ProduceResponse:
        """Append one table of records (record schema) to one partition, retrying retriable errors.

        With ``producer_id`` and ``sequence`` set, a repeat (after a retry or a
        replayed Spark batch) is acknowledged as a duplicate and stored once; without
        them, a retry after a ``RequestTimeout`` (the records may be stored) may store
        them twice.
        ``acks``: ``"all"`` (default), ``"quorum"`` or ``"1"`` (see :mod:`robustmq._acks`);
        ``NotEnoughReplicas`` is retried like ``Unavailable`` until the client's timeout.
        ``token``: with security on, the token ``InitProducerId`` answered for ``producer_id``
        (b"": the client's own session token).
        """
        payload = encode_batch(records)
        acks_value = acks_wire(acks)

        def produce_request(route: Route) -> pb.NodeRequest:
            return pb.NodeRequest(
                produce=pb.ProduceRequest(
                    shard=route.shard,
                    epoch=route.epoch,
                    acks=acks_value,
                    producer_id=producer_id,
                    producer_sequence=sequence,
                    incarnation=route.incarnation if route.incarnation >= 0 else None,
                ),
                token=token,
            )

        response, _ = self._call(topic, partition, produce_request, write=True, payloads=(payload,))
        return response.produce

    def seal(self, topic: str, partition: int) -> pb.SealResponse:
        """Seal the partition's active segment now; the next epoch opens at once."""
        response, _ = self._call(
            topic, partition, lambda route: pb.NodeRequest(seal=pb.SealRequest(shard=route.shard)), write=True
        )
        self.metadata.invalidate(topic, partition)
        return response.seal

    # -- consumer groups -----------------------------------------------------------------

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Store the next offset to read, per partition, for ``group``."""
        self.meta.commit_offsets(group, topic, {int(p): int(o) for p, o in offsets.items()})

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.meta.fetch_offsets(group, topic))

    def group_lag(self, group: str, topic: str = "") -> pb.GroupLagResponse:
        return self.meta.group_lag(group, topic)

    def list_groups(self, *, page_size: int = 1_000) -> list[str]:
        """Every consumer group with committed offsets, sorted (read from the Meta Service in pages)."""
        return self.meta.list_groups(page_size=page_size)

    def delete_group(self, group: str) -> int:
        """Remove every offset ``group`` committed; how many there were (0: it had none)."""
        return self.meta.delete_group(group)

    # -- node calls ------------------------------------------------------------------------

    def _call(
        self,
        topic: str,
        partition: int,
        build: Callable[[Route], pb.NodeRequest],
        *,
        offset: int | None = None,
        write: bool = False,
        payloads: tuple[Any, ...] = (),
        follow_incarnation: bool = True,
    ) -> tuple[pb.NodeResponse, list[Any]]:
        """Send ``build(route)`` for the partition, following :attr:`retry` until ``timeout_s``.

        ``write``: to the active segment's leader at its epoch; otherwise to the
        node :meth:`Metadata.read_route` picks for ``offset``. A read that failed
        on a node (down, cut off, too slow) goes to another replica next.
        ``follow_incarnation``: an ``IncarnationMismatch`` (the route's topic was deleted
        and created again) refreshes the route and tries again, once; a fetch, whose
        offsets belong to one incarnation, raises it instead.
        """
        if partition < 0:
            raise InvalidRequest(f"partition {partition} does not exist", topic=topic, partition=partition)
        deadline = time.monotonic() + self.timeout_s
        attempts = 0
        avoid: set[str] = set()
        refreshed_unknown = refreshed_incarnation = False
        floor = self.retry.floor_s(self.timeout_s)
        last: RobustMQError | None = None
        while True:
            route = (
                self.metadata.write_route(topic, partition)
                if write
                else self.metadata.read_route(topic, partition, offset, avoid=avoid)
            )
            if last is not None and deadline - time.monotonic() < floor:
                raise last  # the lookup took the time a retry needed (see robustmq/_retry.py)
            try:
                attempt_s = self.retry.attempt_s(deadline - time.monotonic())
                return self.transport.call(route.address, build(route), payloads, timeout_s=attempt_s)
            except ShardNotFound:
                if refreshed_unknown:  # still unknown after fresh metadata: it really is gone
                    raise
                refreshed_unknown = True
                self.metadata.invalidate(topic)  # the topic may be gone or re-created
                continue
            except IncarnationMismatch:
                if not follow_incarnation or refreshed_incarnation:
                    raise
                refreshed_incarnation = True
                self.metadata.invalidate(topic)  # created again: ask about the topic as it is now
                continue
            except RobustMQError as error:
                attempts += 1
                if self.closed:  # closed under this call (a server stopping): nothing will answer
                    raise
                if not self.retry.worth_another_attempt(error, deadline - time.monotonic(), self.timeout_s):
                    raise
                last = error
                if not write and self.retry.moves_to_another_replica(error):
                    avoid.add(route.address)
                    self.metadata.invalidate_nodes()
                self.metadata.invalidate(topic, partition)
                pause = self.retry.backoff_s(error, attempts)
                time.sleep(min(pause, max(0.0, deadline - time.monotonic() - floor)))


def _named(route: Route) -> int | None:
    """The incarnation a read names: its route's (None: not known, so not checked)."""
    return route.incarnation if route.incarnation >= 0 else None


def _ipc_table(frames: list[Any]) -> pa.Table:
    return pa.ipc.open_stream(frames[0].buffer).read_all() if frames else READ_SCHEMA.empty_table()


def _with_partition(table: pa.Table, partition: int) -> pa.Table:
    return table.add_column(0, pa.field("partition", pa.int32()), partition_column(partition, table.num_rows))
