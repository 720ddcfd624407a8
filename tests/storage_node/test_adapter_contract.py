"""The StorageAdapter contract, the same for every engine, checked against a plain model."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from robustmq._records import build_records, encode_batch
from robustmq.errors import (
    EngineClosed,
    InvalidRecordBatch,
    InvalidRequest,
    OffsetOutOfRange,
    RecordBatchTooLarge,
    ShardAlreadyExists,
    ShardNotFound,
    StaleEpoch,
)
from robustmq.storage_node import AppendRequest, ShardConfig, StorageAdapter
from tests._model import Model, rows_of
from tests.conftest import ENGINE_NAMES, EngineFactory

KEYS = [b"k0", b"k1", b"k2", b"k3", None]
TAGS = ["eu", "us", "vip", "bulk"]


def batch(values: list[bytes], **columns: object) -> pa.Table:
    return build_records(values, **columns)  # type: ignore[arg-type]


def test_offsets_are_contiguous_from_zero(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    bases = [engine.write("t_0", batch([b"x"] * n)).base_offset for n in (1, 5, 3, 100, 1)]
    assert bases == [0, 1, 6, 9, 109]
    assert engine.list_offsets("t_0").log_end_offset == 110
    offsets = engine.read_by_offset("t_0", 0, max_records=1000).records.column("offset").to_pylist()
    assert offsets == list(range(110))


def test_read_slices_inside_frames_and_respects_limits(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    for start in range(0, 50, 10):
        engine.write("t_0", batch([b"v%d" % i for i in range(start, start + 10)]))
    result = engine.read_by_offset("t_0", 13, max_records=15)
    assert result.records.column("offset").to_pylist() == list(range(13, 28))
    assert result.records.column("value").to_pylist() == [b"v%d" % i for i in range(13, 28)]
    assert result.next_offset == 28
    bounded = engine.read_by_offset("t_0", 13, end_offset=17)
    assert bounded.records.column("offset").to_pylist() == [13, 14, 15, 16]
    at_end = engine.read_by_offset("t_0", 50)
    assert at_end.records.num_rows == 0 and at_end.next_offset == 50
    with pytest.raises(OffsetOutOfRange) as caught:
        engine.read_by_offset("t_0", 51)
    assert caught.value.shard == "t_0" and caught.value.offset == 51


def test_read_frames_honours_the_byte_budget_but_returns_one_frame(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    for _ in range(4):
        engine.write("t_0", batch([b"x" * 1000] * 10))
    one = engine.read_frames("t_0", 0, max_bytes=1)
    assert len(one.frames) == 1 and one.next_offset == 10
    all_frames = engine.read_frames("t_0", 5)
    assert len(all_frames.frames) == 4 and all_frames.next_offset == 40


def test_lookups_by_key_tag_and_timestamp(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.write(
        "t_0",
        batch(
            [b"a", b"b", b"c"],
            keys=[b"k1", b"k2", b"k1"],
            tags=[["eu"], ["us"], ["eu", "vip"]],
            timestamps_ms=[100, 300, 200],
        ),
    )
    engine.write("t_0", batch([b"d"], keys=[b"k2"], tags=[["vip"]], timestamps_ms=[400]))
    assert engine.read_by_key("t_0", b"k1").records.column("value").to_pylist() == [b"c"]
    assert engine.read_by_key("t_0", b"k2").records.column("offset").to_pylist() == [3]
    assert engine.read_by_key("t_0", b"nope").records.num_rows == 0
    assert engine.read_by_tag("t_0", "vip").records.column("offset").to_pylist() == [2, 3]
    assert engine.read_by_tag("t_0", "eu", start_offset=1).records.column("offset").to_pylist() == [2]
    assert engine.read_by_tag("t_0", "none").records.num_rows == 0
    assert engine.get_offset_by_timestamp("t_0", 0) == 0
    assert engine.get_offset_by_timestamp("t_0", 150) == 1
    assert engine.get_offset_by_timestamp("t_0", 301) == 3
    assert engine.get_offset_by_timestamp("t_0", 401) is None


def test_group_offsets(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    assert engine.get_offset_by_group("g", "t_0") is None
    engine.commit_offset("g", "t_0", 42)
    engine.commit_offset("h", "t_0", 7)
    engine = factory.reopen()
    if factory.persistent:
        assert engine.get_offset_by_group("g", "t_0") == 42
        assert engine.get_offset_by_group("h", "t_0") == 7
    with pytest.raises(InvalidRequest):
        engine.commit_offset("g", "t_0", -1)
    with pytest.raises(ShardNotFound):
        engine.commit_offset("g", "missing_0", 1)


@pytest.mark.parametrize(
    "payload, error",
    [
        (b"not arrow at all", InvalidRecordBatch),
        (encode_batch(build_records([b"x"])).to_pybytes()[:-9], InvalidRecordBatch),
        (encode_batch(build_records([b"x"])).to_pybytes() + b"junk", InvalidRecordBatch),
        (pa.table({"value": [b"x"], "extra": [1]}), InvalidRecordBatch),
        (pa.table({"key": [b"x"]}), InvalidRecordBatch),
        (build_records([]), InvalidRecordBatch),
        ("a string", InvalidRecordBatch),
    ],
)
def test_bad_input_is_rejected_and_changes_nothing(
    engine: StorageAdapter, payload: object, error: type[Exception]
) -> None:
    engine.create_shard("t_0")
    engine.write("t_0", batch([b"ok"]))
    with pytest.raises(error):
        engine.write("t_0", payload)
    assert engine.list_offsets("t_0").log_end_offset == 1
    assert engine.write("t_0", batch([b"next"])).base_offset == 1


def test_wrong_schema_ipc_is_rejected(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    sink = pa.BufferOutputStream()
    table = pa.table({"value": pa.array([1, 2], pa.int64())})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(InvalidRecordBatch, match="schema"):
        engine.write("t_0", sink.getvalue())
    assert engine.list_offsets("t_0").log_end_offset == 0


def test_oversized_batch_is_rejected(factory: EngineFactory) -> None:
    engine = factory.open(ShardConfig(max_batch_bytes=4096))
    engine.create_shard("t_0")
    with pytest.raises(RecordBatchTooLarge):
        engine.write("t_0", batch([b"x" * 10_000]))
    with pytest.raises(RecordBatchTooLarge):
        engine.write("t_0", encode_batch(batch([b"x" * 10_000])))
    assert engine.list_offsets("t_0").log_end_offset == 0


def test_a_group_with_one_bad_batch_writes_nothing(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.create_shard("t_1")
    with pytest.raises(InvalidRecordBatch):
        engine.batch_write(
            [
                AppendRequest("t_0", batch([b"a"])),
                AppendRequest("t_1", b"garbage"),
            ]
        )
    with pytest.raises(ShardNotFound):
        engine.batch_write([AppendRequest("t_0", batch([b"a"])), AppendRequest("x_9", batch([b"b"]))])
    assert engine.list_offsets("t_0").log_end_offset == 0
    assert engine.list_offsets("t_1").log_end_offset == 0
    results = engine.batch_write(
        [
            AppendRequest("t_0", batch([b"a", b"b"])),
            AppendRequest("t_1", batch([b"c"])),
            AppendRequest("t_0", batch([b"d"])),
        ]
    )
    assert [(r.shard, r.base_offset) for r in results] == [("t_0", 0), ("t_1", 0), ("t_0", 2)]


def test_shard_lifecycle_and_names(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    with pytest.raises(ShardAlreadyExists):
        engine.create_shard("t_0")
    for bad in ["", "../x", "a/b", "x" * 300, "spa ce"]:
        with pytest.raises(InvalidRequest):
            engine.create_shard(bad)
    engine.write("t_0", batch([b"x"] * 3))
    engine.commit_offset("g", "t_0", 2)
    engine.delete_shard("t_0")
    with pytest.raises(ShardNotFound):
        engine.read_by_offset("t_0", 0)
    with pytest.raises(ShardNotFound):
        engine.delete_shard("t_0")
    engine.create_shard("t_0")
    assert engine.list_offsets("t_0").log_end_offset == 0
    assert engine.get_offset_by_group("g", "t_0") is None
    assert engine.read_by_key("t_0", b"x").records.num_rows == 0
    engine = factory.reopen()
    assert engine.list_shards() == ["t_0"]
    assert engine.list_offsets("t_0").log_end_offset == 0


def test_a_shard_can_begin_at_a_later_offset(factory: EngineFactory) -> None:
    # A node that joins a partition at a later segment holds the log from that segment on.
    engine = factory.open()
    engine.create_shard("t_0", start_offset=1_000)
    offsets = engine.list_offsets("t_0")
    assert (offsets.earliest_offset, offsets.log_end_offset) == (1_000, 1_000)
    assert engine.write("t_0", batch([b"a", b"b"])).base_offset == 1_000
    with pytest.raises(OffsetOutOfRange):
        engine.read_by_offset("t_0", 10)
    with pytest.raises(InvalidRequest):
        engine.create_shard("t_1", start_offset=-1)
    engine = factory.reopen()
    if factory.persistent:
        assert engine.list_offsets("t_0").log_end_offset == 1_002
        assert engine.write("t_0", batch([b"c"])).base_offset == 1_002
        rows = engine.read_by_offset("t_0", 1_000).records
        assert rows.column("offset").to_pylist() == [1_000, 1_001, 1_002]
        assert rows.column("value").to_pylist() == [b"a", b"b", b"c"]


def test_idempotent_producer_is_deduplicated(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    first = engine.write("t_0", batch([b"a", b"b"]), producer_id=9, producer_sequence=0)
    second = engine.write("t_0", batch([b"c"]), producer_id=9, producer_sequence=5)
    replay = engine.write("t_0", batch([b"a", b"b"]), producer_id=9, producer_sequence=0)
    assert replay.duplicate and (replay.base_offset, replay.record_count) == (0, 2)
    assert not first.duplicate and second.base_offset == 2
    engine = factory.reopen()
    if factory.persistent:
        again = engine.write("t_0", batch([b"c"]), producer_id=9, producer_sequence=5)
        assert again.duplicate and again.base_offset == 2
    other = engine.write("t_0", batch([b"x"]), producer_id=10, producer_sequence=0)
    assert not other.duplicate
    for sequence in range(6, 40):  # far more than the 16 the window used to hold
        engine.write("t_0", batch([b"y"]), producer_id=9, producer_sequence=sequence)
    old = engine.write("t_0", batch([b"a", b"b"]), producer_id=9, producer_sequence=0)
    assert old.duplicate and old.base_offset == 0  # still verified, with its original offsets
    end = engine.list_offsets("t_0").log_end_offset
    assert end == 2 + 1 + 1 + 34
    with pytest.raises(InvalidRequest):
        engine.write("t_0", batch([b"z"]), producer_id=9, producer_sequence=-1)


def test_duplicates_inside_one_group_are_written_once(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    request = AppendRequest("t_0", batch([b"a"]), producer_id=1, producer_sequence=3)
    results = engine.batch_write([request, request])
    assert [r.duplicate for r in results] == [False, True]
    assert results[1].base_offset == results[0].base_offset == 0
    assert engine.list_offsets("t_0").log_end_offset == 1


def test_stale_epoch_is_fenced(factory: EngineFactory) -> None:
    engine = factory.open()
    engine.create_shard("t_0")
    engine.write("t_0", batch([b"a"]), epoch=0)
    engine.write("t_0", batch([b"b"]), epoch=3)
    with pytest.raises(StaleEpoch) as caught:
        engine.write("t_0", batch([b"c"]), epoch=2)
    assert caught.value.current_epoch == 3
    engine = factory.reopen()
    if factory.persistent:
        with pytest.raises(StaleEpoch):
            engine.write("t_0", batch([b"c"]), epoch=2)
    assert engine.write("t_0", batch([b"d"]), epoch=3).base_offset == 2


def test_closed_engine_raises(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.close()
    with pytest.raises(EngineClosed):
        engine.write("t_0", batch([b"a"]))
    with pytest.raises(EngineClosed):
        engine.read_by_offset("t_0", 0)


def test_missing_timestamps_take_the_write_time(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    engine.write("t_0", pa.table({"value": [b"a", b"b"], "timestamp": pa.array([5, None], pa.int64())}))
    stamps = engine.read_by_offset("t_0", 0).records.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps[0] == 5 and stamps[1] > 1_700_000_000_000


def test_scan_reads_only_what_the_indexes_allow(engine: StorageAdapter) -> None:
    engine.create_shard("t_0")
    for start in range(0, 1000, 100):
        engine.write(
            "t_0",
            batch(
                [b"v%d" % i for i in range(start, start + 100)],
                keys=[b"k%d" % (i % 10) for i in range(start, start + 100)],
                tags=[["rare"] if start == 500 else ["common"] for _ in range(100)],
                timestamps_ms=list(range(start, start + 100)),
            ),
        )
    by_tag = engine.scan("t_0", 0, tags=["rare"])
    assert by_tag.records.num_rows == 100 and by_tag.scanned == 100  # one frame of ten
    by_time = engine.scan("t_0", 0, min_timestamp_ms=950)
    assert by_time.records.column("offset").to_pylist() == list(range(950, 1000))
    assert by_time.scanned <= 100  # starts in the frame holding offset 950
    early_key = engine.scan("t_0", 0, 1000, key=b"k3", max_timestamp_ms=120)
    assert early_key.records.column("offset").to_pylist() == [3, 13, 23, 33, 43, 53, 63, 73, 83, 93, 103, 113]
    engine.write("t_0", batch([b"solo"], keys=[b"only-early"]))
    engine.write("t_0", batch([b"x"] * 500))
    by_key = engine.scan("t_0", 900, key=b"only-early")
    assert by_key.records.column("offset").to_pylist() == [1000]
    assert by_key.scanned <= 101 + 1  # stops after the key's latest record, not at the log end


# -- model-based, stateful property test --------------------------------------------------------

records_strategy = st.lists(
    st.tuples(
        st.sampled_from(KEYS),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.integers(min_value=0, max_value=10_000),
        st.one_of(st.none(), st.lists(st.sampled_from(TAGS), max_size=3, unique=True)),
    ),
    min_size=1,
    max_size=12,
)


class EngineMachine(RuleBasedStateMachine):
    """Random writes, reads, lookups and restarts: the engine agrees with the model throughout."""

    kind = "segment"

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        from pathlib import Path

        self.directory = tempfile.TemporaryDirectory()
        self.factory = EngineFactory(self.kind, Path(self.directory.name))
        self.engine = self.factory.open(ShardConfig(segment_bytes_max=64 * 1024))
        self.model = Model()

    @initialize()
    def shards(self) -> None:
        for shard in ("s_0", "s_1"):
            self.engine.create_shard(shard)
            self.model.create(shard)

    @rule(shard=st.sampled_from(["s_0", "s_1"]), rows=records_strategy, as_ipc=st.booleans())
    def write(self, shard: str, rows: list[tuple], as_ipc: bool) -> None:
        table = build_records(
            [value for _, value, _, _ in rows],
            keys=[key for key, _, _, _ in rows],
            timestamps_ms=[ts for _, _, ts, _ in rows],
            tags=[tags for _, _, _, tags in rows],
        )
        result = self.engine.write(shard, encode_batch(table) if as_ipc else table)
        assert result.base_offset == self.model.append(shard, table)

    @rule(shard=st.sampled_from(["s_0", "s_1"]), data=st.data())
    def read(self, shard: str, data: st.DataObject) -> None:
        end = self.model.log_end(shard)
        offset = data.draw(st.integers(min_value=0, max_value=end))
        count = data.draw(st.integers(min_value=1, max_value=30))
        result = self.engine.read_by_offset(shard, offset, max_records=count)
        assert rows_of(result.records) == self.model.read(shard, offset, count)

    @rule(shard=st.sampled_from(["s_0", "s_1"]), key=st.sampled_from(KEYS[:-1]))
    def by_key(self, shard: str, key: bytes) -> None:
        rows = self.engine.read_by_key(shard, key).records.column("offset").to_pylist()
        expected = self.model.by_key(shard, key)
        assert rows == ([] if expected is None else [expected])

    @rule(shard=st.sampled_from(["s_0", "s_1"]), tag=st.sampled_from(TAGS), data=st.data())
    def by_tag(self, shard: str, tag: str, data: st.DataObject) -> None:
        start = data.draw(st.integers(min_value=0, max_value=self.model.log_end(shard)))
        found = self.engine.read_by_tag(shard, tag, start_offset=start).records
        assert found.column("offset").to_pylist() == self.model.by_tag(shard, tag, start)

    @rule(shard=st.sampled_from(["s_0", "s_1"]), timestamp=st.integers(min_value=-5, max_value=10_005))
    def by_timestamp(self, shard: str, timestamp: int) -> None:
        expected = self.model.offset_for_timestamp(shard, timestamp)
        assert self.engine.get_offset_by_timestamp(shard, timestamp) == expected

    @rule(
        shard=st.sampled_from(["s_0", "s_1"]),
        key=st.one_of(st.none(), st.sampled_from(KEYS[:-1])),
        tags=st.lists(st.sampled_from(TAGS), max_size=2, unique=True),
        min_ts=st.one_of(st.none(), st.integers(0, 10_000)),
        max_ts=st.one_of(st.none(), st.integers(0, 10_000)),
        data=st.data(),
    )
    def scan(
        self,
        shard: str,
        key: bytes | None,
        tags: list[str],
        min_ts: int | None,
        max_ts: int | None,
        data: st.DataObject,
    ) -> None:
        end = self.model.log_end(shard)
        start = data.draw(st.integers(0, end))
        stop = data.draw(st.integers(start, end))
        limit = data.draw(st.integers(1, 40))
        expected = self.model.scan(shard, start, stop, key, tags, min_ts, max_ts)
        got: list[int] = []
        position = start
        while position < stop:  # page through, as a client does
            result = self.engine.scan(
                shard,
                position,
                stop,
                key=key,
                tags=tags,
                min_timestamp_ms=min_ts,
                max_timestamp_ms=max_ts,
                max_records=limit,
            )
            got.extend(result.records.column("offset").to_pylist())
            assert result.next_offset > position or result.next_offset >= stop
            position = result.next_offset
        assert got == expected

    @precondition(lambda self: self.factory.persistent)
    @rule()
    def restart(self) -> None:
        self.engine = self.factory.reopen()

    @invariant()
    def log_ends_match(self) -> None:
        for shard in self.model.shards:
            assert self.engine.list_offsets(shard).log_end_offset == self.model.log_end(shard)

    def teardown(self) -> None:
        self.factory.close()
        self.directory.cleanup()


@pytest.mark.parametrize("kind", ENGINE_NAMES)
def test_engine_agrees_with_the_model(kind: str) -> None:
    machine = type(f"{kind.title()}Machine", (EngineMachine,), {"kind": kind})
    settings_ = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(machine, settings=settings_)


def test_new_limits_apply_to_the_next_write_and_survive_a_restart(factory: EngineFactory) -> None:
    """``reconfigure_shard`` (a topic altered): the next write obeys the new limits, and a
    persistent engine still has them after a restart."""
    from robustmq.errors import RecordBatchTooLarge

    engine = factory.open()
    engine.create_shard("s_0", ShardConfig(retention_records=1000))
    engine.write("s_0", batch([b"x" * 4096]))
    altered = ShardConfig(retention_records=10, max_batch_bytes=1024)
    engine.reconfigure_shard("s_0", altered)
    assert engine.shard_config("s_0") == altered
    with pytest.raises(RecordBatchTooLarge):
        engine.write("s_0", batch([b"x" * 4096]))
    assert factory.reopen().shard_config("s_0") == altered
