"""The appender's decisions without Spark: merging a batch's ranges, app ids, the records task."""

from __future__ import annotations

from pathlib import Path

import pytest

from robustmq.streaming_jobs import TABLE_SCHEMA, partition_app_id, prepare_table
from robustmq.streaming_jobs._delta import _app_ids, _merge_pieces, _Piece, _write_records

IDENTITY = (("created_ms", 1_763_800_000_000), ("incarnation", 1_763_800_000_003))


def test_pieces_of_a_partition_merge_into_one_range() -> None:
    """The source cuts a partition's range into pieces of maxRecordsPerPartition: the table's end is
    compared with the whole range once, not with each piece."""
    pieces = [
        _Piece("t", 0, 1010, 2010, IDENTITY),
        _Piece("t", 0, 10, 1010, IDENTITY, from_beginning=True),
        _Piece("t", 1, 5, 5, IDENTITY),  # empty
        _Piece("t", 0, 2010, 2510, IDENTITY),
        _Piece("u", 0, 0, 7),
    ]
    assert sorted(_merge_pieces(pieces), key=lambda p: p.topic) == [
        _Piece("t", 0, 10, 2510, IDENTITY, from_beginning=True),
        _Piece("u", 0, 0, 7),
    ]


def test_pieces_with_a_gap_are_refused() -> None:
    with pytest.raises(AssertionError, match="not contiguous"):
        _merge_pieces([_Piece("t", 0, 0, 10, IDENTITY), _Piece("t", 0, 20, 30, IDENTITY)])


def test_app_ids_name_the_incarnation_and_read_the_created_ms_form_of_older_tables() -> None:
    assert _app_ids("t", 3, IDENTITY) == (
        partition_app_id("t", 3, 1_763_800_000_003),
        "robustmq/t/3@1763800000000",
    )
    assert partition_app_id("t", 3, 1_763_800_000_003) == "robustmq/t/3@incarnation=1763800000003"
    # A topic created before the Meta Service handed out incarnations has only its creation time.
    assert _app_ids("t", 3, (("created_ms", 5),)) == ("robustmq/t/3@5", None)


def test_records_task_of_an_empty_spark_partition_writes_nothing(tmp_path: Path) -> None:
    """mapInArrow calls the function with no batches for an empty partition."""
    location = prepare_table(str(tmp_path / "t"), TABLE_SCHEMA, ["date"])
    write = _write_records(location.uri, None, {("t", 0): 0}, "p")
    assert list(write(iter([]))) == []
