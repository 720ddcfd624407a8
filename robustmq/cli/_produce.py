"""``robustmq produce``: lines from stdin or a file, sent as they come.

The main thread does everything. It waits for input with ``select`` and reads
what is there (at most 1 MiB at a time), so no thread is ever blocked in a
read of stdin: nothing races the interpreter's shutdown, whatever stdin is (a
terminal, a pipe that stays open, a file). Complete lines become records; a
table is sent when it holds 10,000 records or 2 MiB, or when its first line
has waited ``--linger-ms`` (200 ms by default), so ``tail -f log | robustmq
produce t`` delivers lines within a fraction of a second while a fast file
still goes in large batches. At most 16 tables are unacknowledged at a time.

Lines: in text format each line (without its ``\\n`` or ``\\r\\n``) is one
record's value; an empty line is a record with an empty value, as in Kafka's
console producer. With ``--key-separator`` every line must be
``KEY<sep>VALUE``: a line without the separator is refused. In JSON format
each line is an object; blank lines are skipped and counted in the summary.
A line longer than the topic's ``max_batch_bytes`` is refused before it is
read to its end (memory stays bounded). A refused line stops the command
(exit 2, naming the line); the lines before it are sent first.

Signals: SIGINT (Ctrl-C), SIGTERM (``timeout``, systemd, ``docker stop``)
and SIGHUP (a closed terminal or ssh session) all stop reading, send the
lines read so far, wait for their acknowledgement (at most ``--timeout-s``,
30 s by default; a second signal stops the wait), print one line with the
count and exit with 128 + the signal's number. A handler raises only while
the main thread waits (for input or for acknowledgements), never while it
hands a table to the producer, so a signal cannot leave the producer half
updated; a signal at another moment is acted on at the next wait, a few
milliseconds later.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from types import FrameType
from typing import IO, Any

import pyarrow as pa

from robustmq._client import Client, connect
from robustmq._records import COMPACT_POLICY, HEADERS_TYPE, TAGS_TYPE, TIMESTAMP_TYPE, coerce_records, now_ms
from robustmq._request_limits import FRAMING_BYTES
from robustmq._transport import MAX_MESSAGE_BYTES
from robustmq.cli._progress import Progress
from robustmq.cli._security import credentials_of
from robustmq.cli._wait_notice import WaitNotice
from robustmq.errors import InvalidRequest, KeyRequired, RecordBatchTooLarge, RobustMQError

__all__ = ["SEPARATOR_NAMES", "cmd_produce", "plural", "too_long"]

ROWS_PER_TABLE = 10_000
BYTES_PER_TABLE = 2 * 1024 * 1024
MAX_IN_FLIGHT_TABLES = 16  # with BYTES_PER_TABLE: well inside the producer's 64 MiB buffer
READ_BYTES = 1024 * 1024
INTERRUPT_FLUSH_S = 30.0
_NOTICE_STEP_S = 0.25  # how often a long wait for acknowledgements looks at why it waits
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Names for separators a shell makes awkward to type (``--key-separator TAB``).
SEPARATOR_NAMES = {"TAB": "\t", "\\T": "\t", "SPACE": " ", "COMMA": ",", "SEMICOLON": ";", "PIPE": "|"}


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


class _Stopped(BaseException):
    """A stop signal, raised at a wait (like KeyboardInterrupt: no ``except Exception`` takes it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """SIGINT, SIGTERM and SIGHUP as :class:`_Stopped`, raised only inside :meth:`waiting`."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._raise = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self._raise:
            self._raise = False
            raise _Stopped(signum)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait a signal may interrupt; one that came earlier is raised at once."""
        if self.received is not None:
            raise _Stopped(self.received)
        self._raise = True
        try:
            yield
        finally:
            self._raise = False


class _LineSource:
    """Complete lines from a file descriptor, read on the calling thread when ``select`` says so.

    ``partial`` holds the bytes of a line whose end has not arrived; at end of
    input it is the last line. A line longer than ``max_line_bytes`` raises
    :class:`RecordBatchTooLarge` (see :func:`too_long`) before more of it is read.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self._fd = fd
        self._limit = limit
        self.partial = b""
        self.lines_read = 0
        self.bytes_read = 0
        self.ended = False

    def wait(self, timeout_s: float | None) -> bool:
        """Whether input (or its end) is there to read, after waiting up to ``timeout_s``."""
        readable, _, _ = select.select([self._fd], [], [], timeout_s)
        return bool(readable)

    def read(self) -> list[bytes]:
        """One read: the lines it completed (a last line without ``\\n`` at end of input)."""
        chunk = os.read(self._fd, READ_BYTES)
        self.bytes_read += len(chunk)
        if not chunk:
            self.ended = True
            lines = [self.partial] if self.partial else []
            self.partial = b""
        else:
            *lines, self.partial = (self.partial + chunk).split(b"\n")
        self.lines_read += len(lines)
        return lines

    def check(self) -> None:
        """Refuse the unfinished line once it is longer than a record may be (memory stays bounded)."""
        if len(self.partial) > self._limit - FRAMING_BYTES:
            raise too_long(self.lines_read + 1, len(self.partial), self._limit)


def too_long(number: int, size: int, limit: int) -> RecordBatchTooLarge:
    """Line ``number`` cannot be one record: with the batch's framing it would pass ``limit``,
    the smaller of the topic's ``max_batch_bytes`` and the storage node's message limit."""
    if limit < MAX_MESSAGE_BYTES:
        name, what = "max_batch_bytes", f"the topic's max_batch_bytes is {limit:,} bytes"
    else:
        name, what = "max_message_bytes", f"the storage node's message limit is {limit:,} bytes"
    return RecordBatchTooLarge(
        f"line {number} is {size:,} bytes or more, too large for one record: {what} "
        f"(with {FRAMING_BYTES:,} bytes kept for the batch's framing)",
        line=number,
        size=size,
        limit=name,
        max=limit,
    )


class _Batcher:
    """Turns lines into record rows and cuts them into tables (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, partitions: int, limit: int) -> None:
        self._args = args
        self._partitions = partitions
        self._limit = limit
        self._separator = None if args.key_separator is None else args.key_separator.encode()
        self._rows: list[dict[str, Any]] = []
        self._bytes = 0
        self.first_at = 0.0  # when the oldest row in hand was read (monotonic)
        self.number = 0  # lines seen
        self.skipped = 0  # blank JSON lines
        self._partitioned: bool | None = None  # whether JSON lines name their partition

    def add(self, line: bytes) -> None:
        self.number += 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > self._limit - FRAMING_BYTES:
            raise too_long(self.number, len(line), self._limit)
        if self._args.format == "json" and not line.strip():
            self.skipped += 1
            return
        row = self._parse(line)
        partitioned = row.get("partition") is not None
        if self._partitioned is None:
            self._partitioned = partitioned
        elif partitioned != self._partitioned:
            raise InvalidRequest(
                f"line {self.number}: either every JSON line has a partition or none does",
                line=self.number,
            )
        if not self._rows:
            self.first_at = time.monotonic()
        self._rows.append(row)
        self._bytes += len(line)

    @property
    def full(self) -> bool:
        return len(self._rows) >= ROWS_PER_TABLE or self._bytes >= BYTES_PER_TABLE

    @property
    def pending(self) -> int:
        return len(self._rows)

    def take(self) -> pa.Table:
        rows, self._rows, self._bytes = self._rows, [], 0
        return _table(rows)

    def _parse(self, line: bytes) -> dict[str, Any]:
        tags = self._args.tag or None
        if self._args.format == "text":
            if self._separator is None:
                return {"value": line, "tags": tags}
            key, found, value = line.partition(self._separator)
            if not found:
                raise InvalidRequest(
                    f"line {self.number}: no key separator {self._args.key_separator!r} "
                    f"(with --key-separator every line is KEY<separator>VALUE)",
                    line=self.number,
                )
            return {"key": key, "value": value, "tags": tags}
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InvalidRequest(f"line {self.number}: not JSON ({exc})", line=self.number) from None
        if not isinstance(obj, dict) or "value" not in obj:
            raise InvalidRequest(
                f'line {self.number}: expected an object with a "value" (and optional key, tags, '
                f"headers, timestamp, partition)",
                line=self.number,
            )
        try:
            return _json_record(obj, tags, self._partitions)
        except ValueError as exc:
            raise InvalidRequest(f"line {self.number}: {exc}", line=self.number) from None


def _json_record(obj: dict[str, Any], tags: list[str] | None, partitions: int) -> dict[str, Any]:
    value, key, headers = obj["value"], obj.get("key"), obj.get("headers")
    timestamp, partition = obj.get("timestamp"), obj.get("partition")
    if key is not None and not isinstance(key, str):
        raise ValueError('"key" must be a string')
    if headers is not None and not isinstance(headers, dict):
        raise ValueError('"headers" must be an object of strings')
    line_tags = obj.get("tags")
    if line_tags is not None and (
        not isinstance(line_tags, list) or not all(isinstance(tag, str) for tag in line_tags)
    ):
        raise ValueError('"tags" must be a list of strings')
    for name, number in (("timestamp", timestamp), ("partition", partition)):
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise ValueError(f'"{name}" must be an integer')
    if timestamp is not None and not -(1 << 63) <= timestamp < 1 << 63:
        raise ValueError(f'"timestamp" must fit in 64 bits (milliseconds since the epoch), got {timestamp}')
    if partition is not None and not 0 <= partition < partitions:
        raise ValueError(
            f"partition {partition} does not exist: the topic has {plural(partitions, 'partition')}"
        )
    if isinstance(value, str):
        encoded: bytes | None = value.encode()
    else:
        encoded = None if value is None else json.dumps(value).encode()
    return {
        "value": encoded,
        "key": None if key is None else key.encode(),
        "tags": line_tags or tags,
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


# -- the command ----------------------------------------------------------------------------


def _open(args: argparse.Namespace) -> tuple[IO[bytes] | None, int, int | None]:
    """``(file to close or None, fd to read, total bytes if known)``."""
    if not args.file or args.file == "-":
        return None, sys.stdin.fileno(), None
    try:
        source = open(args.file, "rb")  # noqa: SIM115 (closed by cmd_produce)
    except OSError as error:
        raise InvalidRequest(f"cannot read {args.file}: {error.strerror}", file=args.file) from None
    return source, source.fileno(), os.fstat(source.fileno()).st_size or None


def cmd_produce(args: argparse.Namespace) -> int:
    signals = _Signals()
    signals.install()
    opened, fd, total = _open(args)
    try:
        credentials = credentials_of(args)
        with connect(args.meta_address, timeout_s=args.timeout_s, credentials=credentials) as client:
            with signals.waiting():  # nothing read yet: a signal may stop the set-up at once
                topic = client.metadata.topic(args.topic)  # an unknown topic fails before any read
            _check_keys_given(args, topic.config.cleanup_policy)
            notice = WaitNotice(args.meta_address, args.topic, args.acks, credentials)
            try:
                return _Run(client, args, signals, topic, fd, total, notice).run()
            finally:
                notice.close()
    except _Stopped as stopped:  # during the set-up, before any line was read
        _say(f"robustmq produce: interrupted ({signal.Signals(stopped.signum).name}); produced 0 records")
        return 128 + stopped.signum
    finally:
        signals.restore()
        if opened is not None:
            opened.close()


def _check_keys_given(args: argparse.Namespace, cleanup_policy: str) -> None:
    """A ``cleanup=compact`` topic needs a key per record: text lines get one only from
    ``--key-separator`` (JSON lines name theirs, and the producer checks each)."""
    if cleanup_policy == COMPACT_POLICY and args.format == "text" and args.key_separator is None:
        raise KeyRequired(
            f"topic {args.topic} is a cleanup=compact topic: every record needs a key. Give one per "
            "line with --key-separator (e.g. --key-separator TAB for 'key<TAB>value' lines) or use "
            '--format json with a "key" field; nothing was produced',
            topic=args.topic,
        )


class _Run:
    """One ``produce`` from set-up to summary; see the module docstring."""

    def __init__(
        self,
        client: Client,
        args: argparse.Namespace,
        signals: _Signals,
        topic: Any,
        fd: int,
        total: int | None,
        notice: WaitNotice,
    ) -> None:
        self.args = args
        self.notice = notice  # on a terminal: why acknowledgements take long
        self.signals = signals
        self.topic = args.topic
        self.producer = client.producer(
            acks=args.acks,
            delivery_timeout_s=args.timeout_s,  # one attempt: the client's retry policy, at most this
            max_block_s=args.timeout_s,
        )
        limit = min(int(topic.config.max_batch_bytes), MAX_MESSAGE_BYTES)  # what a batch may be
        self.source = _LineSource(fd, limit)
        self.batcher = _Batcher(args, int(topic.config.partitions), limit)
        self.linger_s = args.linger_ms / 1000
        # With a file the bar follows bytes read (the total is known); from stdin, records sent.
        self.total = total
        self.progress = Progress(f"produce {args.topic}", total, unit="bytes" if total else "records")
        self.sent: list[tuple[Future[Any], int]] = []  # unsettled tables, oldest first
        self.acknowledged = 0

    def run(self) -> int:
        try:
            try:
                self._read_all()
            except _Stopped as stopped:
                return self._interrupted(stopped.signum)
            except InvalidRequest as error:  # a refused line: the lines before it still go out
                self._ship()
                self._settle_all()
                raise _with_count(error, self.acknowledged) from None
            self._ship()
            self._settle_all()
        finally:
            if not self.sent:  # else what is left was reported: do not wait for it again
                self.producer.close(timeout_s=0.1)
        with suppress(OSError):
            self.progress.done()
        skipped = f" (skipped {plural(self.batcher.skipped, 'blank line')})" if self.batcher.skipped else ""
        print(f"produced {plural(self.acknowledged, 'record')} to {self.topic}{skipped}")
        return 0

    def _read_all(self) -> None:
        batcher, source = self.batcher, self.source
        while not source.ended:
            timeout = None
            if batcher.pending:
                timeout = max(0.0, batcher.first_at + self.linger_s - time.monotonic())
            with self.signals.waiting():
                readable = source.wait(timeout)
            if readable:
                for line in source.read():
                    batcher.add(line)
                    if batcher.full:
                        self._ship()
                source.check()
                if self.total:
                    self.progress.update(source.bytes_read)
            if batcher.pending and time.monotonic() >= batcher.first_at + self.linger_s:
                self._ship()

    def _ship(self) -> None:
        """Send the rows in hand as one table; keep at most MAX_IN_FLIGHT_TABLES unacknowledged."""
        if not self.batcher.pending:
            return
        while len(self.sent) >= MAX_IN_FLIGHT_TABLES:
            self._settle_oldest(None)
        table = self.batcher.take()
        self.sent.append((self.producer.send_batch(self.topic, table), table.num_rows))
        if not self.total:
            self.progress.advance(table.num_rows)

    def _settle_oldest(self, timeout_s: float | None) -> None:
        future, count = self.sent[0]
        try:
            self._wait_for(future, timeout_s)
        except BaseException:
            if future.done():  # it failed, or a signal came just after it succeeded
                self.sent.pop(0)
                if not future.cancelled() and future.exception() is None:
                    self.acknowledged += count
            raise
        self.sent.pop(0)
        self.acknowledged += count

    def _wait_for(self, future: Future[Any], timeout_s: float | None) -> None:
        """``future.result(timeout_s)``, telling a terminal why a long wait waits (``WaitNotice``)."""
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        try:
            while True:
                left = _NOTICE_STEP_S if deadline is None else deadline - time.monotonic()
                step = min(_NOTICE_STEP_S, left)
                try:
                    with self.signals.waiting():
                        future.result(max(0.0, step))
                    return
                except TimeoutError:
                    if future.done() or (deadline is not None and time.monotonic() >= deadline):
                        raise  # the answer itself is an error, or the caller's bound has passed
                self.notice.waiting(time.monotonic() - started)
        finally:
            self.notice.done()

    def _settle_all(self) -> None:
        while self.sent:
            self._settle_oldest(None)  # each resolves within the producer's delivery timeout

    def _interrupted(self, signum: int) -> int:
        """After a stop signal: send the lines read so far, wait (bounded) for them, say so."""
        name = signal.Signals(signum).name
        self.signals.received = None  # a second signal stops the wait below
        bound_s = min(INTERRUPT_FLUSH_S, self.args.timeout_s)
        deadline = time.monotonic() + bound_s
        unconfirmed = ""
        try:
            self._ship()
            while self.sent:
                self._settle_oldest(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, RobustMQError, _Stopped) as why:
            waiting = sum(count for _, count in self.sent) + self.batcher.pending
            reason = "stopped waiting" if isinstance(why, _Stopped) else f"not within {bound_s:g} s"
            if isinstance(why, RobustMQError):
                reason = f"failed: {why.message}"
            unconfirmed = f"; {plural(waiting, 'record')} not acknowledged ({reason})"
        unfinished = ""
        if self.source.partial:
            unfinished = (
                f"; an unfinished last line ({len(self.source.partial):,} bytes, no newline) was not sent"
            )
        _say(
            f"robustmq produce: interrupted ({name}); produced {plural(self.acknowledged, 'record')} "
            f"to {self.topic}{unconfirmed}{unfinished}"
        )
        return 128 + signum


def _with_count(error: InvalidRequest, acknowledged: int) -> InvalidRequest:
    """The same error, saying what was produced before it."""
    return type(error)(
        f"{error.message} ({plural(acknowledged, 'record')} before it produced)", **error.fields
    )


def _say(line: str) -> None:
    """One line on stderr; after SIGHUP the terminal may be gone, which is no reason to fail."""
    with suppress(OSError):
        print(line, file=sys.stderr, flush=True)
