"""The append log's commits without Spark: direct and through delta-rs, local and on a real S3 API
server, alone and against other writers, log cleanup, replaced tables and vanished files."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from robustmq.streaming_jobs import TABLE_SCHEMA, TableConflict, prepare_table
from robustmq.streaming_jobs._commit_log import _READ_COMMITS_MAX, CHECKPOINT_EVERY, LogTail, next_step
from tests.streaming_jobs._tables import append_log, table_offsets, write_file


def _bucket(s3_server) -> str:  # type: ignore[no-untyped-def]
    bucket = f"b{uuid.uuid4().hex[:8]}"
    s3_server.boto3_client().create_bucket(Bucket=bucket)
    return bucket


def test_next_step_takes_the_direct_path_only_in_the_simple_case() -> None:
    def tail(commits: tuple[int, ...] = (), *, base=True, truncated=False, checkpoint=None) -> LogTail:  # type: ignore[no-untyped-def]
        return LogTail(base, commits, truncated, checkpoint)

    assert next_step(7, tail()) == "commit"
    assert next_step(7, tail(checkpoint=7)) == "commit"
    assert next_step(7, tail((8, 9))) == "read"
    assert next_step(7, tail((8, 9), checkpoint=9)) == "read"
    assert next_step(7, tail((8, 9), truncated=True)) == "reload"  # too many to read one by one
    assert next_step(7, tail((9, 10))) == "reload"  # 8 was cleaned up
    assert next_step(7, tail(checkpoint=9)) == "reload"  # everything after 7 was cleaned up
    assert next_step(7, tail(base=False)) == "reload"  # 7 is gone: cleaned up, or another table


def test_concurrent_writers_append_blindly_but_never_share_a_partition(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    first, second = append_log(location), append_log(location)
    start = first.version
    assert first.commit([write_file(location, offset=0)], {"p0": 1}) == start + 1
    # The second log is one version behind: it reads the first's commit, which is blind for it.
    assert second.commit([write_file(location, offset=100)], {"p1": 101}) == start + 2
    assert second.end_offset("p0") == 1
    with pytest.raises(TableConflict, match="same topic partitions"):
        first.commit([write_file(location, offset=200)], {"p1": 201})
    table = DeltaTable(location.uri)
    assert (table.version(), table.transaction_version("p0"), table.transaction_version("p1")) == (
        start + 2,
        1,
        101,
    )
    assert table_offsets(location) == [0, 100]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_racing_writers_never_overwrite_each_others_commits(tmp_path: Path, request, where: str) -> None:  # type: ignore[no-untyped-def]
    options = None
    path = str(tmp_path / "t")
    if where == "s3":
        server = request.getfixturevalue("s3_server")
        options, path = server.storage_options, f"s3://{_bucket(server)}/t"
    location = prepare_table(path, TABLE_SCHEMA, ["date"], storage_options=options)
    count = 12
    files = {w: [write_file(location, options, offset=w * 100 + i) for i in range(count)] for w in range(3)}
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run(w: int) -> None:
        try:
            writer = append_log(location, options)
            barrier.wait(30)
            for i in range(count):
                writer.commit([files[w][i]], {f"p{w}": i + 1})
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    table = DeltaTable(location.uri, storage_options=options)
    assert [table.transaction_version(f"p{w}") for w in range(3)] == [count] * 3
    assert table_offsets(location, options) == sorted(w * 100 + i for w in range(3) for i in range(count))


def test_a_quiet_writer_commits_after_a_busy_writer_of_the_same_table(tmp_path: Path) -> None:
    """Jobs of different topics can share a table: a quiet one commits after 1,001 of a busy one's
    commits (more than it reads one by one: it catches up from the latest snapshot instead)."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    quiet, busy = append_log(location), append_log(location)
    for i in range(1001):
        busy.commit([], {"busy-topic/0": i + 1})
    assert _READ_COMMITS_MAX < 1001  # the quiet writer cannot read them one by one
    version = quiet.commit([write_file(location, offset=0)], {"quiet-topic/0": 1})
    table = DeltaTable(location.uri)
    assert (table.version(), table.transaction_version("quiet-topic/0")) == (version, 1)
    assert quiet.end_offset("busy-topic/0") == 1001
    stale = append_log(location)  # the busy partition's end it knows is about to be overtaken
    for i in range(_READ_COMMITS_MAX + 1):
        busy.commit([], {"busy-topic/0": 2000 + i})
    with pytest.raises(TableConflict, match="same topic partitions"):  # caught up, it still refuses
        stale.commit([], {"busy-topic/0": 1002})


def test_a_commit_after_log_cleanup_is_not_lost(tmp_path: Path) -> None:
    """A long-lived log whose known version's files were cleaned up (log retention) by another tool."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    DeltaTable(location.uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 second"})
    quiet, busy = append_log(location), append_log(location)
    for i in range(3):
        busy.commit([write_file(location, offset=100 + i)], {"busy": i + 1})
    table = DeltaTable(location.uri)
    table.create_checkpoint()
    time.sleep(1.5)
    table.cleanup_metadata()  # what delta-rs / delta-spark maintenance does after a checkpoint
    assert not (tmp_path / "t" / "_delta_log" / f"{quiet.version + 1:020d}.json").exists()
    version = quiet.commit([write_file(location, offset=0)], {"quiet": 1})
    table = DeltaTable(location.uri)
    assert (table.version(), table.transaction_version("quiet")) == (version, 1)
    assert table_offsets(location) == [0, 100, 101, 102]


def test_a_table_replaced_under_the_writer_is_a_conflict(tmp_path: Path) -> None:
    """A table dropped and created again at the same path: the log's versions mean nothing there."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = append_log(location)
    for i in range(3):
        writer.commit([write_file(location, offset=i)], {"p0": i + 1})
    shutil.rmtree(tmp_path / "t")
    prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    with pytest.raises(TableConflict, match="replaced"):
        writer.commit([write_file(location, offset=3)], {"p0": 4})
    assert DeltaTable(location.uri).version() == 0 and table_offsets(location) == []


def test_a_metadata_change_under_the_writer_is_a_conflict(tmp_path: Path) -> None:
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = append_log(location)
    DeltaTable(location.uri).alter.set_table_description("changed by someone else")
    with pytest.raises(TableConflict, match="metadata"):
        writer.commit([write_file(location)], {"p0": 1})


def test_a_commit_whose_files_are_gone_is_refused(tmp_path: Path) -> None:
    """A vacuum removed a slow batch's file: the commit must not reference a missing file."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = append_log(location)
    kept, vacuumed = write_file(location, offset=0), write_file(location, offset=1)
    (tmp_path / "t" / vacuumed.path).unlink()
    with pytest.raises(TableConflict, match="gone"):
        writer.commit([kept, vacuumed], {"p0": 2})
    assert DeltaTable(location.uri).version() == writer.version == 0


def test_the_log_checkpoints_every_so_many_versions_and_reads_back(tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    writer = append_log(location)
    commits = CHECKPOINT_EVERY + 2 - writer.version
    for offset in range(commits):
        writer.commit([write_file(location, offset=offset)], {"p0": offset + 1})
    last = (tmp_path / "t" / "_delta_log" / "_last_checkpoint").read_text()
    assert f'"version":{CHECKPOINT_EVERY}' in last.replace(" ", "")
    table = DeltaTable(location.uri)
    assert table.transaction_version("p0") == writer.end_offset("p0") == commits
    assert table_offsets(location) == list(range(commits))
    dataset = table.to_pyarrow_dataset()
    assert dataset.to_table(filter=ds.field("offset") == 7, use_threads=False).num_rows == 1


@pytest.mark.parametrize("direct", [True, False])
def test_s3_tables_commit_directly_or_through_delta_rs(s3_server, direct: bool) -> None:  # type: ignore[no-untyped-def]
    options = dict(s3_server.storage_options)
    if not direct:
        options["timeout"] = "60s"  # an object_store option boto3 has no name for: delta-rs commits
    location = prepare_table(f"s3://{_bucket(s3_server)}/t", TABLE_SCHEMA, ["date"], storage_options=options)
    first, second = append_log(location, options), append_log(location, options)
    assert (first._objects is not None) == direct
    first.commit([write_file(location, options, offset=0)], {"p0": 1})
    second.commit([write_file(location, options, offset=1)], {"p1": 2})
    table = DeltaTable(location.uri, storage_options=options)
    assert (table.transaction_version("p0"), table.transaction_version("p1")) == (1, 2)
    assert table_offsets(location, options) == [0, 1]


def test_s3_uri_with_a_percent_escape_commits_where_delta_rs_reads(s3_server) -> None:  # type: ignore[no-untyped-def]
    """delta-rs decodes %XX in an s3:// URI; the direct commit lands in the same _delta_log."""
    options = s3_server.storage_options
    bucket = _bucket(s3_server)
    location = prepare_table(f"s3://{bucket}/my%20table", TABLE_SCHEMA, ["date"], storage_options=options)
    writer = append_log(location, options)
    assert writer._objects is not None  # the direct (boto3) commit path
    version = writer.commit([write_file(location, options, offset=0)], {"p0": 1})
    table = DeltaTable(location.uri, storage_options=options)
    keys = sorted(o["Key"] for o in s3_server.boto3_client().list_objects_v2(Bucket=bucket)["Contents"])
    assert (table.version(), table.transaction_version("p0")) == (version, 1), keys
    assert all(k.startswith("my table/") for k in keys), keys
    assert table_offsets(location, options) == [0]


def test_delta_rs_commit_path_refuses_a_second_writer_of_a_partition(s3_server) -> None:  # type: ignore[no-untyped-def]
    options = {**s3_server.storage_options, "timeout": "60s"}  # a delta-rs-only option: delta-rs commits
    location = prepare_table(f"s3://{_bucket(s3_server)}/t", TABLE_SCHEMA, ["date"], storage_options=options)
    first, second = append_log(location, options), append_log(location, options)
    assert first._objects is None and second._objects is None
    # Both planned from the same snapshot: the partition is empty for both (e.g. a zombie driver).
    assert first.end_offset("p0") is None and second.end_offset("p0") is None
    first.commit([write_file(location, options, offset=0)], {"p0": 1})
    with pytest.raises(TableConflict, match="same topic partitions"):
        second.commit([write_file(location, options, offset=0)], {"p0": 1})
    assert table_offsets(location, options) == [0], "the same record is in the table twice"


@pytest.mark.parametrize(
    "option, direct",
    [
        ({"AWS_CONDITIONAL_PUT": "disabled"}, False),
        ({"aws_s3_locking_provider": "dynamodb"}, False),
        ({"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, False),
        ({"AWS_CONDITIONAL_PUT": "etag"}, True),
        ({"AWS_S3_ALLOW_UNSAFE_RENAME": "false"}, True),
    ],
)
def test_s3_options_naming_another_commit_protocol_commit_through_delta_rs(
    s3_server, option: dict[str, str], direct: bool
) -> None:  # type: ignore[no-untyped-def]
    """The direct commit is a conditional PUT (If-None-Match): any other commit protocol the user
    chose (no conditional put, a lock table, unsafe renames) is left to delta-rs."""
    location = prepare_table(
        f"s3://{_bucket(s3_server)}/t", TABLE_SCHEMA, ["date"], storage_options=s3_server.storage_options
    )
    writer = append_log(location, {**s3_server.storage_options, **option})
    assert (writer._objects is not None) == direct
