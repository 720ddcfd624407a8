"""The job's Delta table without Spark: locations, shape checks, orphans, file statistics."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from robustmq.errors import InvalidConfig
from robustmq.streaming_jobs import TABLE_SCHEMA, TableLocation, TableMismatch, prepare_table
from robustmq.streaming_jobs._table import MIN_ORPHAN_RETENTION_HOURS, WrittenFile
from tests.streaming_jobs._tables import append_log, table_offsets, write_file


def test_locations_name_one_table_however_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spellings = ["cp", "./cp", "cp/", str(tmp_path / "cp"), (tmp_path / "cp").as_uri()]
    locations = {TableLocation.parse(s) for s in spellings}
    assert locations == {TableLocation((tmp_path / "cp").as_uri(), local_dir=tmp_path / "cp")}
    s3 = TableLocation.parse("s3://bucket/tables/orders/")
    assert (s3.uri, s3.bucket, s3.prefix, s3.local_dir) == (
        "s3://bucket/tables/orders",
        "bucket",
        "tables/orders",
        None,
    )
    assert TableLocation.parse("gs://b/t/").uri == "gs://b/t"


def test_s3_prefixes_are_percent_decoded_as_delta_rs_decodes_them() -> None:
    location = TableLocation.parse("s3://bucket/my%20tables/a%25b/")
    assert (location.uri, location.prefix) == ("s3://bucket/my%20tables/a%25b", "my tables/a%b")


@pytest.mark.parametrize("name", ["50%", "p%20q", "br[1]", "a|b"])
def test_local_paths_delta_rs_cannot_use_are_refused(tmp_path: Path, name: str) -> None:
    """delta-rs decodes '%' in local paths (files land elsewhere) and panics on '[' or '|'."""
    with pytest.raises(InvalidConfig, match="delta-rs cannot use"):
        prepare_table(str(tmp_path / name / "t"), TABLE_SCHEMA, ["date"])
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize(
    "make, words",
    [
        (
            lambda p: DeltaTable.create(
                p, TABLE_SCHEMA.append(pa.field("extra", pa.string())), partition_by=["date"]
            ),
            "'extra'",
        ),
        (
            lambda p: DeltaTable.create(
                p, TABLE_SCHEMA.set(2, pa.field("offset", pa.int64(), False)), partition_by=["date"]
            ),
            "nullable",
        ),
        (lambda p: DeltaTable.create(p, TABLE_SCHEMA), "partitioned by []"),
        (
            lambda p: DeltaTable.create(p, TABLE_SCHEMA, partition_by=["date"]).alter.add_constraint(
                {"c": "offset >= 0"}
            ),
            "protocol",
        ),
    ],
)
def test_tables_of_another_shape_are_refused_naming_the_difference(tmp_path: Path, make, words: str) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "t")
    make(path)
    version = DeltaTable(path).version()
    with pytest.raises(TableMismatch, match=words.replace("[", r"\[").replace("]", r"\]")):
        prepare_table(path, TABLE_SCHEMA, ["date"])
    assert DeltaTable(path).version() == version


def test_prepare_names_the_table_by_its_id(tmp_path: Path) -> None:
    """A table dropped and rebuilt at the same path is another table (the job's group follows it)."""
    import shutil

    first = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    assert first.table_id == str(DeltaTable(first.uri).metadata().id)
    assert prepare_table(first.uri, TABLE_SCHEMA, ["date"]).table_id == first.table_id
    shutil.rmtree(tmp_path / "t")
    assert prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"]).table_id != first.table_id


def test_orphans_are_vacuumed_only_past_the_retention(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    kept = write_file(location)
    append_log(location).commit([kept], {"p0": 1})
    day = tmp_path / "t" / "date=1970-01-01"
    old, young = day / "part-old.parquet", day / "part-young.parquet"
    old.write_bytes(b"x")
    young.write_bytes(b"x")
    os.utime(old, (0, 0))
    os.utime(day / Path(kept.path).name, (0, 0))
    prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"], orphan_retention_hours=1)
    assert not old.exists() and young.exists() and (day / Path(kept.path).name).exists()


def test_a_starting_job_keeps_the_files_of_a_batch_in_flight(tmp_path: Path) -> None:
    """Jobs of different topics may share a table: one starting must not break another's commit."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    running = append_log(location)
    in_flight = write_file(location, offset=0)  # a task of the running job wrote it; the commit is pending
    with pytest.raises(InvalidConfig, match="below"):
        prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"], orphan_retention_hours=0)
    prepare_table(
        str(tmp_path / "t"), TABLE_SCHEMA, ["date"], orphan_retention_hours=MIN_ORPHAN_RETENTION_HOURS
    )
    running.commit([in_flight], {"p0": 1})
    assert table_offsets(location) == [0]


def test_add_actions_carry_the_files_sizes_and_statistics(s3_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Sizes are the objects' sizes; stats hold bounds and a null count per column (data skipping)."""
    bucket = f"b{uuid.uuid4().hex[:8]}"
    client = s3_server.boto3_client()
    client.create_bucket(Bucket=bucket)
    options = s3_server.storage_options
    remote = prepare_table(f"s3://{bucket}/t", TABLE_SCHEMA, ["date"], storage_options=options)
    written = write_file(remote, options)
    assert client.head_object(Bucket=bucket, Key=f"t/{written.path}")["ContentLength"] == written.size

    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    written = write_file(location, offset=5, keys=[b"k", None, None])
    assert (tmp_path / "t" / written.path).stat().st_size == written.size
    append_log(location).commit([written], {"p0": 8})
    commit = (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").read_text().splitlines()
    stats = json.loads(next(json.loads(line)["add"]["stats"] for line in commit if '"add"' in line))
    assert stats["numRecords"] == 3
    bounds = {"topic": "t", "partition": 0, "timestamp": "1970-01-01T00:00:00.000Z"}
    assert stats["minValues"] == {**bounds, "offset": 5}
    assert stats["maxValues"] == {**bounds, "offset": 7}
    assert stats["nullCount"] == {
        "topic": 0, "partition": 0, "offset": 0, "key": 2, "value": 0, "timestamp": 0, "tags": 3, "headers": 3
    }  # fmt: skip
    actions = pa.table(DeltaTable(location.uri).get_add_actions(flatten=True))
    assert actions.column("null_count.key").to_pylist() == [2]  # delta-rs reads them back


def test_time_filters_skip_files_of_one_date(tmp_path: Path) -> None:
    """Files of the same date hold their records' time bounds, so a filter on ``timestamp`` skips
    the files of the other hours (the ``date`` partition alone cannot). Bounds are milliseconds,
    the Delta convention: the minimum rounded down, the maximum up, so no file is skipped wrongly.

    Before, the files had no ``timestamp`` or ``topic`` bounds, and delta-rs's dataset read the
    missing bounds as null: a filter on either column skipped every file (an empty answer)."""
    import datetime as dt

    import pyarrow.compute as pc

    from robustmq.streaming_jobs._delta import _write_dated_files

    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    hour_us = 3_600_000_000
    morning = 1_767_225_600_000_000 + 8 * hour_us + 123_456  # 2026-01-01 08:00:00.123456 UTC
    files = []
    for first in (morning, morning + 10 * hour_us):  # 08:00 and 18:00 of the same date
        rows = pa.table(
            {
                "topic": ["t"] * 3,
                "partition": pa.array([0] * 3, pa.int32()),
                "offset": pa.array([first % 1000 + i for i in range(3)], pa.int64()),
                "key": pa.array([None] * 3, pa.binary()),
                "value": pa.array([b"v"] * 3, pa.binary()),
                "timestamp": pa.array([first, first + 1, first + hour_us - 1], pa.timestamp("us", tz="UTC")),
                "tags": pa.nulls(3, TABLE_SCHEMA.field("tags").type),
                "headers": pa.nulls(3, TABLE_SCHEMA.field("headers").type),
            }
        )
        files += [WrittenFile(**f) for f in _write_dated_files(rows, location.uri, None, f"p{first}")]
    append_log(location).commit(files, {"p0": 1})
    assert {f.date for f in files} == {"2026-01-01"}
    dataset = DeltaTable(location.uri).to_pyarrow_dataset()
    evening = pc.field("timestamp") >= pa.scalar(
        dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), pa.timestamp("us", tz="UTC")
    )
    assert len(list(dataset.get_fragments())) == 2
    assert len(list(dataset.get_fragments(filter=evening))) == 1
    assert dataset.to_table(filter=evening, use_threads=False).num_rows == 3
    last = pc.field("timestamp") == pa.scalar(morning + hour_us - 1, pa.timestamp("us", tz="UTC"))
    assert dataset.to_table(filter=last, use_threads=False).num_rows == 1  # the maximum is not cut off
    assert dataset.to_table(filter=pc.field("topic") == "t", use_threads=False).num_rows == 6
    stats = [json.loads(f.stats) for f in files]
    assert [s["minValues"]["timestamp"] for s in stats] == [
        "2026-01-01T08:00:00.123Z",
        "2026-01-01T18:00:00.123Z",
    ]
    assert [s["maxValues"]["timestamp"] for s in stats] == [
        "2026-01-01T09:00:00.124Z",
        "2026-01-01T19:00:00.124Z",
    ]
