"""Planning tiered reads (pure: chains in, pieces out) and reading pieces from real objects."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import READ_SCHEMA, build_records
from robustmq.connector._options import SourceOptions
from robustmq.connector._tiered import (
    RECHECK_S,
    Reachability,
    RecordFilter,
    TieredPiece,
    choose_pieces,
    read_piece,
    tiered_pieces,
)
from robustmq.errors import CorruptObject, InvalidConfig
from robustmq.tier._format import ObjectMeta, segment_to_parquet
from robustmq.tier._store import ObjectStore, segment_key

BASE_MS = 1_763_800_000_000


def _chain(url: str) -> pb.ShardInfo:
    """Segments [0,100) remote, [100,200) tiered, [200,300) sealed, [300,...) active."""
    remote = dict(state=pb.REMOTE, object_url=f"{url}/a", object_bytes=7)
    tiered = dict(state=pb.TIERED, object_url=f"{url}/b", object_bytes=8)
    segments = [
        pb.Segment(epoch=0, start_offset=0, end_offset=100, **remote),
        pb.Segment(epoch=1, start_offset=100, end_offset=200, **tiered),
        pb.Segment(epoch=1, start_offset=200, end_offset=300, state=pb.SEALED),
        pb.Segment(epoch=2, start_offset=300, end_offset=-1, state=pb.ACTIVE),
    ]
    return pb.ShardInfo(topic="t", partition=3, shard="t_3", segments=segments, incarnation=5)


def test_pieces_are_the_tiered_and_remote_parts_of_a_range_clipped_to_it() -> None:
    pieces = tiered_pieces("t", _chain("file:///x"), 50, 250)
    assert [(p.start, p.end, p.url, p.object_bytes) for p in pieces] == [
        (50, 100, "file:///x/a", 7),
        (100, 200, "file:///x/b", 8),
    ]
    first = pieces[0].expected
    assert (first.topic, first.partition, first.incarnation, first.epoch) == ("t", 3, 5, 0)
    assert (first.start_offset, first.end_offset, first.records) == (0, 100, 100)
    assert tiered_pieces("t", _chain("file:///x"), 200, 400) == ()
    assert tiered_pieces("t", _chain("file:///x"), 199, 201)[0].start == 199


def test_the_mode_chooses_pieces_and_the_default_asks_the_store_once(tmp_path: Path) -> None:
    reachable = f"file://{tmp_path}/store"
    (tmp_path / "store/t/3/5").mkdir(parents=True)
    (tmp_path / "store/t/3/5/a.parquet").write_bytes(b"x")
    meta = ObjectMeta("t", 3, 5, 0, 0, 10, 10, -1, -1, -1)
    near = TieredPiece(0, 10, f"{reachable}/t/3/5/a.parquet", 1, meta)
    far = TieredPiece(10, 20, f"file://{tmp_path}/gone/t/3/5/b.parquet", 1, meta)
    memory = Reachability()
    assert choose_pieces([near, far], "node", memory) == ()
    assert choose_pieces([near, far], "direct", memory) == (near, far)
    assert choose_pieces([near, far], None, memory) == (near,)
    (tmp_path / "gone/t/3/5").mkdir(parents=True)
    (tmp_path / "gone/t/3/5/b.parquet").write_bytes(b"x")
    assert choose_pieces([near, far], None, memory) == (near,), "a failure is remembered for a while"
    assert memory.reachable(far, now=10**9 + RECHECK_S)


def test_tiered_reads_option_is_checked_naming_it() -> None:
    base = {"metaAddress": "127.0.0.1:1", "topic": "t"}
    assert SourceOptions.parse(base).tiered_reads is None
    assert SourceOptions.parse({**base, "tieredReads": "Direct"}).tiered_reads == "direct"
    assert SourceOptions.parse({**base, "tieredreads": "node"}, "readStream").tiered_reads == "node"
    with pytest.raises(InvalidConfig, match="option 'tieredReads': expected direct or node, got 'nodes'"):
        SourceOptions.parse({**base, "tieredReads": "nodes"})
    with pytest.raises(InvalidConfig, match="option 'tieredReads': does not apply with output=ranges"):
        SourceOptions.parse({**base, "tieredReads": "direct", "output": "ranges"})


def _records(start: int, count: int) -> pa.Table:
    table = build_records(
        [b"v%d" % i for i in range(start, start + count)],
        keys=[b"k%d" % (i % 3) for i in range(start, start + count)],
        timestamps_ms=[BASE_MS + i for i in range(start, start + count)],
        tags=[["a", "b"] if i % 2 else ["a"] for i in range(start, start + count)],
        headers=[[("h", b"%d" % i)] if i % 5 == 0 else None for i in range(start, start + count)],
    )
    offsets = pa.array(range(start, start + count), pa.int64())
    return pa.Table.from_arrays([offsets, *table.columns], schema=READ_SCHEMA)


def _object(tmp_path: Path, records: pa.Table, start: int) -> tuple[ObjectStore, TieredPiece]:
    store = ObjectStore.from_url(f"file://{tmp_path}/tier")
    store.check()  # creates the tier directory (puts never do)
    count = records.num_rows
    meta = ObjectMeta("t", 0, 1, 0, start, start + count, count, 77, 1234, BASE_MS + start + count - 1)
    sink = io.BytesIO()
    segment_to_parquet(records, meta, sink)
    key = segment_key("t", 0, 0, start, incarnation=1)
    store.put_if_absent(key, sink.getvalue())
    return store, TieredPiece(start, start + count, store.url_of(key), len(sink.getvalue()), meta)


def test_a_piece_reads_exactly_its_offsets_and_filters_like_the_node(tmp_path: Path) -> None:
    records = _records(1000, 20_000)
    _, piece = _object(tmp_path, records, 1000)
    middle = TieredPiece(1500, 19_000, piece.url, piece.object_bytes, piece.expected)
    read = pa.concat_tables(read_piece(middle))
    assert read.equals(records.slice(500, 17_500))
    filtered = RecordFilter(
        key=b"k1", tags=("b",), min_timestamp_ms=BASE_MS + 2000, max_timestamp_ms=BASE_MS + 2100
    )
    expected = [i for i in range(2000, 2101) if i % 3 == 1 and i % 2 == 1]
    assert filtered.apply(read).column("offset").to_pylist() == expected


def test_a_damaged_or_mismatched_object_is_refused_naming_its_url(tmp_path: Path) -> None:
    records = _records(0, 5000)
    _, piece = _object(tmp_path, records, 0)
    path = Path(piece.url.removeprefix("file://"))
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # a page's bytes, same size
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObject, match=piece.url):
        list(read_piece(piece))
    other = TieredPiece(0, 5000, piece.url, piece.object_bytes + 1, piece.expected)
    with pytest.raises(CorruptObject, match="bytes"):
        list(read_piece(other))
