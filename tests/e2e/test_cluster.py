"""A real cluster in processes on loopback: the Meta Service and a storage node, killed and restarted."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records, encode_batch
from robustmq.errors import RobustMQError
from tests.e2e._procs import Cluster, free_port, running

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(tmp_path).start()
    try:
        yield started
    finally:
        started.stop()


def _values(prefix: str, start: int, count: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(start, start + count)]


def _read_all(client: robustmq.Client, topic: str) -> dict[int, pa.Table]:
    tables = {}
    for partition, (earliest, end) in client.list_offsets(topic).items():
        parts, offset = [], earliest
        while offset < end:
            table = client.read(topic, partition, offset, 200_000)
            parts.append(table)
            offset += table.num_rows
        tables[partition] = pa.concat_tables(parts) if parts else None
    return tables


@pytest.mark.slow
def test_a_million_records_across_eight_partitions(tmp_path: Path) -> None:
    port = free_port()
    with (
        running(
            ["server", "--data-dir", str(tmp_path), "--meta-port", str(port), "--node-port", str(free_port())]
        ),
        robustmq.connect(f"127.0.0.1:{port}") as client,
    ):
        client.create_topic("big", 8)
        with client.producer() as producer:
            futures = []
            for start in range(0, 990_000, 55_000):
                table = build_records(
                    _values("bulk", start, 55_000),
                    keys=[b"k%d" % (i % 1000) for i in range(start, start + 55_000)],
                )
                futures.append(producer.send_batch("big", table))
            singles = [producer.send("big", value) for value in _values("single", 0, 10_000)]
            for future in futures:
                future.result(120)
            single_offsets = [future.result(60) for future in singles]
        assert len({(m.partition, m.offset) for m in single_offsets}) == 10_000
        seen: list[bytes] = []
        with client.consumer("big", group="verify") as consumer:
            last_offset = dict.fromkeys(range(8), -1)
            while len(seen) < 1_000_000:
                table = consumer.poll(10)
                assert table.num_rows, "the consumer stalled before reading everything"
                for partition, offset in zip(
                    table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
                ):
                    assert offset == last_offset[partition] + 1, "offsets out of order or with a gap"
                    last_offset[partition] = offset
                seen.extend(table.column("value").to_pylist())
        assert len(seen) == 1_000_000
        assert len(set(seen)) == 1_000_000, "a record was read twice"
        assert set(seen) == set(_values("bulk", 0, 990_000)) | set(_values("single", 0, 10_000))
        ends = client.list_offsets("big")
        assert sum(end for _, end in ends.values()) == 1_000_000
        assert client.group_offsets("verify", "big") == {p: end for p, (_, end) in ends.items()}


@pytest.mark.slow
def test_sigkill_of_the_node_loses_no_acknowledged_record(cluster: Cluster) -> None:
    rounds = 10
    acked: list[tuple[int, int, bytes]] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    with robustmq.connect(cluster.meta_address, timeout_s=30) as client:
        client.create_topic("durable", 4)

        def produce() -> None:
            with client.producer(linger_ms=2, delivery_timeout_s=60, request_timeout_s=5) as producer:
                sequence = 0
                while not stop.is_set():
                    futures = []
                    for _ in range(200):
                        value = b"rec-%d" % sequence
                        futures.append((value, producer.send("durable", value)))
                        sequence += 1
                    for value, future in futures:
                        try:
                            meta = future.result(90)
                            acked.append((meta.partition, meta.offset, value))
                        except RobustMQError as error:
                            failures.append(error)

        writer = threading.Thread(target=produce)
        writer.start()
        rng = random.Random(3)
        try:
            for _ in range(rounds):
                time.sleep(rng.uniform(0.3, 1.2))
                before = len(acked)
                cluster.node.kill()
                time.sleep(rng.uniform(0.0, 0.5))
                cluster.node.start()
                deadline = time.monotonic() + 60
                while len(acked) <= before and time.monotonic() < deadline:
                    time.sleep(0.05)  # wait for progress after the restart
                assert len(acked) > before, "no record was acknowledged after the node restarted"
        finally:
            stop.set()
            writer.join(180)
        assert not writer.is_alive()
        tables = _read_all(client, "durable")
    stored: dict[tuple[int, int], bytes] = {}
    all_values: list[bytes] = []
    for partition, table in tables.items():
        if table is None:
            continue
        offsets = table.column("offset").to_pylist()
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "gap in the offsets"
        for offset, value in zip(offsets, table.column("value").to_pylist(), strict=True):
            stored[(partition, offset)] = value
            all_values.append(value)
    assert len(acked) > 1000
    for partition, offset, value in acked:
        assert stored.get((partition, offset)) == value, f"acknowledged record {value!r} lost"
    assert len(all_values) == len(set(all_values)), "a record is stored twice"
    assert not failures, f"{len(failures)} sends failed for good: {failures[:3]}"


@pytest.mark.slow
def test_sigkill_of_the_meta_service_keeps_topics_segments_and_offsets(cluster: Cluster) -> None:
    with robustmq.connect(cluster.meta_address) as client:
        client.create_topic("kept", 2, segment_bytes_max=128 * 1024)
        with client.producer() as producer:
            table = build_records([b"y" * 500] * 2_000).append_column(
                "partition", pa.array([i % 2 for i in range(2_000)], pa.int32())
            )
            producer.send_batch("kept", table).result(30)  # passes segment_bytes_max: sealed
            producer.send("kept", b"one more", partition=1).result(30)
        client.seal("kept", 1)
        client.commit_offsets("app", "kept", {0: 5, 1: 7})
        before = client.describe_topic("kept")
    cluster.meta.kill()
    cluster.meta.start()
    with robustmq.connect(cluster.meta_address) as client:
        after = client.describe_topic("kept")
        assert [list(s.segments) for s in after.shards] == [list(s.segments) for s in before.shards]
        assert sum(len(s.segments) for s in after.shards) > 2
        assert client.group_offsets("app", "kept") == {0: 5, 1: 7}
        with client.producer() as producer:  # the node keeps working with the restarted Meta Service
            assert producer.send("kept", b"after", partition=0).result(30).offset > 0


@pytest.mark.slow
def test_a_thousand_topics_keep_the_node_memory_bounded(tmp_path: Path) -> None:
    port = free_port()
    with (
        running(
            ["server", "--data-dir", str(tmp_path), "--meta-port", str(port), "--node-port", str(free_port())]
        ) as server,
        robustmq.connect(f"127.0.0.1:{port}") as client,
        client.producer(linger_ms=20) as producer,
    ):
        rss = {}
        for topic in range(1000):
            client.create_topic(f"t{topic}", 4)
        for topic in range(1000):
            producer.send_batch(
                f"t{topic}",
                pa.table({"value": [b"v"] * 4, "partition": pa.array([0, 1, 2, 3], pa.int32())}),
            )
            if topic in (499, 999):
                producer.flush(300)
                rss[topic] = server.rss_mb()
        ends = client.list_offsets("t999")
        assert ends == {p: (0, 1) for p in range(4)}
    assert rss[999] < 400, f"node RSS {rss[999]:.0f} MB with 4,000 shards"
    assert rss[999] - rss[499] < 150, f"RSS grew {rss[999] - rss[499]:.0f} MB for 2,000 more shards"


_NODE_REQUEST_BODIES = [
    "produce",
    "fetch",
    "read_by_key",
    "read_by_tag",
    "offset_for_timestamp",
    "list_offsets",
    "seal",
    "status",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_frames_get_errors_and_change_nothing(cluster: Cluster, data: st.DataObject) -> None:
    context = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 10_000)
    socket.connect(f"tcp://127.0.0.1:{cluster.node_port}")
    valid = pb.NodeRequest(correlation_id=1, produce=pb.ProduceRequest(shard="victim_0", epoch=0))
    payload = encode_batch(build_records([b"ok"])).to_pybytes()
    try:
        kind = data.draw(st.sampled_from(["random", "mutated", "wrong_body"]))
        if kind == "random":
            parts = data.draw(st.lists(st.binary(max_size=300), min_size=1, max_size=4))
        elif kind == "mutated":
            header, body = bytearray(valid.SerializeToString()), bytearray(payload)
            for _ in range(data.draw(st.integers(1, 8))):
                target = data.draw(st.sampled_from([header, body]))
                position = data.draw(st.integers(0, len(target) - 1))
                target[position] = data.draw(st.integers(0, 255))
            parts = [bytes(header), bytes(body)]
        else:
            body_name = data.draw(st.sampled_from(_NODE_REQUEST_BODIES))
            request = pb.NodeRequest(correlation_id=2)
            getattr(request, body_name).SetInParent()
            field = getattr(request, body_name)
            if hasattr(field, "shard"):
                field.shard = data.draw(st.text(max_size=40))
            parts = [request.SerializeToString(), *data.draw(st.lists(st.binary(max_size=100), max_size=2))]
        socket.send_multipart(parts)
        reply = socket.recv_multipart()
        answer = pb.NodeResponse.FromString(reply[0])
        if answer.HasField("error"):
            assert answer.error.code and answer.error.message
    finally:
        socket.close()
    with robustmq.connect(cluster.meta_address, timeout_s=20) as client:
        if "victim" not in client.list_topics():
            client.create_topic("victim", 1)
        ends = client.list_offsets("victim")
        written = ends[0][1]
        with client.producer() as producer:  # a normal client still works
            assert producer.send("victim", b"check").result(20).offset == written
    assert cluster.node.alive()


def test_cli_topic_produce_consume_groups(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    port = free_port()
    with running(
        [
            "server",
            "--data-dir",
            str(tmp_path / "data"),
            "--meta-port",
            str(port),
            "--node-port",
            str(free_port()),
        ]
    ):
        meta = f"127.0.0.1:{port}"

        def cli(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "robustmq.cli", *args, "--meta", meta],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "created topic events" in cli("topic", "create", "events", "--partitions", "2")
        lines = "\n".join(f'{{"key": "k{i}", "value": "v{i}", "tags": ["t{i % 2}"]}}' for i in range(50))
        cli("produce", "events", "--format", "json", stdin=lines)
        printed = cli("consume", "events", "--from", "earliest", "--max-records", "50", "--group", "cli")
        values = sorted(line.split('"value": "')[1].split('"')[0] for line in printed.splitlines())
        assert values == sorted(f"v{i}" for i in range(50))
        described = cli("topic", "describe", "events")
        assert "high_watermark" in described and "partition" in described
        groups = cli("groups", "--group", "cli")
        assert "lag" in groups and "events" in groups
        assert "0" in cli("segments", "events")
        assert "events" in cli("topic", "list")
        failed = subprocess.run(
            [sys.executable, "-m", "robustmq.cli", "topic", "describe", "nosuch", "--meta", meta],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert failed.returncode == 2 and "nosuch" in failed.stderr and "Traceback" not in failed.stderr
