"""The ``robustmq meta`` process: kill -9 loses nothing acknowledged; SIGTERM exits cleanly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from tests.e2e._procs import ROOT, ServerProcess, free_port

pytestmark = pytest.mark.e2e


def _meta_process(data_dir: Path, port: int) -> ServerProcess:
    return ServerProcess(["meta", "--data-dir", str(data_dir), "--meta-port", str(port)])


def _state(client: MetaClient) -> tuple[object, ...]:
    return (
        client.list_topics(),
        [client.describe_topic(t.name) for t in client.list_topics()],
        [(n.node_id, n.address, n.registered_ms) for n in client.list_nodes()],
        client.fetch_offsets("etl", "orders"),
        client.list_groups(),
    )


def test_kill_9_then_restart_keeps_everything_and_sigterm_exits_0(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "meta", free_port()
    process = _meta_process(data_dir, port).start()
    try:
        with MetaClient(f"127.0.0.1:{port}", timeout_s=10.0) as client:
            for index in range(3):
                client.register_node(f"node-{index}", f"tcp://127.0.0.1:{7101 + index}")
            client.create_topic("orders", partitions=4)
            client.create_topic("audit", engine="memory")
            sealed = client.seal_segment("orders_0", 0, 1000, "node-0")
            client.seal_segment("orders_0", 1, 2500, sealed.next.leader)
            client.commit_offsets("etl", "orders", {0: 2400, 3: 17})
            holder = client.describe_topic("audit").shards[0].segments[0].leader
            client.delete_topic("audit")
            before = _state(client)

            process.kill()  # SIGKILL: no chance to flush anything
            assert process.process is not None and process.process.returncode == -9
            process = _meta_process(data_dir, port).start()

            assert _state(client) == before
            chain = client.get_shard("orders_0").segments
            assert [(s.epoch, s.start_offset, s.end_offset) for s in chain] == [
                (0, 0, 1000),
                (1, 1000, 2500),
                (2, 2500, -1),
            ]
            assert chain[-1].state == pb.ACTIVE
            # The deleted topic's shard is still owed to the node that held it.
            assert [d.shard for d in client.heartbeat(holder, "").deletions] == ["audit_0"]
            # A restarted Meta Service places segments only on nodes that beat since it started.
            # (only the holder has beaten since: the others may be dead for all it knows).
            fresh = client.describe_topic(client.create_topic("fresh", partitions=3).name)
            assert {shard.segments[-1].leader for shard in fresh.shards} == {holder}
        assert process.stop() == 0
    finally:
        process.stop()


def test_a_taken_port_or_a_locked_directory_fails_cleanly(tmp_path: Path) -> None:
    port = free_port()
    first = _meta_process(tmp_path / "a", port).start()
    try:
        for data_dir, meta_port in ((tmp_path / "b", port), (tmp_path / "a", free_port())):
            command = ["meta", "--data-dir", str(data_dir), "--meta-port", str(meta_port)]
            second = subprocess.run(
                ServerProcess(command).args, cwd=ROOT, capture_output=True, text=True, timeout=60
            )
            lines = [line for line in second.stderr.splitlines() if line.strip()]
            assert second.returncode == 1
            # One line: ours, not gRPC's own "E... add_port.cc:83] Failed to add port" before it.
            assert len(lines) == 1 and "the meta service cannot start" in lines[0], second.stderr
            assert "ready" not in second.stdout
    finally:
        assert first.stop() == 0
