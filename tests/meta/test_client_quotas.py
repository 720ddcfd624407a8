"""Per-principal quota entries in the Meta Service: durable, versioned, set by ``robustmq quota``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest
from robustmq.meta import MetaServer
from robustmq.meta._controller import MetaController
from robustmq.meta._store import RocksDBMetaStore
from tests.e2e._cli import cli


def test_entries_are_durable_and_each_change_moves_the_acl_version(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        assert controller.list_client_quotas() == [] and controller.acl_version == 0
        controller.set_client_quota(pb.QuotaEntry(principal="user:b", produce_bytes_per_s=10))
        controller.set_client_quota(pb.QuotaEntry(principal="*", requests_per_s=100))
        controller.set_client_quota(pb.QuotaEntry(principal="*", requests_per_s=100))  # the same: no change
        assert controller.acl_version == 2
        controller.set_client_quota(pb.QuotaEntry(principal="user:b", fetch_bytes_per_s=5))  # replaces it
        with pytest.raises(InvalidRequest):
            controller.set_client_quota(pb.QuotaEntry(principal="node:n1", fetch_bytes_per_s=5))
        assert controller.acl_version == 3
        assert controller.delete_client_quota("user:gone") is False
        assert controller.acl_version == 3
    finally:
        controller.close()
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    try:
        assert [str(quota) for quota in controller.list_client_quotas()] == [
            "*: requests_per_s=100",
            "user:b: fetch_bytes_per_s=5",
        ]
        assert controller.delete_client_quota("user:b") is True and controller.acl_version == 4
    finally:
        controller.close()


def test_the_quota_command_sets_lists_and_removes_and_refuses_bad_input(tmp_path: Path) -> None:
    with MetaServer(tmp_path, port=0).start() as server:
        meta = ["--meta", server.address, "--timeout-s", "10"]
        done = cli("quota", "set", "--principal", "user:etl", "--produce-bytes-per-s", "2_000_000", *meta)
        assert done.returncode == 0 and done.stdout.strip() == "set: user:etl: produce_bytes_per_s=2,000,000"
        assert cli("quota", "set", "--principal", "*", "--requests-per-s", "0", *meta).returncode == 0
        listed = json.loads(cli("quota", "list", "--json", *meta).stdout)
        assert listed["quotas"] == [
            {"principal": "*", "produce_bytes_per_s": None, "fetch_bytes_per_s": None, "requests_per_s": 0},
            {
                "principal": "user:etl",
                "produce_bytes_per_s": 2_000_000,
                "fetch_bytes_per_s": None,
                "requests_per_s": None,
            },
        ]
        for bad in (
            ["--principal", "node:n1", "--requests-per-s", "5"],
            ["--principal", "user:etl"],
        ):
            refused = cli("quota", "set", *bad, *meta)
            assert refused.returncode == 2, refused
            assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
        assert cli("quota", "remove", "--principal", "user:etl", *meta).stdout.strip() == "removed: user:etl"
