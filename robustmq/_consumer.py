"""The consumer: long-polling fetches over a topic's partitions, with group offsets.

Each partition has at most one fetch in flight; all partitions are polled at
once and ``poll`` returns as soon as any of them has records (or its timeout
passes). Positions start from the group's committed offsets, ``earliest``,
``latest`` or explicit offsets; committed offsets are the *next* offset to
read, as in Kafka, so a restarted consumer continues where the last commit
left it. With ``auto_commit`` (the default when a group is given), positions
are committed every ``auto_commit_interval_s`` and on ``close``; as in
Kafka, an automatic commit made inside ``poll`` covers only the records
returned by earlier polls (calling ``poll`` again says you are done with
them), so a crash never commits records the application had not seen through.

Records removed by retention before they were read are data loss: by default
``poll`` raises ``OffsetOutOfRange``; ``on_data_loss="skip"`` jumps to the
earliest retained offset and logs how many records were skipped. A topic
deleted and created again under its name is another log: the consumer's
fetches name the incarnation it started on, so ``poll`` raises
``IncarnationMismatch`` rather than read the new topic at the old positions.

Where a fetch goes: offsets of the active segment to its leader (which
serves only what is below the high watermark), offsets of a sealed segment
to a live member of that segment's ``isr``, spread over them by the client's
reader id (see :mod:`robustmq._metadata`). One fetch waits at most its
``max_wait_ms`` plus the retry policy's margin; a node that dies or stops
answering fails it sooner (see :mod:`robustmq._transport`).

A partition whose fetches fail with a retriable error (its leader down or
unreachable, a seal or a failover under way) is asked again after the client
retry policy's back-off (:mod:`robustmq._retry`), with fresh metadata: the new
leader after a failover, another replica of a sealed segment after one
failed. Once they have failed for the client's ``timeout_s`` without a success
in between, ``poll`` raises the last error (``Unavailable``...), so a
consumer never waits silently for a leader that does not come back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from robustmq._frame import decode_frames
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import partition_column
from robustmq._transport import Throttling
from robustmq.errors import InvalidRequest, OffsetOutOfRange, RobustMQError

__all__ = ["Consumer", "Record", "first_offsets"]

log = logging.getLogger("robustmq.client")


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch
    tags: list[str] | None
    headers: list[tuple[str, bytes]] | None


class Consumer:
    """Reads a topic's records in offset order per partition; see the module docstring.

    Parameters
    ----------
    client
        The :class:`robustmq.Client` to read through.
    topic
        Topic to read.
    group
        Consumer group whose offsets to start from and commit to (optional).
    start
        Where to start partitions with no committed offset: ``"earliest"``,
        ``"latest"``, or a dict ``{partition: offset}``.
    partitions
        Only these partitions (default: all).
    max_wait_ms
        How long one fetch waits on the node for new records.

    Attributes
    ----------
    throttling
        Throttle times the nodes put on this consumer's fetch answers (its principal over
        its fetch quota; docs/client.md, "Throttling"): ``requests``, ``total_ms``, ``last_ms``.
    """

    def __init__(
        self,
        client: Any,
        topic: str,
        *,
        group: str | None = None,
        start: str | dict[int, int] = "earliest",
        partitions: list[int] | None = None,
        max_wait_ms: int = 500,
        max_bytes_per_fetch: int = 4 * 1024 * 1024,
        auto_commit: bool = True,
        auto_commit_interval_s: float = 5.0,
        on_data_loss: str = "fail",
    ) -> None:
        if on_data_loss not in ("fail", "skip"):
            raise InvalidRequest("on_data_loss must be 'fail' or 'skip'", on_data_loss=on_data_loss)
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise InvalidRequest("start must be 'earliest', 'latest' or {partition: offset}", start=start)
        self._client = client
        self.topic = topic
        self.group = group
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes_per_fetch
        self._auto_commit = auto_commit and group is not None
        self._auto_commit_interval_s = auto_commit_interval_s
        self._on_data_loss = on_data_loss
        client.metadata.invalidate(topic)  # the topic as it is now, not as a cache last saw it
        described = client.metadata.topic(topic)
        count = int(described.config.partitions)
        # Fetches name the incarnation the positions below are for: a topic deleted and created
        # again under the name is another log, refused (IncarnationMismatch), never read on.
        self._incarnation = int(described.incarnation) or None
        self.partitions = sorted(partitions) if partitions is not None else list(range(count))
        for partition in self.partitions:
            if not 0 <= partition < count:
                raise InvalidRequest(
                    f"topic {topic} has no partition {partition}", topic=topic, partition=partition
                )
        self._positions = self._starting_positions(start)
        self._committed = dict(self._positions)
        self._in_flight: dict[int, Future[Any]] = {}
        # partition -> (when its fetches began to fail, when to ask again, failed attempts)
        self._failing: dict[int, tuple[float, float, int]] = {}
        self.throttling = Throttling()
        # partition -> the nodes its fetches failed on since its last success (read elsewhere)
        self._avoid: dict[int, set[str]] = {}
        self._last_commit = time.monotonic()
        self._closed = False

    def _starting_positions(self, start: str | dict[int, int]) -> dict[int, int]:
        committed = self._client.group_offsets(self.group, self.topic) if self.group else {}
        offsets = self._client.list_offsets(self.topic)
        positions = {}
        for partition in self.partitions:
            if partition in committed:
                positions[partition] = committed[partition]
            elif isinstance(start, dict):
                positions[partition] = int(start.get(partition, offsets[partition][0]))
            elif start == "latest":
                positions[partition] = offsets[partition][1]
            else:
                positions[partition] = offsets[partition][0]
        return positions

    def positions(self) -> dict[int, int]:
        """The next offset to read, per partition."""
        return dict(self._positions)

    def seek(self, partition: int, offset: int) -> None:
        self._positions[partition] = offset
        self._in_flight.pop(partition, None)  # its answer would be for the old position

    def poll(self, timeout_s: float = 1.0, max_records: int = 10_000) -> pa.Table:
        """Records from any partition that has some (``partition`` + read columns), or an empty table."""
        deadline = time.monotonic() + timeout_s
        self._maybe_commit()  # what earlier polls returned, never what this one will
        while True:
            now = time.monotonic()
            for partition in self.partitions:
                failing = self._failing.get(partition)
                if partition not in self._in_flight and (failing is None or failing[1] <= now):
                    self._in_flight[partition] = self._fetch(partition, max_records)
            remaining = max(0.0, deadline - now)
            if not self._in_flight:  # every partition waits for its next try
                next_try = min(failing[1] for failing in self._failing.values())
                time.sleep(max(0.0, min(remaining, next_try - now)))
                if time.monotonic() >= deadline:
                    return _empty()
                continue
            finished, _ = wait(list(self._in_flight.values()), timeout=remaining, return_when=FIRST_COMPLETED)
            tables: list[pa.Table] = []
            try:
                for partition, future in list(self._in_flight.items()):
                    if future in finished:
                        del self._in_flight[partition]
                        table = self._take(partition, future)
                        if table is not None and table.num_rows:
                            tables.append(table)
            except BaseException:  # the records taken so far are not returned: read them again
                for table in tables:
                    self._positions[table.column("partition")[0].as_py()] = table.column("offset")[0].as_py()
                raise
            if tables:
                return pa.concat_tables(tables)
            if time.monotonic() >= deadline:
                return _empty()

    def __iter__(self) -> Iterator[Record]:
        while not self._closed:
            rows = self.poll().to_pylist()
            given = 0
            try:
                for row in rows:
                    record = self._record(row)
                    given += 1
                    yield record
            finally:  # the loop stopped early: the rows not given out are read again, not committed
                for partition, offset in first_offsets(rows[given:]).items():
                    self.seek(partition, offset)

    def _record(self, row: dict[str, Any]) -> Record:
        return Record(
            self.topic,
            row["partition"],
            row["offset"],
            row["key"],
            row["value"],
            int(row["timestamp"].timestamp() * 1000) if row["timestamp"] else 0,
            row["tags"],
            [(h["key"], h["value"]) for h in row["headers"]] if row["headers"] else None,
        )

    def _fetch(self, partition: int, max_records: int) -> Future[Any]:
        offset = self._positions[partition]
        route = self._client.metadata.read_route(
            self.topic, partition, offset, avoid=self._avoid.get(partition, ())
        )
        request = pb.NodeRequest(
            fetch=pb.FetchRequest(
                shard=route.shard,
                offset=offset,
                max_bytes=self._max_bytes,
                max_wait_ms=self._max_wait_ms,
                max_records=max_records,
                incarnation=self._incarnation,
            )
        )
        # The node answers a long poll after max_wait_ms at the latest; the retry policy's
        # margin past that bounds a node that has stopped answering.
        attempt_s = self._client.retry.attempt_s(self._client.timeout_s, wait_ms=self._max_wait_ms)
        future: Future[Any] = self._client.transport.request(route.address, request, timeout_s=attempt_s)
        future.requested_offset = offset  # type: ignore[attr-defined]
        future.address = route.address  # type: ignore[attr-defined]
        return future

    def _take(self, partition: int, future: Future[Any]) -> pa.Table | None:
        offset = future.requested_offset  # type: ignore[attr-defined]
        if offset != self._positions[partition]:
            return None  # seek() moved on
        try:
            response, frames = future.result()
        except OffsetOutOfRange as error:
            earliest = int(error.fields.get("earliest_offset", -1))
            if self._on_data_loss == "skip" and 0 <= offset < earliest:
                log.warning(
                    "%s partition %d: offsets %d-%d were removed by retention before they "
                    "were read; skipping them",
                    self.topic,
                    partition,
                    offset,
                    earliest - 1,
                )
                self._positions[partition] = earliest
                return None
            raise
        except RobustMQError as error:
            if self._client.retry.retriable(error):
                if self._client.retry.moves_to_another_replica(error):
                    self._avoid.setdefault(partition, set()).add(future.address)  # type: ignore[attr-defined]
                    self._client.metadata.invalidate_nodes()
                self._client.metadata.invalidate(self.topic, partition)
                self._failed(partition, error)
                return None
            raise
        self._failing.pop(partition, None)
        self._avoid.pop(partition, None)
        fetch = response.fetch
        if fetch.throttle_ms:  # the node held back for its quota; the transport waits as long
            self.throttling.record(fetch.throttle_ms)
        if fetch.next_offset <= offset:
            return None
        records = decode_frames([frame.buffer for frame in frames], offset, fetch.next_offset)
        # The node's next_offset, not offset + rows: offsets it skipped (a gap in
        # the log) are not read again.
        self._positions[partition] = fetch.next_offset
        return records.add_column(
            0, pa.field("partition", pa.int32()), partition_column(partition, records.num_rows)
        )

    def _failed(self, partition: int, error: RobustMQError) -> None:
        """Back off after a retriable failure; raise once failures have lasted ``timeout_s``."""
        now = time.monotonic()
        since, _, attempts = self._failing.get(partition, (now, now, 0))
        if now - since >= self._client.timeout_s:
            raise type(error)(
                f"{self.topic} partition {partition}: its fetches have failed for "
                f"{now - since:.0f} s ({error.message})",
                **{**error.fields, "topic": self.topic, "partition": partition},
            ) from error
        attempts += 1
        self._failing[partition] = (since, now + self._client.retry.backoff_s(error, attempts), attempts)

    def commit(self) -> None:
        """Commit the current positions of the group (no-op without a group)."""
        if self.group is None:
            return
        changed = {p: o for p, o in self._positions.items() if self._committed.get(p) != o}
        if changed:
            self._client.commit_offsets(self.group, self.topic, changed)
            self._committed.update(changed)
        self._last_commit = time.monotonic()

    def _maybe_commit(self) -> None:
        if self._auto_commit and time.monotonic() - self._last_commit >= self._auto_commit_interval_s:
            self.commit()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._auto_commit:
            self.commit()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_offsets(rows: list[dict[str, Any]]) -> dict[int, int]:
    """The first offset per partition among ``rows`` (rows of a poll, in their order)."""
    first: dict[int, int] = {}
    for row in rows:
        first.setdefault(row["partition"], row["offset"])
    return first


def _empty() -> pa.Table:
    from robustmq._records import READ_SCHEMA

    table = READ_SCHEMA.empty_table()
    return table.add_column(0, pa.field("partition", pa.int32()), pa.array([], pa.int32()))
