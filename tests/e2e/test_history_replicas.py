"""Reading a replica's copy of a segment from segment files, as the replicated history runs do."""

from __future__ import annotations

from pathlib import Path

import robustmq
from robustmq._crc import crc32c
from robustmq._frame import encode_header
from robustmq._records import encode_batch
from tests.e2e._history_replicas import held_ranges, read_range, shard_dir


def _frame(base_offset: int, values: list[str], epoch: int = 0) -> bytes:
    payload = encode_batch(robustmq.build_records([value.encode() for value in values])).to_pybytes()
    header = encode_header(
        base_offset=base_offset,
        record_count=len(values),
        epoch=epoch,
        first_timestamp_ms=0,
        max_timestamp_ms=0,
        producer_id=-1,
        producer_sequence=-1,
        payload=payload,
    )
    return header + payload


def _node(root: Path, files: dict[int, list[bytes]]) -> Path:
    folder = shard_dir(root, "t_0", 7)
    folder.mkdir(parents=True)
    for base, frames in files.items():
        (folder / f"{base:020d}.log").write_bytes(b"".join(frames))
    return root


def test_the_same_frames_give_the_same_digest_and_records(tmp_path: Path) -> None:
    frames = [_frame(0, ["a", "b"]), _frame(2, ["c"]), _frame(3, ["d", "e"])]
    one = _node(tmp_path / "one", {0: frames[:2], 3: frames[2:]})  # rolled differently: same bytes
    two = _node(tmp_path / "two", {0: frames})
    first, second = read_range(one, "t_0", 7, 0, 3), read_range(two, "t_0", 7, 0, 3)
    assert first is not None and second is not None
    assert first.whole and second.whole and first.digest == second.digest and first.size == second.size
    assert first.records == [[0, "a"], [1, "b"], [2, "c"]]
    assert first.crc32c == second.crc32c == crc32c(frames[0] + frames[1])
    assert read_range(one, "t_0", 8, 0, 3) is None  # another incarnation: nothing held


def test_other_bytes_a_hole_and_a_short_copy_are_told_apart(tmp_path: Path) -> None:
    good = _node(tmp_path / "good", {0: [_frame(0, ["a", "b"]), _frame(2, ["c"])]})
    other = _node(tmp_path / "other", {0: [_frame(0, ["a", "b"]), _frame(2, ["c"], epoch=1)]})
    holed = _node(tmp_path / "holed", {0: [_frame(0, ["a", "b"])], 3: [_frame(3, ["d"])]})
    short = _node(tmp_path / "short", {0: [_frame(0, ["a", "b"])]})
    reference = read_range(good, "t_0", 7, 0, 3)
    differs = read_range(other, "t_0", 7, 0, 3)
    assert reference is not None and differs is not None
    assert differs.whole and differs.digest != reference.digest
    gap = read_range(holed, "t_0", 7, 0, 4)
    assert gap is not None and not gap.whole and gap.problem is not None
    cut = read_range(short, "t_0", 7, 0, 3)
    assert cut is not None and not cut.whole


def test_held_ranges_merge_runs_and_stop_at_a_torn_tail(tmp_path: Path) -> None:
    frames = [_frame(0, ["a", "b"]), _frame(2, ["c"]), _frame(5, ["f"])]
    node = _node(tmp_path / "n", {0: frames[:2], 5: [frames[2], frames[2][:40]]})  # a torn header
    (tmp_path / "n" / "segment" / "shards" / "other_1.3").mkdir()
    assert held_ranges(node) == [["other", 1, 3, []], ["t", 0, 7, [[0, 3], [5, 6]]]]
    assert held_ranges(tmp_path / "lost") == []
