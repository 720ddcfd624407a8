"""RocksDBMetaStore: ordered prefix scans, atomic synced batches, reopen, kill -9, key layout."""

from __future__ import annotations

import itertools
import os
import random
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robustmq.errors import EngineClosed, InvalidConfig, NotLeader, QuotaExceeded, RequestTimeout, Unavailable
from robustmq.meta import MetaStore, RocksDBMetaStore
from robustmq.meta import _keys as keys
from robustmq.meta._controller import MetaController
from robustmq.meta._election import LeaderElection
from robustmq.meta._etcd_client import EtcdClient, _Lost, b64
from robustmq.meta._etcd_store import EtcdLimits, EtcdMetaStore, Fence, lease_clock, parse_etcd_url
from robustmq.meta._quotas import DEFAULT_QUOTAS, MetaQuotas
from robustmq.meta._retention import RetentionWorker
from robustmq.meta._store import WriteSet
from tests.e2e._etcd import EtcdCluster
from tests.e2e._procs import kill_at_random_moment, wait_until


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd for the module; each test has its own prefix."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def etcd_client(etcd: EtcdCluster) -> Iterator[EtcdClient]:
    client = EtcdClient(etcd.endpoints, timeout_s=10.0)
    yield client
    client.close()


_PREFIXES = itertools.count()


def _prefix() -> str:
    return f"/test-store-{os.getpid()}-{next(_PREFIXES)}"


@pytest.fixture(params=["rocksdb", "etcd", "etcd-leader"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetaStore]:
    """The store contract holds for both implementations, and for a leader's view of etcd (its
    reads answered by its mirror, but for keys under ``b``, which it does not mirror)."""
    opened: MetaStore
    if request.param == "rocksdb":
        opened = RocksDBMetaStore(tmp_path / "store")
        yield opened
        opened.close()
        return
    client = request.getfixturevalue("etcd_client")
    opened = EtcdMetaStore(client, _prefix())
    if request.param == "etcd":
        yield opened
        opened.close()
        return
    election, fences, _ = _elect(client, opened.leader_key, "127.0.0.1:1")
    election.start()
    try:
        wait_until(lambda: fences, 30)
        leading = opened.fenced(fences[0], unmirrored=(b"b",))
        yield leading
        leading.close()
    finally:
        election.stop()


@pytest.fixture
def rocksdb_store(tmp_path: Path) -> Iterator[RocksDBMetaStore]:
    opened = RocksDBMetaStore(tmp_path / "store")
    yield opened
    opened.close()


def test_is_a_meta_store(rocksdb_store: RocksDBMetaStore, etcd_client: EtcdClient) -> None:
    checked: MetaStore = rocksdb_store  # the Protocol is structural; mypy checks these lines
    assert checked is rocksdb_store
    on_etcd: MetaStore = EtcdMetaStore(etcd_client)
    assert isinstance(on_etcd, EtcdMetaStore)


def test_put_get_scan_delete_against_a_dict(store: MetaStore) -> None:
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}
    for _ in range(200):
        puts = {bytes([rng.choice(b"ab"), rng.randrange(8)]): rng.randbytes(3) for _ in range(3)}
        deletes = [bytes([rng.choice(b"ab"), rng.randrange(8)]) for _ in range(2)]
        store.write(puts, deletes)
        for key in deletes:
            if key not in puts:
                model.pop(key, None)
        model.update(puts)
        for prefix in (b"a", b"b", b"", b"a\x03"):
            expected = sorted((k, v) for k, v in model.items() if k.startswith(prefix))
            assert list(store.scan(prefix)) == expected
            assert list(store.scan_reverse(prefix)) == expected[::-1]
    for key in (b"a\x00", b"b\x07", b"zz"):
        assert store.get(key) == model.get(key)


def test_scan_stops_at_the_prefix_and_sorts_numbers_big_endian(store: MetaStore) -> None:
    store.write({keys.segment_key("t", 0, epoch): b"%d" % epoch for epoch in (0, 1, 255, 256)})
    store.write({keys.segment_key("t", 1, 0): b"other", keys.segment_key("tt", 0, 0): b"x"})
    assert [v for _, v in store.scan(keys.segments_prefix("t", 0))] == [b"0", b"1", b"255", b"256"]
    assert len(list(store.scan(keys.segments_prefix("t")))) == 5
    assert len(list(store.scan(keys.segments_prefix("tt")))) == 1


def test_reverse_scan_reads_a_chains_last_segment_first(store: RocksDBMetaStore) -> None:
    store.write({keys.segment_key("t", 0, epoch): b"%d" % epoch for epoch in (0, 1, 255, 256)})
    store.write({keys.segment_key("t", 1, 0): b"next shard", keys.segments_prefix("t", 1): b"at the end"})
    store.write({b"\xff": b"a", b"\xff\xff": b"b", b"\xff\xff\x01": b"c", b"\xfe\xff": b"d"})
    assert next(store.scan_reverse(keys.segments_prefix("t", 0))) == (keys.segment_key("t", 0, 256), b"256")
    assert [v for _, v in store.scan_reverse(keys.segments_prefix("t", 0))] == [b"256", b"255", b"1", b"0"]
    assert [v for _, v in store.scan_reverse(b"\xff\xff")] == [b"c", b"b"]  # no key ends the prefix
    assert [v for _, v in store.scan_reverse(b"\xff")] == [b"c", b"b", b"a"]
    assert list(store.scan_reverse(keys.segments_prefix("u"))) == []


def test_a_batch_is_all_or_nothing_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = RocksDBMetaStore(path)
    store.write({b"k1": b"1", b"k2": b"2", b"gone": b"x"})
    store.write({b"k3": b"3"}, deletes=[b"gone", b"never-there"])
    store.close()
    with pytest.raises(EngineClosed):
        store.get(b"k1")
    reopened = RocksDBMetaStore(path)
    try:
        assert list(reopened.scan(b"")) == [(b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3")]
    finally:
        reopened.close()


def test_a_second_opener_is_refused_while_the_first_holds_the_lock(rocksdb_store: RocksDBMetaStore) -> None:
    with pytest.raises(Unavailable) as caught:
        RocksDBMetaStore(rocksdb_store.path)
    assert caught.value.fields["path"] == str(rocksdb_store.path)


def test_write_set_keeps_the_last_of_put_and_delete(store: MetaStore) -> None:
    store.write({b"a": b"old", b"b": b"old"})
    ws = WriteSet()
    ws.put(b"a", b"new")
    ws.delete(b"a")
    ws.delete(b"b")
    ws.put(b"b", b"new")
    ws.put(b"c", b"new")
    ws.commit(store)
    assert list(store.scan(b"")) == [(b"b", b"new"), (b"c", b"new")]
    assert not WriteSet()


_CHILD = textwrap.dedent(
    """
    import sys
    from robustmq.meta import RocksDBMetaStore
    store = RocksDBMetaStore(sys.argv[1])
    print("ready", flush=True)
    batch = 0
    while True:
        store.write({b"%08d/%04d" % (batch, i): b"v" * 100 for i in range(500)},
                    deletes=[b"%08d/%04d" % (batch - 1, i) for i in range(0, 500, 2)])
        print("ack", batch, flush=True)
        batch += 1
    """
)


def test_kill_9_keeps_every_acknowledged_batch_whole(tmp_path: Path) -> None:
    path = tmp_path / "store"
    rng = random.Random(11)
    for _ in range(3):
        _, lines = kill_at_random_moment([sys.executable, "-c", _CHILD, str(path)], rng, delay_s=(0.05, 0.3))
        acked = [int(line.split()[1]) for line in lines if line.startswith("ack")]
        store = RocksDBMetaStore(path)
        try:
            per_batch: dict[int, int] = {}
            for key, _ in store.scan(b""):
                batch = int(key.split(b"/")[0])
                per_batch[batch] = per_batch.get(batch, 0) + 1
            if not per_batch:
                assert not acked
                continue
            last = max(per_batch)
            assert not acked or last >= acked[-1]
            # Each batch wrote 500 keys; the next one deleted half of them in the same batch.
            assert per_batch[last] == 500
            assert all(per_batch[b] == 250 for b in per_batch if b != last)
            assert sorted(per_batch) == list(range(last + 1))
            store.write({}, deletes=[key for key, _ in store.scan(b"")])
        finally:
            store.close()


def test_producer_id_owners_are_stored_with_the_id_and_expire_in_the_retention_pass(store: MetaStore) -> None:
    """Who each producer id went to is written with the allocation (so another session of that
    principal can take the id up), and the records expire after ``producer_id_expiration_ms``."""
    day_ms = 86_400_000
    assert DEFAULT_QUOTAS.producer_id_expiration_ms == 7 * day_ms
    controller = MetaController(store, quotas=MetaQuotas(producer_id_expiration_ms=day_ms))
    alice = controller.init_producer_id("user:alice", record_owner=True)
    bob = controller.init_producer_id("user:bob", "txn/0", record_owner=True)
    unrecorded = controller.init_producer_id("anonymous")  # security off: nobody to record
    allocated_ms = int(time.time() * 1000)
    again = MetaController(store)  # what the store holds, read by a fresh controller
    assert [again.producer_id_owner(pid) for pid in (alice, bob, unrecorded)] == [
        "user:alice",
        "user:bob",
        None,
    ]
    worker = RetentionWorker(controller, 60_000, clock=lambda: allocated_ms + day_ms - 60_000)
    worker.run_pass()
    assert controller.producer_id_owner(alice) == "user:alice"  # not a day old yet
    worker = RetentionWorker(controller, 60_000, clock=lambda: allocated_ms + day_ms + 60_000)
    worker.run_pass()
    assert [again.producer_id_owner(pid) for pid in (alice, bob)] == [None, None]
    # an id allocated later keeps its record; the transactional mapping itself stays
    carol = controller.init_producer_id("user:carol", record_owner=True)
    assert controller.expire_producer_owners(int(time.time() * 1000) + day_ms - 60_000) == 0
    assert controller.producer_id_owner(carol) == "user:carol"
    assert controller.init_producer_id("user:bob", "txn/0", record_owner=True) == bob


def test_key_layout_is_stable() -> None:
    """Golden bytes: if this fails, the on-disk format changed (bump FORMAT_VERSION)."""
    assert keys.FORMAT_VERSION == 3
    assert keys.sealed_index_key(keys.SEALED_INDEX, 258) == b"L" + b"\x00" * 6 + b"\x01\x02"
    assert keys.sealed_index_key(keys.UNTIERED_INDEX, 1) == b"U" + b"\x00" * 7 + b"\x01"
    assert keys.encode_sealed_entry("ab", 3, 1) == b"\x00\x02ab\x00\x00\x00\x03\x00\x00\x00\x01"
    assert keys.decode_sealed_entry(keys.encode_sealed_entry("ab", 3, 1)) == ("ab", 3, 1)
    assert keys.LAST_SEAL_KEY == b"Q" and keys.object_deletion_key("s3://b/k") == b"Xs3://b/k"
    assert keys.topic_key("orders") == b"T\x00\x06orders"
    assert keys.segment_key("ab", 3, 258) == b"S\x00\x02ab\x00\x00\x00\x03\x00\x00\x01\x02"
    assert keys.seal_key("ab", 3, 1) == b"R\x00\x02ab\x00\x00\x00\x03\x00\x00\x00\x01"
    assert keys.node_key("n1") == b"N\x00\x02n1"
    assert keys.pending_key("n1", "ab_3") == b"D\x00\x02n1\x00\x04ab_3"
    assert keys.pending_key("n1", "ab_3", 258) == b"D\x00\x02n1\x00\x04ab_3" + b"\x00" * 6 + b"\x01\x02"
    assert keys.holder_key("ab", 3, "n1", 258) == (
        b"E\x00\x02ab\x00\x00\x00\x03\x00\x02n1" + b"\x00" * 6 + b"\x01\x02"
    )
    assert keys.decode_holder_key(keys.holder_key("ab", 3, "n1", 7)) == ("ab", 3, "n1", 7)
    assert keys.INCARNATION_KEY == b"I" and keys.encode_incarnation(258) == b"\x00" * 6 + b"\x01\x02"
    assert keys.offset_key("ab", "g", 2) == b"O\x00\x02ab\x00\x01g\x00\x00\x00\x02"
    assert keys.group_key("g", "ab") == b"G\x00\x01g\x00\x02ab"
    assert keys.encode_offset_value(5, 7) == b"\x00" * 7 + b"\x05" + b"\x00" * 7 + b"\x07"
    assert keys.decode_offset_key(keys.offset_key("ab", "gé", 9)) == ("ab", "gé", 9)
    assert keys.decode_pending_key(keys.pending_key("n", "x_1")) == ("n", "x_1", 0)
    assert keys.decode_pending_key(keys.pending_key("n", "x_1", 7)) == ("n", "x_1", 7)
    assert keys.encode_progress(5, 7) == b"\x00" * 7 + b"\x05" + b"\x00" * 7 + b"\x07"
    assert keys.encode_progress(5, 7, 9) == keys.encode_progress(5, 7) + b"\x00" * 7 + b"\x09"
    progress = keys.progress_key("ab", 2)
    assert keys.decode_progress(progress, keys.encode_progress(5, 7)) == ("ab", 2, (5, 7), 0)
    assert keys.decode_progress(progress, keys.encode_progress(5, 7, 9)) == ("ab", 2, (5, 7), 9)
    assert keys.decode_group_key(keys.group_key("g", "t")) == ("g", "t")


# -- on etcd -------------------------------------------------------------------------------------


def test_a_batch_on_etcd_is_all_or_nothing_and_outlives_the_store_object(etcd_client: EtcdClient) -> None:
    prefix = _prefix()
    store = EtcdMetaStore(etcd_client, prefix)
    store.write({b"k1": b"1", b"k2": b"2", b"gone": b"x"})
    store.write({b"k3": b"3"}, deletes=[b"gone", b"never-there"])
    store.close()
    with pytest.raises(EngineClosed):
        store.get(b"k1")
    again = EtcdMetaStore(
        EtcdClient(parse_etcd_url(f"etcd://{etcd_client.endpoints[0]}{prefix}").endpoints), prefix
    )
    assert list(again.scan(b"")) == [(b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3")]
    assert list(EtcdMetaStore(etcd_client, prefix + "-other").scan(b"")) == []  # prefixes do not mix


def test_an_etcd_scan_reads_pages_of_one_snapshot(etcd_client: EtcdClient) -> None:
    store = EtcdMetaStore(etcd_client, _prefix())
    store.write({b"k%05d" % i: b"%d" % i for i in range(2_500)})  # 3 pages
    scan = store.scan(b"k")
    first = next(scan)
    store.write({b"k02000": b"changed", b"k09999": b"new"}, deletes=[b"k01500"])
    rest = list(scan)
    assert [first, *rest] == [(b"k%05d" % i, b"%d" % i) for i in range(2_500)]
    assert store.get(b"k02000") == b"changed" and store.get(b"k01500") is None


def test_a_change_past_etcds_limits_is_refused_whole(etcd_client: EtcdClient) -> None:
    store = EtcdMetaStore(
        etcd_client, _prefix(), limits=EtcdLimits(max_txn_ops=128, max_request_bytes=1 << 20)
    )
    store.write({b"k%03d" % i: b"v" for i in range(128)})
    with pytest.raises(QuotaExceeded) as caught:
        store.write({b"n%03d" % i: b"v" for i in range(100)}, deletes=[b"k%03d" % i for i in range(29)])
    assert caught.value.fields["quota"] == "etcd_max_txn_ops" and caught.value.fields["ops"] == 129
    with pytest.raises(QuotaExceeded) as caught:
        store.write({b"big": b"x" * (1 << 20)})
    assert caught.value.fields["quota"] == "etcd_max_request_bytes"
    assert len(list(store.scan(b""))) == 128 and store.get(b"big") is None  # nothing of either


def test_the_store_refuses_an_etcd_whose_limits_are_below_its_own(tmp_path: Path) -> None:
    defaults = EtcdCluster(tmp_path, limits=False).start()  # etcd's defaults: 128 ops, 1.5 MiB
    try:
        client = EtcdClient(defaults.endpoints)
        with pytest.raises(InvalidConfig) as caught:
            EtcdMetaStore(client).check_limits()
        assert (
            caught.value.fields["setting"] == "max-txn-ops" and "--max-txn-ops 100000" in caught.value.message
        )
        with pytest.raises(InvalidConfig) as caught:
            EtcdMetaStore(
                client, limits=EtcdLimits(max_txn_ops=128, max_request_bytes=4 << 20)
            ).check_limits()
        assert caught.value.fields["setting"] == "max-request-bytes"
        EtcdMetaStore(client, limits=EtcdLimits(max_txn_ops=128, max_request_bytes=1 << 20)).check_limits()
        client.close()
    finally:
        defaults.stop()


def _elect(
    client: EtcdClient, key: bytes, address: str
) -> tuple[LeaderElection, list[Fence], threading.Event]:
    fences: list[Fence] = []
    deposed = threading.Event()
    election = LeaderElection(
        client, key, address, on_elected=fences.append, on_deposed=lambda reason: deposed.set(), poll_s=0.05
    )
    return election, fences, deposed


def test_a_deposed_leaders_write_fails_in_etcd_and_changes_nothing(etcd_client: EtcdClient) -> None:
    """The fence: a leader whose term ended (its key gone, another's key in its place) writes nothing."""
    store = EtcdMetaStore(etcd_client, _prefix())
    first, first_fences, first_deposed = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    second, second_fences, _ = _elect(etcd_client, store.leader_key, "127.0.0.1:2")
    first.start()
    try:
        wait_until(lambda: first_fences, 30)
        second.start()
        wait_until(lambda: second.leader == "127.0.0.1:1", 30)
        old = store.fenced(first_fences[0])
        old.write({b"a": b"1"})  # while it leads, it writes
        # The first term ends as a lost lease would end it (revoked: its key is gone), and the
        # second instance takes over; the first one's fence object is still in hand.
        etcd_client.lease_revoke(first_fences[0].lease)
        wait_until(lambda: second_fences, 30)
        revision = int(etcd_client.range(b"\x00")["header"]["revision"])
        with pytest.raises(NotLeader) as caught:
            old.write({b"a": b"stale", b"b": b"stale"}, deletes=[b"c"])
        assert caught.value.fields["leader"] == "127.0.0.1:2" and caught.value.fields["reason"] == "fenced"
        assert int(etcd_client.range(b"\x00")["header"]["revision"]) == revision  # no write landed
        assert store.get(b"a") == b"1" and store.get(b"b") is None
        wait_until(first_deposed.is_set, 30)  # the failed write ended the term at once
        with pytest.raises(NotLeader):  # and later writes are refused before they are sent
            old.write({b"a": b"again"})
        store.fenced(second_fences[0]).write({b"a": b"2"})
        assert store.get(b"a") == b"2"
    finally:
        first.stop()
        second.stop()


def test_a_leader_reads_its_mirror_while_its_lease_is_certainly_its_own(etcd_client: EtcdClient) -> None:
    """The leader's reads come from its mirror (its own writes included), but once its lease may
    have run out (a pause, a stall) they go to etcd again: a deposed leader reads nothing stale."""
    store = EtcdMetaStore(etcd_client, _prefix())
    store.write({b"a1": b"before", b"o1": b"before"})
    election, fences, _ = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    election.start()
    try:
        wait_until(lambda: fences, 30)
        fence = fences[0]
        leading = store.fenced(fence, unmirrored=(b"o",))
        leading.write({b"a2": b"mine"}, deletes=[b"a1"])
        store.write({b"a3": b"behind its back", b"o1": b"behind its back"})  # no fence: tools only
        assert list(leading.scan(b"a")) == [(b"a2", b"mine")]  # the mirror answered, not etcd
        assert leading.get(b"o1") == b"behind its back"  # not mirrored: etcd answers
        fence.renewed -= fence.ttl_s  # as after a pause as long as the lease
        assert list(leading.scan(b"a")) == [(b"a2", b"mine"), (b"a3", b"behind its back")]
        assert leading.get(b"a3") == b"behind its back"
    finally:
        election.stop()


def test_writes_submitted_together_go_in_one_txn_in_order(etcd_client: EtcdClient) -> None:
    """Group commit: writes queued while none is sent ride one fenced Txn, applied as if one by
    one (the last put or delete of a key wins); each is done once that Txn succeeded."""
    store = EtcdMetaStore(etcd_client, _prefix())
    election, fences, _ = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    election.start()
    try:
        wait_until(lambda: fences, 30)
        leading = store.fenced(fences[0])
        leading.write({b"k": b"0", b"gone": b"x"})
        revision = int(etcd_client.range(b"\x00")["header"]["revision"])
        first = leading.submit({b"k": b"1", b"n": b"1"})
        second = leading.submit({b"k": b"2"}, deletes=[b"gone", b"n"])
        third = leading.submit({b"n": b"3"})
        assert store.get(b"k") == b"0"  # queued, not sent
        third.wait()  # sends the three: one Txn
        first.wait()
        second.wait()
        assert int(etcd_client.range(b"\x00")["header"]["revision"]) == revision + 1
        assert list(store.scan(b"")) == [(b"k", b"2"), (b"n", b"3")]
        assert list(leading.scan(b"")) == [(b"k", b"2"), (b"n", b"3")]  # and its mirror agrees
        leading.settle()  # nothing queued: returns at once
    finally:
        election.stop()


def test_a_deposed_leaders_grouped_writes_all_fail_and_change_nothing(etcd_client: EtcdClient) -> None:
    store = EtcdMetaStore(etcd_client, _prefix())
    election, fences, deposed = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    election.start()
    try:
        wait_until(lambda: fences, 30)
        leading = store.fenced(fences[0])
        queued = [leading.submit({b"k%d" % i: b"v"}) for i in range(3)]
        etcd_client.lease_revoke(fences[0].lease)  # the term ends as a lost lease ends it
        leading.settle()
        for write in queued:
            with pytest.raises(NotLeader) as caught:
                write.wait()
            assert caught.value.fields["reason"] == "fenced"
        assert list(store.scan(b"")) == []
        wait_until(deposed.is_set, 30)
    finally:
        election.stop()


def test_a_new_leader_keeps_its_lease_while_it_loads_and_sees_its_term_end_meanwhile(
    etcd_client: EtcdClient,
) -> None:
    """Taking over (loading the state) may last longer than the lease: the lease is renewed
    meanwhile, and a renewal that finds the term gone loses the fence before the load ends."""
    store = EtcdMetaStore(etcd_client, _prefix())
    fences: list[Fence] = []
    lost_when_loaded: list[bool] = []
    loaded, deposed = threading.Event(), threading.Event()

    def slow_load(fence: Fence) -> None:
        fences.append(fence)
        loaded.wait(30)
        lost_when_loaded.append(fence.lost.is_set())

    election = LeaderElection(
        etcd_client,
        store.leader_key,
        "127.0.0.1:1",
        on_elected=slow_load,
        on_deposed=lambda reason: deposed.set(),
        poll_s=0.05,
    )
    election.start()
    try:
        wait_until(lambda: fences, 30)
        time.sleep(1.25 * election.ttl_s)  # still loading, longer than the lease
        kvs = etcd_client.range(store.leader_key).get("kvs") or []
        assert [int(kv["lease"]) for kv in kvs] == [fences[0].lease]  # renewed: the key is there
        assert fences[0].current() and not fences[0].lost.is_set()
        etcd_client.txn([], [{"request_delete_range": {"key": b64(store.leader_key)}}])
        wait_until(fences[0].lost.is_set, 10)  # seen while still loading
        assert not deposed.is_set()  # on_deposed waits for on_elected
        loaded.set()
        wait_until(deposed.is_set, 10)
        assert lost_when_loaded[0]  # (it may be elected again: a second term, loaded at once)
    finally:
        loaded.set()
        election.stop()


def test_a_leader_whose_key_was_deleted_steps_down_and_reads_etcd(etcd_client: EtcdClient) -> None:
    """The leader key deleted by hand while its lease lives (``etcdctl del``): another instance is
    elected and writes; the old leader's next renewal finds the key not its own and ends its
    term, so it never answers from a mirror the new leader moved past."""
    store = EtcdMetaStore(etcd_client, _prefix())
    first, first_fences, first_deposed = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    first.start()
    second = None
    try:
        wait_until(lambda: first_fences, 30)
        old = store.fenced(first_fences[0])
        old.write({b"topic": b"v1"})
        etcd_client.txn([], [{"request_delete_range": {"key": b64(store.leader_key)}}])
        second, second_fences, _ = _elect(etcd_client, store.leader_key, "127.0.0.1:2")
        second.start()
        wait_until(lambda: second_fences, 30)
        store.fenced(second_fences[0]).write({b"topic": b"v2"})
        wait_until(first_deposed.is_set, 10)
        assert first_fences[0].lost.is_set() and not first_fences[0].current()
        assert old.get(b"topic") == b"v2"  # etcd answers, not the old mirror
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_lease_counts_from_when_its_grant_was_sent(etcd_client: EtcdClient) -> None:
    """A grant whose answer comes back late: the lease is trusted from when it was asked for
    (etcd started it before answering), not from when the answer arrived."""
    asked: list[float] = []

    class LateAnswers(EtcdClient):
        def lease_grant(self, ttl_s: int) -> int:
            asked.append(lease_clock())
            lease = super().lease_grant(ttl_s)
            time.sleep(0.5)  # the answer is late (a loaded host, a slow network)
            return lease

    late = LateAnswers(etcd_client.endpoints, timeout_s=10.0)
    store = EtcdMetaStore(late, _prefix())
    trusted_from: list[float] = []
    election = LeaderElection(
        late,
        store.leader_key,
        "127.0.0.1:1",
        on_elected=lambda fence: trusted_from.append(fence.renewed),
        on_deposed=lambda reason: None,
        poll_s=0.05,
    )
    election.start()
    try:
        wait_until(lambda: trusted_from, 30)
        assert trusted_from[0] <= asked[-1]
    finally:
        election.stop()
        late.close()


@pytest.mark.parametrize("second_try", ["compare fails", "etcd refuses"])
def test_a_write_whose_first_try_may_have_landed_is_never_reported_as_not_written(
    etcd_client: EtcdClient, second_try: str
) -> None:
    """A write's first try lands but its answer is lost; the lease runs out (or etcd refuses the
    try sent again): the write may have been applied, so it is a RequestTimeout (outcome
    unknown), never NotLeader ("nothing was written", which clients send to the next leader),
    and the term ends (the mirror may miss the write)."""
    store = EtcdMetaStore(etcd_client, _prefix())
    election, fences, deposed = _elect(etcd_client, store.leader_key, "127.0.0.1:1")
    election.start()
    real_post = etcd_client._post
    tries: list[str] = []
    armed: list[bool] = []

    def lossy_post(endpoint: Any, path: str, payload: bytes, timeout_s: float) -> Any:
        if path != "/v3/kv/txn" or not armed:  # while it leads, the election sends no Txn
            return real_post(endpoint, path, payload, timeout_s)
        tries.append(path)
        if len(tries) == 1:
            real_post(endpoint, path, payload, timeout_s)  # applied...
            if second_try == "compare fails":  # ...and before the try sent again, the lease is gone
                etcd_client.lease_revoke(fences[0].lease)
            raise _Lost("the answer was lost", True)
        if second_try == "etcd refuses":
            return 400, {"code": 3, "error": "etcdserver: refused for a reason"}, None
        return real_post(endpoint, path, payload, timeout_s)

    try:
        wait_until(lambda: fences, 30)
        leading = store.fenced(fences[0])
        etcd_client._post = lossy_post  # type: ignore[method-assign]
        armed.append(True)
        with pytest.raises(RequestTimeout) as caught:
            leading.write({b"topic": b"created"})
        assert caught.value.fields["outcome"] == "unknown" and len(tries) == 2
        assert store.get(b"topic") == b"created"  # it was applied
        assert fences[0].lost.is_set()
        wait_until(deposed.is_set, 10)
    finally:
        etcd_client._post = real_post  # type: ignore[method-assign]
        election.stop()


def test_the_access_check_whose_answer_was_lost_is_asked_again(etcd_client: EtcdClient) -> None:
    """The start-up access check is a Txn that can write nothing: a lost answer is no unknown
    outcome, and its compare (never true) failing on the try sent again is its normal answer."""
    real_post = etcd_client._post
    tries: list[str] = []

    def lossy_post(endpoint: Any, path: str, payload: bytes, timeout_s: float) -> Any:
        if path == "/v3/kv/txn" and not tries:
            tries.append(path)
            real_post(endpoint, path, payload, timeout_s)
            raise _Lost("the answer was lost", True)
        return real_post(endpoint, path, payload, timeout_s)

    etcd_client._post = lossy_post  # type: ignore[method-assign]
    try:
        EtcdMetaStore(etcd_client, _prefix()).check_access()
        assert tries
    finally:
        etcd_client._post = real_post  # type: ignore[method-assign]


def test_a_renewal_that_fails_at_once_is_tried_again_after_a_pause(etcd_client: EtcdClient) -> None:
    """etcd refusing renewals at once (no busy loop): tried every 0.1 s until the lease may have
    run out, then the term ends."""
    tries: list[float] = []

    class Refusing(EtcdClient):
        refuse = False

        def lease_keepalive(self, lease: int, *, timeout_s: float | None = None) -> int:
            if not self.refuse:
                return super().lease_keepalive(lease, timeout_s=timeout_s)
            tries.append(lease_clock())
            raise Unavailable("etcd refuses at once")

    refusing = Refusing(etcd_client.endpoints, timeout_s=10.0)
    store = EtcdMetaStore(refusing, _prefix())
    election, fences, deposed = _elect(refusing, store.leader_key, "127.0.0.1:1")
    election.start()
    try:
        wait_until(lambda: fences, 30)
        refusing.refuse = True
        wait_until(deposed.is_set, 10)
        assert 3 <= len(tries) <= election.ttl_s / 0.1 + 2
    finally:
        election.stop()
        refusing.close()


def test_parse_etcd_url() -> None:
    assert parse_etcd_url("etcd://h1:2379,h2:2379/rmq/prod") == parse_etcd_url(
        "etcd://h1:2379,h2:2379/rmq/prod/"
    )
    parsed = parse_etcd_url("etcd://h1:2379,h2:2379/rmq/prod")
    assert parsed.endpoints == ("h1:2379", "h2:2379") and parsed.prefix == "/rmq/prod"
    assert parse_etcd_url("etcd://h1:2379").prefix == "/robustmq"
    for bad in ("etcd://", "etcd://h1", "http://h1:2379", "etcd://h1:x/p", "rocksdb"):
        with pytest.raises(InvalidConfig):
            parse_etcd_url(bad)
