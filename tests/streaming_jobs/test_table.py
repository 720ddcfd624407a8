"""The job's Delta table without Spark: locations, shape checks, and the append log's commits."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from robustmq.streaming_jobs import TABLE_SCHEMA, TableConflict, TableLocation, TableMismatch, prepare_table
from robustmq.streaming_jobs._table import CHECKPOINT_EVERY, AppendLog, WrittenFile, table_filesystem


def _log(location: TableLocation, storage_options: dict[str, str] | None = None) -> AppendLog:
    return AppendLog(location, TABLE_SCHEMA, ["date"], storage_options=storage_options)


def _file(
    location: TableLocation, storage_options: dict[str, str] | None = None, offset: int = 0
) -> WrittenFile:
    """A real one-row Parquet file in the table, written the way tasks write them."""
    rows = pa.table(
        {
            "topic": ["t"],
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([offset], pa.int64()),
            "key": pa.array([None], pa.binary()),
            "value": pa.array([b"v"], pa.binary()),
            "timestamp": pa.array([0], pa.timestamp("us", tz="UTC")),
            "tags": pa.array([None], TABLE_SCHEMA.field("tags").type),
            "headers": pa.array([None], TABLE_SCHEMA.field("headers").type),
        }
    )
    relative = f"date=1970-01-01/part-{uuid.uuid4().hex}.parquet"
    with table_filesystem(location.uri, storage_options).open_output_stream(relative) as out:
        pq.write_table(rows, out)
        size = out.tell()
    return WrittenFile(relative, size, "1970-01-01", 1, offset, offset)


def _offsets(location: TableLocation, storage_options: dict[str, str] | None = None) -> list[int]:
    table = DeltaTable(location.uri, storage_options=storage_options)
    return sorted(
        table.to_pyarrow_dataset().to_table(columns=["offset"], use_threads=False)["offset"].to_pylist()
    )


def test_locations_name_one_table_however_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spellings = ["cp", "./cp", "cp/", str(tmp_path / "cp"), (tmp_path / "cp").as_uri()]
    assert {TableLocation.parse(s).local_dir for s in spellings} == {tmp_path / "cp"}
    s3 = TableLocation.parse("s3://bucket/tables/orders/")
    assert (s3.uri, s3.bucket, s3.prefix, s3.local_dir) == (
        "s3://bucket/tables/orders",
        "bucket",
        "tables/orders",
        None,
    )
    assert TableLocation.parse("gs://b/t/").uri == "gs://b/t"


def test_concurrent_writers_append_blindly_but_never_share_a_partition(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    first, second = _log(location), _log(location)
    start = first.version
    assert first.commit([_file(location, offset=0)], {"p0": 1}) == start + 1
    # The second log is one version behind: it reads the first's commit, which is blind for it.
    assert second.commit([_file(location, offset=100)], {"p1": 101}) == start + 2
    assert second.end_offset("p0") == 1
    with pytest.raises(TableConflict, match="same topic partitions"):
        first.commit([_file(location, offset=200)], {"p1": 201})
    table = DeltaTable(location.uri)
    assert (table.version(), table.transaction_version("p0"), table.transaction_version("p1")) == (
        start + 2,
        1,
        101,
    )
    assert _offsets(location) == [0, 100]


def test_a_metadata_change_under_the_writer_is_a_conflict(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = _log(location)
    DeltaTable(location.uri).alter.set_table_description("changed by someone else")
    with pytest.raises(TableConflict, match="metadata"):
        writer.commit([_file(location)], {"p0": 1})


def test_the_log_checkpoints_every_so_many_versions(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = _log(location)
    commits = CHECKPOINT_EVERY - writer.version
    for offset in range(commits):
        writer.commit([], {"p0": offset + 1})
    last = json.loads((tmp_path / "t" / "_delta_log" / "_last_checkpoint").read_text())
    assert last["version"] == CHECKPOINT_EVERY
    assert DeltaTable(location.uri).transaction_version("p0") == writer.end_offset("p0") == commits


@pytest.mark.parametrize("direct", [True, False])
def test_s3_tables_commit_directly_or_through_delta_rs(s3_server, direct: bool) -> None:  # type: ignore[no-untyped-def]
    bucket = f"b{uuid.uuid4().hex[:8]}"
    s3_server.boto3_client().create_bucket(Bucket=bucket)
    options = dict(s3_server.storage_options)
    if not direct:
        options["timeout"] = "60s"  # an object_store option boto3 has no name for: delta-rs commits
    location = prepare_table(f"s3://{bucket}/t", TABLE_SCHEMA, ["date"], storage_options=options)
    first, second = _log(location, options), _log(location, options)
    assert (first._objects is not None) == direct
    first.commit([_file(location, options, offset=0)], {"p0": 1})
    second.commit([_file(location, options, offset=1)], {"p1": 2})
    table = DeltaTable(location.uri, storage_options=options)
    assert (table.transaction_version("p0"), table.transaction_version("p1")) == (1, 2)
    assert _offsets(location, options) == [0, 1]


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


def test_orphans_are_vacuumed_only_past_the_retention(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    kept = _file(location)
    _log(location).commit([kept], {"p0": 1})
    day = tmp_path / "t" / "date=1970-01-01"
    old, young = day / "part-old.parquet", day / "part-young.parquet"
    old.write_bytes(b"x")
    young.write_bytes(b"x")
    os.utime(old, (0, 0))
    os.utime(day / Path(kept.path).name, (0, 0))
    prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"], orphan_retention_hours=1)
    assert not old.exists() and young.exists() and (day / Path(kept.path).name).exists()
