"""ACLs and producer ids in the Meta Service: durable, versioned, never handed out twice.

The ``robustmq meta`` process is real (kill -9 between writes and reads); the block
reservation of producer ids is also checked on a controller over a real RocksDB store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import robustmq
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.meta import MetaServer
from robustmq.meta._acls import PRODUCER_ID_BLOCK
from robustmq.meta._controller import MetaController
from robustmq.meta._store import RocksDBMetaStore
from tests.e2e._procs import ServerProcess, free_port


def _meta_process(data_dir: Path, port: int) -> ServerProcess:
    return ServerProcess(["meta", "--data-dir", str(data_dir), "--meta-port", str(port)])


def _binding(principal: str, resource_type: str, name: str, operation: str, **more: str) -> pb.AclBinding:
    return pb.AclBinding(
        principal=principal, resource_type=resource_type, resource_name=name, operation=operation, **more
    )


def _listed(client: MetaClient, **filters: str) -> list[tuple[str, ...]]:
    return [
        (a.principal, a.resource_type, a.resource_name, a.pattern, a.operation, a.permission)
        for a in client.list_acls(**filters).acls
    ]


@pytest.mark.e2e
def test_acls_and_producer_ids_survive_kill_9(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "meta", free_port()
    process = _meta_process(data_dir, port).start()
    try:
        with MetaClient(f"127.0.0.1:{port}", timeout_s=15.0) as client:
            assert client.list_acls().acl_version == 0 and not client.list_acls().acls
            client.create_acl(_binding("user:alice", "topic", "orders", "read"))
            client.create_acl(_binding("user:alice", "topic", "eu.", "write", pattern="prefixed"))
            client.create_acl(_binding("*", "topic", "secret", "all", permission="deny"))
            client.create_acl(_binding("user:ops", "cluster", "", "alter"))
            client.create_acl(_binding("user:alice", "topic", "orders", "read"))  # again: no change
            assert client.list_acls().acl_version == 4
            before = _listed(client)
            assert len(before) == 4
            assert ("user:ops", "cluster", "cluster", "literal", "alter", "allow") in before
            assert _listed(client, principal="user:alice") == [
                ("user:alice", "topic", "eu.", "prefixed", "write", "allow"),
                ("user:alice", "topic", "orders", "literal", "read", "allow"),
            ]
            ids = [client.init_producer_id().producer_id for _ in range(5)]

            process.kill()  # SIGKILL: nothing flushed on the way out
            process = _meta_process(data_dir, port).start()

            assert _listed(client) == before
            assert client.list_acls().acl_version == 4
            after = [client.init_producer_id().producer_id for _ in range(5)]
            assert len(set(ids + after)) == 10 and min(after) > max(ids)

            assert client.delete_acl(_binding("user:alice", "topic", "orders", "read")) == 1
            assert client.delete_acl(_binding("user:alice", "topic", "orders", "read")) == 0
            assert client.list_acls().acl_version == 5
            assert ("user:alice", "topic", "orders", "literal", "read", "allow") not in _listed(client)
        assert process.stop() == 0
    finally:
        process.stop()


def test_a_bad_acl_is_refused_with_the_field_named_and_changes_nothing(tmp_path: Path) -> None:
    with MetaServer(tmp_path, port=0).start() as server, MetaClient(server.address, timeout_s=5.0) as client:
        for binding, field in [
            (_binding("alice", "topic", "orders", "read"), "principal"),
            (_binding("user:alice", "topic", "orders", "fly"), "operation"),
            (_binding("user:alice", "topic", "", "read"), "resource_name"),
        ]:
            with pytest.raises(InvalidRequest) as caught:
                client.create_acl(binding)
            assert field in caught.value.fields
            with pytest.raises(InvalidRequest):
                client.delete_acl(binding)
        answer = client.list_acls()
        assert (answer.acl_version, list(answer.acls)) == (0, [])


def test_producer_ids_come_in_reserved_blocks_and_a_reopened_store_skips_past_them(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    first = [controller.init_producer_id() for _ in range(PRODUCER_ID_BLOCK + 3)]
    controller.close()
    assert first == list(range(1, PRODUCER_ID_BLOCK + 4))
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        # The second block was reserved (1,001 .. 2,000) before id 1,001 was answered.
        assert controller.init_producer_id() == 2 * PRODUCER_ID_BLOCK + 1
    finally:
        controller.close()


def test_producers_get_their_ids_from_the_meta_service(tmp_path: Path) -> None:
    with (
        MetaServer(tmp_path, port=0).start() as server,
        robustmq.connect(server.address, timeout_s=10.0) as client,
    ):
        with (
            client.producer() as first,
            client.producer() as second,
            client.producer(idempotent=False) as plain,
        ):
            assert (first._producer_id, second._producer_id) == (1, 2)
            assert plain._producer_id == -1
        with client.producer() as third:
            assert third._producer_id == 3


def test_heartbeat_answers_carry_the_acl_version(tmp_path: Path) -> None:
    with MetaServer(tmp_path, port=0).start() as server, MetaClient(server.address, timeout_s=5.0) as client:
        client.register_node("n1", "tcp://127.0.0.1:7101")
        assert client.heartbeat("n1", "tcp://127.0.0.1:7101").acl_version == 0
        client.create_acl(_binding("user:alice", "group", "etl", "read"))
        assert client.heartbeat("n1", "tcp://127.0.0.1:7101").acl_version == 1
