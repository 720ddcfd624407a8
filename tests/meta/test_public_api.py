"""The public front of robustmq.meta and of the Meta Service client."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import robustmq.meta as meta
from robustmq._meta_client import MetaClient
from robustmq.errors import RobustMQError, Unavailable
from robustmq.meta import MetaServer, RocksDBMetaStore
from robustmq.meta._controller import MetaController


def test_all_is_sorted_and_resolves() -> None:
    def order(member: str) -> tuple[int, str]:
        return (0 if member.isupper() else 1 if member[0].isupper() else 2, member)

    assert meta.__all__ == sorted(meta.__all__, key=order)
    assert set(meta.__all__) == {
        "DEFAULT_META_PORT",
        "MetaServer",
        "MetaStore",
        "RocksDBMetaStore",
        "run_meta",
    }
    for name in meta.__all__:
        assert hasattr(meta, name)


def test_signatures() -> None:
    assert str(inspect.signature(meta.run_meta)) == (
        "(*, data_dir: 'str | Path', host: 'str' = '127.0.0.1', port: 'int' = 7070, "
        "node_timeout_ms: 'int' = 1500, tier_url: 'str | None' = None, "
        "retention_check_ms: 'int' = 30000, tls: 'TlsFiles | None' = None, "
        "super_users: 'Sequence[str]' = ('user:admin',), token_lifetime_ms: 'int' = 3600000, "
        "limits: 'MetaLimits | None' = None, quotas: 'MetaQuotas' = MetaQuotas(max_topics=10000, "
        "max_partitions=100000, max_partitions_per_topic=10000, max_segments_per_shard=1000, "
        "min_seal_interval_ms=0, producer_id_expiration_ms=604800000), store: 'str' = 'rocksdb', "
        "advertise: 'str | None' = None, "
        "etcd: 'EtcdOptions | None' = None, metrics_port: 'int | None' = None) -> 'int'"
    )
    server = inspect.signature(MetaServer)
    assert list(server.parameters) == [
        "data_dir",
        "host",
        "port",
        "node_timeout_ms",
        "tier_url",
        "retention_check_ms",
        "tls",
        "super_users",
        "token_lifetime_ms",
        "node_security",
        "limits",
        "quotas",
        "store",
        "advertise",
        "etcd",
    ]
    assert server.parameters["node_timeout_ms"].default == 1500
    assert server.parameters["tier_url"].kind is inspect.Parameter.KEYWORD_ONLY
    client = inspect.signature(MetaClient)
    assert client.parameters["timeout_s"].kind is inspect.Parameter.KEYWORD_ONLY
    assert client.parameters["channel"].default is None
    for rpc in (
        "create_topic",
        "list_topics",
        "describe_topic",
        "delete_topic",
        "get_shard",
        "register_node",
        "heartbeat",
        "list_nodes",
        "seal_segment",
        "commit_offsets",
        "fetch_offsets",
        "group_lag",
        "list_groups",
        "cluster_config",
        "list_sealed",
        "mark_tiered",
        "close",
    ):
        assert callable(getattr(MetaClient, rpc))


def test_a_closed_controller_sends_callers_elsewhere(tmp_path: Path) -> None:
    controller = MetaController(RocksDBMetaStore(tmp_path / "store"))
    controller.close()
    with pytest.raises(Unavailable):
        controller.list_topics()


def test_a_newer_store_format_is_refused(tmp_path: Path) -> None:
    store = RocksDBMetaStore(tmp_path / "store")
    store.write({b"V": (4).to_bytes(4, "big")})
    with pytest.raises(RobustMQError, match="format 4 is not supported"):
        MetaController(store)
    store.close()
