"""The consumer's position bookkeeping, through its client seam.

The consumer takes the client it reads through; here that client answers
fetches the way a node does for a log whose offsets are not all present (a
compacted log, or a range some engine skipped): the frames cover fewer records
than ``[offset, next_offset)``. Real-node behaviour is covered in
``tests/e2e/test_cli.py`` and ``tests/storage_node``.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from robustmq._consumer import Consumer
from robustmq._frame import encode_header
from robustmq._metadata import Route
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq._retry import DEFAULT_RETRY
from robustmq.errors import Unavailable


class _Frame:
    def __init__(self, buffer: bytes) -> None:
        self.buffer = buffer


def _frame(base_offset: int, values: list[bytes]) -> _Frame:
    payload = encode_batch(build_records(values, timestamps_ms=[1_700_000_000_000] * len(values)))
    header = encode_header(
        base_offset=base_offset,
        record_count=len(values),
        epoch=0,
        first_timestamp_ms=1_700_000_000_000,
        max_timestamp_ms=1_700_000_000_000,
        producer_id=-1,
        producer_sequence=-1,
        payload=payload,
    )
    return _Frame(header + payload.to_pybytes())


class _GappedLog:
    """One partition holding offsets 0-1 and 5-6; a fetch from 0 answers both frames, next_offset 7."""

    def __init__(self) -> None:
        self.fetched_from: list[int] = []
        self.metadata = self
        self.transport = self
        self.commits: list[dict[int, int]] = []
        self.timeout_s = 30.0
        self.retry = DEFAULT_RETRY

    # the parts of Client and Metadata the consumer uses
    def topic(self, name: str) -> pb.Topic:
        return pb.Topic(name=name, config=pb.TopicConfig(partitions=1), incarnation=3)

    def read_route(self, topic: str, partition: int, offset: int | None = None, **_: Any) -> Route:
        return Route(topic, partition, f"{topic}_{partition}", "tcp://127.0.0.1:1", 0)

    def invalidate(self, topic: str, partition: int | None = None) -> None:
        pass

    def list_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        return {0: (0, 7)}

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return {}

    def commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.commits.append(dict(offsets))

    def request(self, address: str, message: pb.NodeRequest, *args: Any, **kwargs: Any) -> Future[Any]:
        offset = message.fetch.offset
        self.fetched_from.append(offset)
        answer: Future[Any] = Future()
        frames = [_frame(0, [b"a", b"b"]), _frame(5, [b"f", b"g"])] if offset < 7 else []
        response = pb.NodeResponse(fetch=pb.FetchResponse(next_offset=7, high_watermark=7))
        answer.set_result((response, frames))
        return answer


def test_the_position_follows_the_fetch_next_offset_not_the_row_count() -> None:
    log = _GappedLog()
    consumer = Consumer(log, "t", group="g", auto_commit=False)
    table = consumer.poll(timeout_s=1.0)
    assert table.column("offset").to_pylist() == [0, 1, 5, 6]
    assert table.column("value").to_pylist() == [b"a", b"b", b"f", b"g"]
    # Row count would say 4; the node said the next record to read is at 7.
    assert consumer.positions() == {0: 7}
    assert consumer.poll(timeout_s=0.2).num_rows == 0  # nothing read twice
    consumer.commit()
    assert log.commits == [{0: 7}]


class _DeadReplica(_GappedLog):
    """Offset 0 is in a sealed segment held by two replicas; the one at ``dead`` is unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = "tcp://replica-a"
        self.asked: list[tuple[str, frozenset[str], float]] = []  # (address, avoided, timeout)
        self.nodes_forgotten = 0

    def read_route(self, topic: str, partition: int, offset: int | None = None, **kwargs: Any) -> Route:
        avoid = frozenset(kwargs.get("avoid", ()))
        address = self.dead if self.dead not in avoid else "tcp://replica-b"
        return Route(topic, partition, f"{topic}_{partition}", address, 0)

    def invalidate_nodes(self) -> None:
        self.nodes_forgotten += 1

    def request(self, address: str, message: pb.NodeRequest, *args: Any, **kwargs: Any) -> Future[Any]:
        self.asked.append((address, frozenset(), kwargs["timeout_s"]))
        if address == self.dead:
            failed: Future[Any] = Future()
            failed.set_exception(Unavailable(f"{address} is down", address=address))
            return failed
        return super().request(address, message)


def test_a_fetch_that_failed_on_a_replica_goes_to_another_and_waits_its_long_poll_plus_a_margin() -> None:
    log = _DeadReplica()
    consumer = Consumer(log, "t", max_wait_ms=500, auto_commit=False)
    table = consumer.poll(timeout_s=5.0)
    assert table.column("value").to_pylist() == [b"a", b"b", b"f", b"g"]
    assert [address for address, _, _ in log.asked] == ["tcp://replica-a", "tcp://replica-b"]
    assert log.nodes_forgotten == 1  # the node table is read again: the dead one may be marked so
    # One fetch waits its long poll plus the retry policy's margin, not the client's 30 s.
    assert {timeout for _, _, timeout in log.asked} == {0.5 + DEFAULT_RETRY.fetch_margin_s}
