"""Compaction of ``cleanup=compact`` topics into Delta tables, against a reference model (a dict:
the last value per key, tombstones delete); ``robustmq compact`` SIGKILLed and restarted while
``table-maintenance`` runs next to it; the MERGE's replay and delete rules on their own."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import robustmq
from robustmq.streaming_jobs._compaction import (
    COMPACT_SCHEMA,
    TASK_BYTES,
    CompactMerger,
    latest_per_key,
    prepare_compact_table,
    table_description,
    table_layout,
)
from robustmq.streaming_jobs._table import TableLocation, open_table, prepare_table
from robustmq.streaming_jobs.errors import TableMismatch
from robustmq.streaming_jobs.table_maintenance import maintain
from tests.e2e._procs import ROOT

ROBUSTMQ = [sys.executable, "-m", "robustmq.cli"]
Model = dict[bytes, bytes]


def _rows(records: list[tuple[int, int, bytes, bytes | None]], topic: str = "t") -> pa.Table:
    """Source-shaped rows from (partition, offset, key, value) tuples."""
    n = len(records)
    return pa.table(
        {
            "key": pa.array([r[2] for r in records], pa.binary()),
            "value": pa.array([r[3] for r in records], pa.binary()),
            "topic": pa.array([topic] * n),
            "partition": pa.array([r[0] for r in records], pa.int32()),
            "offset": pa.array([r[1] for r in records], pa.int64()),
            "timestamp": pa.array(np.full(n, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")),
            "tags": pa.nulls(n, COMPACT_SCHEMA.field("tags").type),
            "headers": pa.nulls(n, COMPACT_SCHEMA.field("headers").type),
        }
    )


def _table_state(path: str, storage_options: dict[str, str] | None = None) -> Model:
    table = open_table(TableLocation.parse(path), storage_options).to_pyarrow_table(columns=["key", "value"])
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    assert len(set(keys)) == len(keys), "a key is in the table twice"
    return dict(zip(keys, values, strict=True))


def _apply(model: Model, records: list[tuple[int, int, bytes, bytes | None]]) -> None:
    for _, _, key, value in sorted(records, key=lambda r: (r[1], r[0])):
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value


def test_the_docs_list_the_options_as_help_does() -> None:
    import re

    from robustmq.streaming_jobs.compact_to_delta import compact_options_table

    match = re.search(
        r"<!-- generated: compact-options -->\n(.*?)\n<!-- end: compact-options -->",
        (ROOT / "docs" / "spark.md").read_text(),
        re.DOTALL,
    )
    assert match and match.group(1) == compact_options_table(), compact_options_table()


def test_latest_per_key_is_the_model_of_a_seeded_history() -> None:
    rng = random.Random(7)
    records = []
    ends = [0, 0, 0]
    for _ in range(5000):
        key = b"k%d" % rng.randrange(300)
        partition = hash(key) % 3
        value = None if rng.random() < 0.2 else b"v%d" % rng.randrange(10**6)
        records.append((partition, ends[partition], key, value))
        ends[partition] += 1
    rng.shuffle(records)  # the reduction does not depend on the rows' order
    latest = latest_per_key(_rows(records))
    expected: dict[bytes, tuple[int, bytes | None]] = {}
    for _, offset, key, value in records:
        if key not in expected or offset > expected[key][0]:
            expected[key] = (offset, value)
    offsets_values = zip(latest.column("offset").to_pylist(), latest.column("value").to_pylist(), strict=True)
    got = dict(zip(latest.column("key").to_pylist(), offsets_values, strict=True))
    assert got == expected


def test_replays_change_nothing_and_a_delete_is_not_undone_by_an_older_insert(tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    prepare_compact_table(path, topic="t", incarnation=1)
    merger = CompactMerger(path, topic="t", incarnation=1)
    insert = [(0, 0, b"a", b"a0"), (0, 1, b"k", b"k1"), (1, 0, b"b", b"b0")]
    delete = [(0, 2, b"k", None), (0, 3, b"a", b"a3"), (1, 1, b"c", None)]
    assert merger.merge_rows(_rows(insert), 0, query_id="q").version == 1
    assert merger.merge_rows(_rows(delete), 1, query_id="q").version == 2
    assert _table_state(path) == {b"a": b"a3", b"b": b"b0"}
    # The insert of k at offset 1 replayed after its delete at offset 2 (a restart from an old
    # checkpoint): below the partition's end in the table, it never reaches the MERGE.
    for replay in (insert, delete, insert + delete):
        result = merger.merge_rows(_rows(replay), 0, query_id="q")
        assert result.version is None and result.fresh == 0
    assert _table_state(path) == {b"a": b"a3", b"b": b"b0"}
    # A batch overlapping the table's end merges only what is new.
    overlap = [*delete, (0, 4, b"k", b"k4"), (1, 2, b"b", None)]
    result = merger.merge_rows(_rows(overlap), 2, query_id="q")
    assert (result.fresh, result.version) == (2, 3)
    assert _table_state(path) == {b"a": b"a3", b"k": b"k4"}
    table = open_table(TableLocation.parse(path), None)
    assert table.transaction_version("robustmq-compact/t/0") == 5
    assert table.transaction_version("robustmq-compact/t/1") == 3
    assert table.transaction_version("q") == 2
    # Even without the ends (a merger of another topic's name has none here), an older record never
    # replaces or deletes a newer one.
    guard = CompactMerger(path, topic="u", incarnation=1)
    result = guard.merge_rows(_rows([(0, 3, b"a", b"older"), (0, 0, b"k", None)], topic="u"), 0)
    assert result.metrics["stale"] == 2 and result.metrics["files_added"] == 0
    assert _table_state(path) == {b"a": b"a3", b"k": b"k4"}


def test_a_table_of_another_topic_incarnation_or_shape_is_refused(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "table")
    prepare_compact_table(path, topic="t", incarnation=1)
    with pytest.raises(TableMismatch, match="holds topic t, not u"):
        prepare_compact_table(path, topic="u", incarnation=1)
    with pytest.raises(TableMismatch, match="created again"):
        prepare_compact_table(path, topic="t", incarnation=2)
    other = str(tmp_path / "other")
    write_deltalake(other, pa.table({"key": pa.array([b"x"]), "n": pa.array([1])}))
    with pytest.raises(TableMismatch, match="column 'value' is missing"):
        prepare_compact_table(other, topic="t", incarnation=1)


def test_an_s3_table_on_the_s3_api_server(s3_server: Any) -> None:  # type: ignore[no-untyped-def]
    bucket = f"b{uuid.uuid4().hex[:8]}"
    s3_server.boto3_client().create_bucket(Bucket=bucket)
    path, options = f"s3://{bucket}/tables/compacted", s3_server.storage_options
    prepare_compact_table(path, topic="t", incarnation=1, buckets=1, storage_options=options)
    merger = CompactMerger(path, topic="t", incarnation=1, storage_options=options)
    merger.merge_rows(_rows([(0, 0, b"a", b"1"), (0, 1, b"b", b"2")]), 0)
    merger.merge_rows(_rows([(0, 2, b"a", None), (0, 3, b"b", b"3")]), 1)
    assert merger.merge_rows(_rows([(0, 0, b"a", b"1")]), 0).version is None
    assert _table_state(path, options) == {b"b": b"3"}
    for batch in range(2, 5):  # new keys only: each MERGE adds a file
        merger.merge_rows(_rows([(0, 2 + batch, b"n%d" % batch, b"x")]), batch)
    done = maintain(path, storage_options=options)
    assert done.files_removed >= 2 and done.files_added == 1
    assert _table_state(path, options) == {b"b": b"3", b"n2": b"x", b"n3": b"x", b"n4": b"x"}


def _history(
    rng: random.Random, count: int, keys: int, ends: list[int]
) -> list[tuple[int, int, bytes, bytes | None]]:
    """``count`` records of a compact topic of ``len(ends)`` partitions: a key hashes to one
    partition, offsets follow ``ends``; one in five is a tombstone."""
    records = []
    for _ in range(count):
        key = b"k%d" % rng.randrange(keys)
        partition = zlib.crc32(key) % len(ends)
        value = None if rng.random() < 0.2 else b"v%d" % rng.randrange(10**6)
        records.append((partition, ends[partition], key, value))
        ends[partition] += 1
    return records


def _files(path: Path) -> dict[str, list[bytes]]:
    """The keys of each file of the table's current version, by the file's path."""
    table = open_table(TableLocation.parse(str(path)), None)
    return {
        file: pq.read_table(path / file, columns=["key"]).column("key").to_pylist()
        for file in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    }


def test_merges_by_bucket_equal_the_model_and_each_key_stays_in_its_bucket(tmp_path: Path) -> None:
    """A seeded history merged batch by batch, with replays of earlier records mixed in, through
    tiny stage buffers and files (many staged files and output files per bucket)."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    path = tmp_path / "table"
    prepare_compact_table(str(path), topic="t", incarnation=1, buckets=4)
    merger = CompactMerger(str(path), topic="t", incarnation=1, stage_bytes=2_000, file_bytes=3_000)
    model: Model = {}
    ends = [0, 0, 0]
    sent: list[tuple[int, int, bytes, bytes | None]] = []
    for batch in range(12):
        records = _history(rng, rng.randrange(1, 400), 150, ends)
        _apply(model, records)
        replayed = rng.sample(sent, min(len(sent), rng.randrange(0, 100)))
        sent += records
        result = merger.merge_rows(_rows(records + replayed), batch, query_id="q")
        assert result.fresh == len(records)
        assert _table_state(str(path)) == model, f"batch {batch}"
    table = open_table(TableLocation.parse(str(path)), None)
    assert list(table.metadata().partition_columns) == ["bucket"]
    assert json.loads(table.metadata().description)["robustmq.compact"]["buckets"] == 4
    for file, keys in _files(path).items():
        bucket = int(file.split("/")[0].removeprefix("bucket="))
        assert {zlib.crc32(key) % 4 for key in keys} == {bucket}, file
    assert [table.transaction_version(f"robustmq-compact/t/{p}") for p in range(3)] == ends
    assert not (path / "_robustmq_staging").exists() or not any((path / "_robustmq_staging").iterdir())


def test_a_table_of_an_earlier_version_is_merged_as_one_bucket(tmp_path: Path) -> None:
    """Tables written before buckets existed are not partitioned and name no bucket count: the job
    goes on writing them as they are."""
    path = str(tmp_path / "table")
    prepare_table(path, COMPACT_SCHEMA, [], description=table_description("t", 1))
    location = prepare_compact_table(path, topic="t", incarnation=1)
    merger = CompactMerger(path, topic="t", incarnation=1)
    merger.merge_rows(_rows([(0, 0, b"a", b"1"), (1, 0, b"b", b"2")]), 0)
    merger.merge_rows(_rows([(0, 1, b"a", None), (1, 1, b"c", b"3")]), 1)
    assert _table_state(path) == {b"b": b"2", b"c": b"3"}
    table = open_table(location, None)
    assert list(table.metadata().partition_columns) == [] and table_layout(table).buckets == 1
    assert all("/" not in file for file in _files(tmp_path / "table"))
    with pytest.raises(TableMismatch, match="has 1 key buckets, not 8"):
        prepare_compact_table(path, topic="t", incarnation=1, buckets=8)


def test_a_commit_that_conflicts_with_an_optimize_is_merged_again(tmp_path: Path) -> None:
    """OPTIMIZE commits between the buckets' merge and the batch's commit, rewriting the files the
    merge replaced: delta-rs refuses the commit, the buckets are merged again from the new version,
    and the first attempt's files are deleted."""
    path = str(tmp_path / "table")
    prepare_compact_table(path, topic="t", incarnation=1, buckets=2)
    merger = CompactMerger(path, topic="t", incarnation=1)
    model: Model = {}
    for batch in range(3):  # several files per bucket, for OPTIMIZE to compact
        records = [(0, batch * 10 + i, b"k%d" % (batch * 10 + i), b"x") for i in range(10)]
        merger.merge_rows(_rows(records), batch)
        _apply(model, records)

    class OptimizedMeanwhile(CompactMerger):
        optimized = 0

        def _commit(self, table: Any, layout: Any, results: Any, transactions: Any) -> None:
            if not self.optimized:
                self.optimized = maintain(path, retain_hours=1).files_removed
            super()._commit(table, layout, results, transactions)

    racing = OptimizedMeanwhile(path, topic="t", incarnation=1)
    update = [(0, 30 + i, b"k%d" % i, b"y") for i in range(0, 30, 3)]
    result = racing.merge_rows(_rows(update), 3)
    _apply(model, update)
    assert racing.optimized and result.metrics["attempts"] == 2
    assert _table_state(path) == model
    referenced = set(_files(tmp_path / "table"))
    on_disk = {
        str(p.relative_to(tmp_path / "table")) for p in (tmp_path / "table").glob("bucket=*/*.parquet")
    }
    written_after_optimize = {f for f in on_disk - referenced if "-0000000003-" in f}
    assert not written_after_optimize, "the refused attempt's files were left behind"


def test_staging_files_of_crashed_batches_are_swept_at_start(tmp_path: Path) -> None:
    path = tmp_path / "table"
    prepare_compact_table(str(path), topic="t", incarnation=1)
    hour_ms = 3_600_000
    now_ms = int(time.time() * 1000)
    old, young = (
        path / f"_robustmq_staging/{now_ms - 3 * hour_ms}-7-a",
        path / f"_robustmq_staging/{now_ms}-8-b",
    )
    for directory in (old, young):
        directory.mkdir(parents=True)
        (directory / "x.parquet").write_bytes(b"x")
    prepare_compact_table(str(path), topic="t", incarnation=1, orphan_retention_hours=2)
    assert not old.exists() and young.exists()


def test_the_delta_log_is_checkpointed_as_batches_commit(tmp_path: Path) -> None:
    """Every batch's tasks load the table's snapshot: without checkpoints that replays a log
    growing with every batch (before, the job never wrote one)."""
    path = tmp_path / "table"
    prepare_compact_table(str(path), topic="t", incarnation=1, buckets=2)
    merger = CompactMerger(str(path), topic="t", incarnation=1, checkpoint_every=3)
    for batch in range(7):
        merger.merge_rows(_rows([(0, batch, b"k%d" % (batch % 3), b"v%d" % batch)]), batch)
    found = (path / "_delta_log").glob("*.checkpoint.parquet")
    checkpoints = sorted(int(p.name.split(".")[0]) for p in found)
    assert checkpoints == [3, 6]
    assert _table_state(str(path)) == {b"k0": b"v6", b"k1": b"v4", b"k2": b"v5"}


@pytest.mark.spark
def test_merge_frame_merges_in_spark_tasks_spread_by_a_shuffle_or_in_one(spark: Any, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "table")
    prepare_compact_table(path, topic="t", incarnation=1, buckets=3)
    merger = CompactMerger(path, topic="t", incarnation=1, stage_bytes=4_000)
    merger.warm_up(spark)  # runs both shapes of the job over rows that merge nothing
    assert open_table(TableLocation.parse(path), None).version() == 0
    model: Model = {}
    ends = [0, 0]
    rng = random.Random(3)
    # The first batch is spread over the 2 cores (nothing says how large it is); the next one, as
    # small as it was, goes to one task with no shuffle.
    for batch, tasks in enumerate([2, 1]):
        assert merger.merge_tasks(3, 2) == tasks
        records = _history(rng, 2000, 300, ends)
        _apply(model, records)
        frame = spark.createDataFrame(_with_tags_and_headers(_rows(records))).repartition(3)
        result = merger.merge_frame(frame, batch, query_id="q")
        assert (result.records, result.fresh) == (2000, 2000)
        assert result.metrics["buckets"] == 3
        assert _table_state(path) == model
    for hint, tasks in ((1, 1), (TASK_BYTES + 1, 2), (10 * TASK_BYTES, 3)):  # a task per TASK_BYTES
        hinted = CompactMerger(path, topic="t", incarnation=1, expected_batch_bytes=hint)
        assert hinted.merge_tasks(3, 8) == tasks
    # tags and headers cross from the JVM as JSON text: they come back as they were sent
    stored = open_table(TableLocation.parse(path), None).to_pyarrow_dataset().to_table(use_threads=False)
    expected = _with_tags_and_headers(stored.select(["offset"]).append_column("key", stored.column("key")))
    assert stored.column("tags").to_pylist() == expected.column("tags").to_pylist()
    assert stored.column("headers").to_pylist() == expected.column("headers").to_pylist()


def _with_tags_and_headers(rows: pa.Table) -> pa.Table:
    """Tags and headers made from each row's offset: null, empty or a few (with nulls inside)."""
    tags: list[Any] = []
    headers: list[Any] = []
    for offset in rows.column("offset").to_pylist():
        shape = offset % 4
        tags.append(None if shape == 0 else [] if shape == 1 else [f"t{offset}", None, 'q"\u00e9'])
        headers.append(
            None
            if shape == 1
            else []
            if shape == 2
            else [{"key": "h", "value": b"\x00\xff%d" % offset}, {"key": "n", "value": None}]
        )
    for name, values in (("tags", tags), ("headers", headers)):
        column = pa.array(values, COMPACT_SCHEMA.field(name).type)
        if name in rows.column_names:
            rows = rows.set_column(rows.schema.get_field_index(name), name, column)
        else:
            rows = rows.append_column(name, column)
    return rows


# -- the job as a user runs it -------------------------------------------------------------------


def _produce_round(
    client: robustmq.Client, topic: str, model: Model, rng: random.Random, count: int, new_keys: int = 0
) -> None:
    """``count`` updates and deletes of 2,000 keys, then ``new_keys`` inserts of keys never seen (their
    MERGEs match nothing and add a file each, which gives OPTIMIZE work), applied to ``model`` as
    sent (a key goes to one partition, in order)."""
    with client.producer() as producer:
        futures = []
        for i in range(count + new_keys):
            if i < count:
                key = b"user-%04d" % rng.randrange(2_000)
                value = None if rng.random() < 0.25 else b"profile-%d" % rng.randrange(10**9)
            else:
                key, value = b"new-%s" % uuid.uuid4().hex.encode(), b"fresh"
            futures.append(producer.send(topic, value, key=key))
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        for future in futures:
            future.result(60)


def _versions(table: Path) -> int:
    return len(list((table / "_delta_log").glob("*.json")))


def _kill_after_a_commit(job: list[str], table: Path, log_path: Path) -> None:
    """Run ``job`` until it committed one more table version, then SIGKILL it (and its JVM)."""
    before = _versions(table) if table.exists() else 0
    with open(log_path, "a") as log:
        child = subprocess.Popen(job, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while (_versions(table) if table.exists() else 0) <= before:
            assert child.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job committed nothing within 180 s"
            time.sleep(0.05)
        time.sleep(random.uniform(0, 0.5))  # sometimes mid-MERGE of the next batch
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


@pytest.mark.spark
@pytest.mark.e2e
@pytest.mark.slow
# Four job processes, each starting a JVM, three SIGKILLs with OPTIMIZE/VACUUM running: 3.5 minutes,
# the longest test of the suite; a long fault-injection run, so `make test-long` runs it (`make
# test` keeps the replayed, re-checkpointed and concurrent-OPTIMIZE compaction tests).
@pytest.mark.long
def test_sigkilled_and_restarted_job_with_maintenance_running_equals_the_model(
    cluster: Any, client: robustmq.Client, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed} (rerun: replace randrange with this value)")
    rng = random.Random(seed)
    topic = f"profiles-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2, cleanup_policy="compact")
    table = tmp_path / "table"
    job = [*ROBUSTMQ, "compact", "--meta", cluster.meta_address, "--topic", topic, "--table", str(table)]
    job += [
        "--checkpoint",
        str(tmp_path / "ck"),
        "--trigger-seconds",
        "0",
        "--max-records-per-trigger",
        "300",
    ]
    model: Model = {}
    log_path = tmp_path / "job.log"
    stop = threading.Event()
    optimized: list[int] = []
    failures: list[BaseException] = []

    def maintenance() -> None:  # OPTIMIZE + VACUUM in a loop while the jobs commit
        while not stop.wait(0.5):
            if not (table / "_delta_log").exists():
                continue
            try:
                optimized.append(maintain(str(table), retain_hours=1).files_removed)
            except BaseException as error:  # reported below
                failures.append(error)
                return

    maintainer = threading.Thread(target=maintenance, daemon=True)
    maintainer.start()
    try:
        for round_ in range(3):
            _produce_round(client, topic, model, rng, 1500, new_keys=900)
            _kill_after_a_commit(job, table, log_path)
            print(f"round {round_} at {time.monotonic():.0f}: {_versions(table)} versions, {len(model)} keys")
        _produce_round(client, topic, model, rng, 1000)
        final = subprocess.run([*job, "--once"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr[-3000:]
        # On stdout: ready, a line per micro-batch, and the whole run's (logs go to stderr).
        assert final.stdout.startswith("ready\n") and "batch " in final.stdout, final.stdout
        assert re.search(r"^[\d,]+ records? merged into .+; it is at Delta version \d+$", final.stdout, re.M)
    finally:
        stop.set()
        maintainer.join(timeout=120)
    assert not failures, repr(failures)
    assert any(optimized), "table-maintenance never compacted files while the jobs ran"
    assert _table_state(str(table)) == model
    done = maintain(str(table), retain_hours=0, allow_short_retention=True)  # nothing runs now
    assert done.vacuumed, "nothing left to vacuum after OPTIMIZE rewrote the files"
    assert _table_state(str(table)) == model  # readable, the same rows


# -- a backlog larger than the driver's memory ---------------------------------------------------

VALUE_BYTES = 64 * 1024


def _numbered_value(number: int) -> bytes:
    """64 KiB, unique to ``number`` (its first 16 bytes), compressible: light on disk, full size
    in memory."""
    return b"%016d" % number * (VALUE_BYTES // 16)


@pytest.mark.spark
@pytest.mark.e2e
def test_a_backlog_four_times_the_driver_memory_compacts(
    cluster: Any, client: robustmq.Client, tmp_path: Path
) -> None:
    """``robustmq compact --once`` over a 720 MB backlog (11,000 records of 64 KiB, 4,000 keys,
    one in ten updates a tombstone) with a driver of a 512 MiB JVM heap and a Python process
    that may grow by 160 MiB (``_memory_limited_job.py`` says how it is held to that). The
    table (about 240 MB) equals the model, and the default per-trigger byte bound cut the
    backlog into several micro-batches.

    Before, ``foreachBatch`` pulled the whole backlog to the driver (``toArrow()``) and MERGEd
    it there: the job was stopped for its memory."""
    topic = f"big-{uuid.uuid4().hex[:6]}"
    client.create_topic(topic, 2, cleanup_policy="compact")
    rng = random.Random(11)
    model: dict[bytes, int] = {}
    number = 0
    with client.producer() as producer:
        futures = []
        for _ in range(44):
            keys, values = [], []
            for _ in range(250):
                key = b"key-%05d" % rng.randrange(4000)
                number += 1
                tombstone = rng.random() < 0.1
                keys.append(key)
                values.append(None if tombstone else _numbered_value(number))
                if tombstone:
                    model.pop(key, None)
                else:
                    model[key] = number
            futures.append(
                producer.send_batch(
                    topic,
                    pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}),
                )
            )
        for future in futures:
            future.result(120)
    table, checkpoint = tmp_path / "table", tmp_path / "ck"
    job = [sys.executable, str(Path(__file__).with_name("_memory_limited_job.py"))]
    job += ["--jvm-heap", "512m", "--growth-mib", "160", "--"]
    job += ["--meta", cluster.meta_address, "--topic", topic, "--table", str(table)]
    job += ["--checkpoint", str(checkpoint), "--once"]
    with open(tmp_path / "job.log", "w") as log:
        child = subprocess.Popen(
            job, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
        try:
            out, _ = child.communicate(timeout=240)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
    report = [line for line in out.splitlines() if line.startswith("{")]
    assert child.returncode == 0, f"{report} {(tmp_path / 'job.log').read_text()[-3000:]}"
    print(report[-1])
    found: dict[bytes, int] = {}
    dataset = open_table(TableLocation.parse(str(table)), None).to_pyarrow_dataset()
    for batch in dataset.to_batches(columns=["key", "value"], batch_size=1000, use_threads=False):
        for key, value in zip(
            batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=True
        ):
            assert key not in found, f"key {key!r} is in the table twice"
            assert value is not None and len(value) == VALUE_BYTES
            found[key] = int(value[:16])
    assert found == model
    batches = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    assert len(batches) >= 3, "the backlog was compacted in fewer than three micro-batches"
