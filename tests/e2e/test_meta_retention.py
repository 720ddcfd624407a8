"""Retention across tiers in a real ``robustmq server`` process (Meta Service + storage node).

Records are produced and sealed by the real node; each sealed segment's object
is put into the server's own object store (``file://{data-dir}/tier``, the
default) and recorded with ``MarkTiered``, as the tiering job does. The Meta
Service's retention worker (``--retention-check-ms 200``) must then shorten
the chain, turn what is left into ``remote`` and delete the objects of what
left, with nothing else driving it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import robustmq
from robustmq.tier._store import ObjectStore, segment_key
from tests.e2e._cli import cli
from tests.e2e._procs import free_port, running, wait_until

pytestmark = pytest.mark.e2e


def test_the_meta_service_applies_retention_across_tiers_by_itself(tmp_path: Path) -> None:
    port = free_port()
    command = ["server", "--data-dir", str(tmp_path), "--meta-port", str(port),
               "--node-port", str(free_port()), "--retention-check-ms", "200"]  # fmt: skip
    with running(command), robustmq.connect(f"127.0.0.1:{port}") as client:
        meta = f"127.0.0.1:{port}"
        store = ObjectStore.from_url(client.meta.cluster_config().tier_url)
        assert store.url == f"file://{tmp_path.resolve()}/tier"
        # retention_bytes 1: every sealed segment but the newest goes; local 0: it goes remote.
        created = cli("topic", "create", "ret", "--retention-bytes", "1", "--local-retention-ms", "0",
                      "--meta", meta)  # fmt: skip
        assert created.returncode == 0, created.stderr
        incarnation = client.meta.get_shard("ret_0").incarnation
        urls = []
        with client.producer() as producer:
            for epoch in range(3):
                producer.send("ret", f"record {epoch}".encode()).result(30)
                assert cli("segments", "seal", "ret", "0", "--meta", meta).returncode == 0
                sealed = client.meta.get_shard("ret_0").segments[-2]
                assert (sealed.epoch, sealed.state) == (epoch, 1)  # SEALED, and nothing removed yet
                # A replication-factor-1 seal records its size too: byte retention counts on it.
                assert sealed.size_bytes > len(f"record {epoch}"), sealed
                key = segment_key("ret", 0, epoch, sealed.start_offset, incarnation=incarnation)
                assert store.put_if_absent(key, b"the object of " + key.encode())
                urls.append(store.url_of(key))
                client.meta.mark_tiered("ret_0", incarnation, epoch, urls[-1], 100, 1)

        def settled() -> bool:
            rows = json.loads(cli("segments", "ret", "--json", "--meta", meta).stdout)
            states = [(row["epoch"], row["state"], row["object_url"]) for row in rows]
            return states == [(2, "remote", urls[2]), (3, "active", None)] and len(store.list("ret/")) == 1

        try:
            wait_until(settled, 30)
        except AssertionError:
            print(cli("segments", "ret", "--json", "--meta", meta).stdout, store.list("ret/"))
            raise
        assert store.list("ret/") == [store.key_of(urls[2])]  # the objects of what left are deleted
        remote = client.meta.get_shard("ret_0").segments[0]
        assert not remote.isr and list(remote.replicas)  # no local copy serves it; who held it is kept
        assert [s.segment.epoch for s in client.meta.list_sealed(0).segments] == [2]
