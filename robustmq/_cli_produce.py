"""``robustmq produce``: lines from stdin or a file, sent as they come.

A daemon thread reads lines into a bounded queue (:class:`_LineReader`); the
main thread parses them into record tables and sends a table when it holds
10,000 records or when its first line has waited ``--linger-ms`` (200 ms by
default), so ``tail -f log | robustmq produce t`` delivers lines within a
fraction of a second while a fast file still goes in large batches.

Ctrl-C sends what was read so far, waits (bounded) for it to be acknowledged,
prints one line with the count and exits 130. A line that does not parse
fails the command (exit 2, naming the line); the lines before it are sent.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import IO, Any

import pyarrow as pa

from robustmq._client import connect
from robustmq._progress import Progress
from robustmq._records import HEADERS_TYPE, TAGS_TYPE, TIMESTAMP_TYPE, coerce_records, now_ms
from robustmq.errors import InvalidRequest, RequestTimeout

__all__ = ["cmd_produce"]

ROWS_PER_TABLE = 10_000
MAX_IN_FLIGHT_TABLES = 16
QUEUED_LINES = 2 * ROWS_PER_TABLE  # the reader blocks past this: memory stays bounded
INTERRUPT_FLUSH_S = 30.0
_END = object()


class _LineReader:
    """Reads ``source`` line by line on a daemon thread into a bounded queue.

    The thread ends at end of input or on a read error (handed to the consumer
    of the queue); at exit a daemon thread blocked in a read does not hold the
    process.
    """

    def __init__(self, source: IO[bytes]) -> None:
        self.lines: queue.Queue[Any] = queue.Queue(maxsize=QUEUED_LINES)
        self._source = source
        threading.Thread(target=self._run, name="produce-reader", daemon=True).start()

    def _run(self) -> None:
        try:
            for line in self._source:
                self.lines.put(line)
            self.lines.put(_END)
        except BaseException as error:  # handed to the main thread, which reports it
            self.lines.put(error)


class _Batcher:
    """Turns lines into record tables; see the module docstring for when a table is cut."""

    def __init__(self, reader: _LineReader, args: argparse.Namespace) -> None:
        self._reader = reader
        self._args = args
        self._linger_s = args.linger_ms / 1000
        self._rows: list[dict[str, Any]] = []
        self._first_at = 0.0
        self._size = 0
        self._number = 0
        self._partitioned: bool | None = None  # whether JSON lines name their partition
        self.ended = False

    def tables(self) -> Iterator[tuple[pa.Table, int]]:
        """``(table, bytes read for it)`` as tables fill up or linger out, until end of input."""
        while not self.ended:
            timeout = None if not self._rows else max(0.0, self._first_at + self._linger_s - time.monotonic())
            try:
                item = self._reader.lines.get(timeout=timeout)
            except queue.Empty:
                yield self.take()
                continue
            self._add(item)
            if len(self._rows) >= ROWS_PER_TABLE:
                yield self.take()
        if self._rows:
            yield self.take()

    def drain(self) -> None:
        """Parse every line already read, without waiting for more (after Ctrl-C)."""
        while not self.ended:
            try:
                item = self._reader.lines.get_nowait()
            except queue.Empty:
                return
            self._add(item)

    def _add(self, item: Any) -> None:
        if item is _END:
            self.ended = True
            return
        if isinstance(item, BaseException):
            raise item
        self._number += 1
        self._size += len(item)
        line = item.rstrip(b"\r\n")
        if not line:
            return
        row = _parse_line(line, self._args, self._number)
        partitioned = row.get("partition") is not None
        if self._partitioned is None:
            self._partitioned = partitioned
        elif partitioned != self._partitioned:
            raise InvalidRequest(
                f"line {self._number}: either every JSON line has a partition or none does",
                line=self._number,
            )
        if not self._rows:
            self._first_at = time.monotonic()
        self._rows.append(row)

    def take(self) -> tuple[pa.Table, int]:
        rows, size = self._rows, self._size
        self._rows, self._size = [], 0
        return _table(rows), size

    @property
    def pending(self) -> int:
        return len(self._rows)


def _open(args: argparse.Namespace) -> tuple[IO[bytes], int | None]:
    if not args.file or args.file == "-":
        return sys.stdin.buffer, None
    try:
        source = open(args.file, "rb")  # noqa: SIM115 (closed by cmd_produce)
    except OSError as error:
        raise InvalidRequest(f"cannot read {args.file}: {error.strerror}", file=args.file) from None
    total = source.seek(0, 2)
    source.seek(0)
    return source, total


def cmd_produce(args: argparse.Namespace) -> int:
    source, total = _open(args)
    # With a file the bar follows bytes read (the total is known); from stdin, records sent.
    progress = Progress(f"produce {args.topic}", total, unit="bytes" if total else "records")
    sent: list[tuple[Future[Any], int]] = []
    acknowledged = 0
    try:
        with connect(args.meta_address, timeout_s=args.timeout_s) as client:
            client.metadata.partitions(args.topic)  # an unknown topic fails before reading anything
            with client.producer(acks=args.acks) as producer:
                batcher = _Batcher(_LineReader(source), args)
                try:
                    for table, size in batcher.tables():
                        sent.append((producer.send_batch(args.topic, table), table.num_rows))
                        progress.advance(size if total else table.num_rows)
                        while len(sent) > MAX_IN_FLIGHT_TABLES:
                            acknowledged += _settle(sent.pop(0), None)
                except KeyboardInterrupt:
                    return _interrupted(args, producer, batcher, sent, acknowledged)
                except InvalidRequest:
                    if batcher.pending:  # the lines before the bad one still go out
                        sent.append((producer.send_batch(args.topic, batcher.take()[0]), 0))
                    raise
                for future, count in sent:
                    acknowledged += _settle((future, count), None)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    progress.done()
    print(f"produced {acknowledged:,} records to {args.topic}")
    return 0


def _settle(entry: tuple[Future[Any], int], timeout_s: float | None) -> int:
    future, count = entry
    future.result(timeout_s)
    return count


def _interrupted(
    args: argparse.Namespace,
    producer: Any,
    batcher: _Batcher,
    sent: list[tuple[Future[Any], int]],
    acknowledged: int,
) -> int:
    """After Ctrl-C: send the lines read so far, wait for the acknowledgements (bounded), say so."""
    batcher.drain()
    if batcher.pending:
        table = batcher.take()[0]
        sent.append((producer.send_batch(args.topic, table), table.num_rows))
    deadline = time.monotonic() + INTERRUPT_FLUSH_S
    try:
        for entry in sent:
            acknowledged += _settle(entry, max(0.1, deadline - time.monotonic()))
    except TimeoutError:
        raise RequestTimeout(
            f"interrupted; {acknowledged:,} records acknowledged, the rest not within "
            f"{INTERRUPT_FLUSH_S:.0f} s",
            topic=args.topic,
        ) from None
    print(
        f"robustmq produce: interrupted; produced {acknowledged:,} records to {args.topic}", file=sys.stderr
    )
    return 130


def _parse_line(line: bytes, args: argparse.Namespace, number: int) -> dict[str, Any]:
    if args.format == "text":
        if args.key_separator and args.key_separator.encode() in line:
            key, value = line.split(args.key_separator.encode(), 1)
            return {"key": key, "value": value, "tags": args.tag or None}
        return {"value": line, "tags": args.tag or None}
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise InvalidRequest(f"line {number}: not JSON ({exc})", line=number) from None
    if not isinstance(obj, dict) or "value" not in obj:
        raise InvalidRequest(
            f'line {number}: expected an object with a "value" (and optional key, tags, '
            f"headers, timestamp, partition)",
            line=number,
        )
    try:
        return _json_record(obj, args)
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequest(f"line {number}: {exc}", line=number) from None


def _json_record(obj: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    value = obj["value"]
    key = obj.get("key")
    headers = obj.get("headers")
    timestamp, partition = obj.get("timestamp"), obj.get("partition")
    if key is not None and not isinstance(key, str):
        raise ValueError('"key" must be a string')
    if headers is not None and not isinstance(headers, dict):
        raise ValueError('"headers" must be an object of strings')
    for name, number in (("timestamp", timestamp), ("partition", partition)):
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise ValueError(f'"{name}" must be an integer')
    return {
        "value": value.encode()
        if isinstance(value, str)
        else None
        if value is None
        else json.dumps(value).encode(),
        "key": None if key is None else key.encode(),
        "tags": obj.get("tags") or args.tag or None,
        "headers": [(k, str(v).encode()) for k, v in headers.items()] if headers else None,
        "timestamp": timestamp,
        "partition": partition,
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    stamps = [now_ms() if row.get("timestamp") is None else int(row["timestamp"]) for row in rows]
    try:
        table = coerce_records(
            pa.table(
                {
                    "key": pa.array([row.get("key") for row in rows], pa.binary()),
                    "value": pa.array([row.get("value") for row in rows], pa.binary()),
                    "timestamp": pa.array(stamps, pa.int64()).cast(TIMESTAMP_TYPE),
                    "tags": pa.array([row.get("tags") for row in rows], TAGS_TYPE),
                    "headers": pa.array(
                        [
                            None
                            if row.get("headers") is None
                            else [{"key": k, "value": v} for k, v in row["headers"]]
                            for row in rows
                        ],
                        HEADERS_TYPE,
                    ),
                }
            )
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise InvalidRequest(f"a line has a field of the wrong type: {exc}") from None
    if rows and rows[0].get("partition") is not None:  # then every row has one (_Batcher checks)
        table = table.append_column("partition", pa.array([row["partition"] for row in rows], pa.int32()))
    return table
