"""ObjectStore against both backends: a directory (file://) and a real moto_server (s3://)."""

from __future__ import annotations

import pickle
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq.errors import ObjectStoreError, ObjectStoreUnavailable
from robustmq.tier._store import ObjectStore, object_store_of, segment_key
from tests._s3 import S3Server
from tests.e2e._procs import free_port


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for key, value in s3_server.environment.items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "file":
        made = ObjectStore.from_url(f"file://{tmp_path}/tier")
        made.check()  # creates the tier directory: puts never create it
        yield made
    else:
        server: S3Server = request.getfixturevalue("s3_env")
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        server.boto3_client().create_bucket(Bucket=bucket)
        yield ObjectStore.from_url(f"s3://{bucket}/some/prefix")


def test_segment_key_is_the_documented_layout() -> None:
    key = segment_key("orders", 3, 7, 1234, incarnation=1763900000123)
    assert key == "orders/3/1763900000123/0000000007-00000000000000001234.parquet"
    store = ObjectStore.from_url("s3://bucket/prefix")
    assert object_store_of(store.url_of(key)).url == "s3://bucket/prefix"


def test_put_if_absent_never_overwrites(store: ObjectStore) -> None:
    store.check()
    store.check()
    assert store.list("") == []  # the checks' probe objects are gone
    key = segment_key("t", 0, 1, 0, incarnation=5)
    assert store.put_if_absent(key, b"first") is True
    assert store.put_if_absent(key, b"second, longer") is False
    assert store.get(key) == b"first"
    assert store.size(key) == 5


def test_put_from_a_file_and_ranged_reads(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    data = bytes(range(256)) * 40
    source.write_bytes(data)
    assert store.put_if_absent("t/0/a", source) is True
    assert store.get("t/0/a") == data
    assert store.get_range("t/0/a", 100, 50) == data[100:150]
    assert store.get_range("t/0/a", len(data) - 10, 50) == data[-10:]
    assert store.get_range("t/0/a", len(data) + 5, 10) == b""
    assert store.get_range("t/0/a", 0, 0) == b""


def test_list_delete_and_urls(store: ObjectStore) -> None:
    for key in ("a/1/x", "a/0/y", "a/0/x", "ab/0/x", "b/0/x"):
        store.put_if_absent(key, key.encode())
    assert store.list("a/") == ["a/0/x", "a/0/y", "a/1/x"]
    assert store.list("a") == ["a/0/x", "a/0/y", "a/1/x", "ab/0/x"]
    assert store.list("a/", limit=2) == ["a/0/x", "a/0/y"]
    assert store.list("zzz/") == []
    store.delete("a/0/y")
    store.delete("a/0/y")  # absent is fine
    assert store.list("a/0/") == ["a/0/x"]
    url = store.url_of("a/0/x")
    assert url == f"{store.url}/a/0/x"
    assert store.key_of(url) == "a/0/x"
    with pytest.raises(ObjectStoreError, match="not in the store"):
        store.key_of("s3://elsewhere/a/0/x")


def test_missing_objects_and_bad_keys_are_typed_errors(store: ObjectStore) -> None:
    with pytest.raises(ObjectStoreError) as missing:
        store.get("no/such/key")
    assert store.url in str(missing.value)
    with pytest.raises(ObjectStoreError):
        store.size("no/such/key")
    for key in ("", "/abs", "a/../b", "a//b", "a/~tmp-x"):
        with pytest.raises(ObjectStoreError, match="invalid object key"):
            store.put_if_absent(key, b"x")


def test_key_parts_that_look_like_old_temporary_files_are_valid(store: ObjectStore) -> None:
    # ".tmp-a" is a valid topic name (A-Za-z0-9._-): its objects must have keys.
    key = segment_key(".tmp-a", 0, 1, 0, incarnation=1)
    assert store.put_if_absent(key, b"v")
    assert store.list(".tmp-a/") == [key]
    assert store.key_of(store.url_of(key)) == key
    assert store.get(key) == b"v"


def _race(store: ObjectStore, key: str, writers: int) -> list[bool]:
    """``writers`` threads put a different value at ``key`` at once; each one's answer."""
    results: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(writers)

    def put(value: bytes) -> None:
        start.wait(30)
        won = store.put_if_absent(key, value)
        with lock:
            results.append(won)

    threads = [threading.Thread(target=put, args=(bytes([n]) * 1000,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_concurrent_puts_of_one_key_store_exactly_one(store: ObjectStore) -> None:
    """Eight writers race for each of 100 keys. (moto checked and stored a conditional put without a
    lock: under load now and then two won one key; tests/_moto_atomic.py makes it atomic, as S3 is.)"""
    for key in (f"race/key-{n}" for n in range(100)):
        assert sorted(_race(store, key, 8)) == [False] * 7 + [True], key
        stored = store.get(key)
        assert len(stored) == 1000 and len(set(stored)) == 1


def test_a_store_pickles_as_its_url(store: ObjectStore) -> None:
    store.put_if_absent("p/k", b"v")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.url == store.url
    assert copy.get("p/k") == b"v"


def test_file_put_leaves_no_temporary_files_and_ignores_leftovers(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}/tier")
    store.check()
    store.put_if_absent("t/0/k", b"v")
    store.put_if_absent("t/0/k", b"w")
    assert sorted(p.name for p in (tmp_path / "tier/t/0").iterdir()) == ["k"]
    (tmp_path / "tier/t/0/~tmp-k-crashed").write_bytes(b"torn")  # a crash mid-put
    assert store.list("t/") == ["t/0/k"]


@pytest.mark.parametrize(
    "url, reason",
    [
        ("", "non-empty"),
        ("http://example.com/x", "unsupported tier URL"),
        ("file://relative/path", "absolute path"),
        ("s3://", "expected s3://bucket"),
        ("gs://bucket/x", "unsupported tier URL"),
    ],
)
def test_bad_urls_are_refused_naming_them(url: str, reason: str) -> None:
    with pytest.raises(ObjectStoreError, match=reason) as refused:
        ObjectStore.from_url(url)
    assert not refused.value.retriable


def test_file_check_refuses_a_missing_parent_directory(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/not-mounted/tier"
    with pytest.raises(ObjectStoreError, match=str(tmp_path)):
        ObjectStore.from_url(url).check()


def test_s3_check_refuses_a_missing_bucket_naming_the_url(s3_env: S3Server) -> None:
    store = ObjectStore.from_url("s3://no-such-bucket-here/prefix")
    with pytest.raises(ObjectStoreError, match="s3://no-such-bucket-here/prefix") as refused:
        store.check()
    assert refused.value.reason == "no such bucket"


def test_s3_with_nothing_listening_is_unavailable(monkeypatch: pytest.MonkeyPatch, s3_env: S3Server) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    store = ObjectStore.from_url("s3://bucket/prefix")
    with pytest.raises(ObjectStoreUnavailable, match="s3://bucket/prefix") as unavailable:
        store.check()
    assert unavailable.value.retriable
    with pytest.raises(ObjectStoreUnavailable):
        store.put_if_absent("k", b"v")
