"""The history checker on hand-written histories: each anomaly is found, a clean history passes.

These prove the checker can fail; the end-to-end runs (``test_history.py``)
only show it did not, so each analysis has a history here that it must flag.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from tests.e2e._history import FAIL, INFO, OK, History, check, value_tag, write_outcome, write_value


class Build:
    """Writes a history the way the workers do, with a fake clock (1 s per line)."""

    def __init__(self) -> None:
        ticks = itertools.count()
        self.history = History(clock=lambda: float(next(ticks)))

    def op(self, process: str, f: str, value: Any, type_: str = OK, done: Any = None) -> None:
        invocation = self.history.invoke(process, f, value)
        self.history.complete(invocation, type_, {**value, **(done or {})})

    def write(
        self,
        topic: str,
        inc: int,
        acked: list[tuple[str, int, int]] = (),  # type: ignore[assignment]
        *,
        failed: list[str] = (),  # type: ignore[assignment]
        unknown: list[str] = (),  # type: ignore[assignment]
        epoch: int | None = None,
        f: str = "send",
        process: str = "0",
        duplicate: bool = False,
        acks: str | None = None,
    ) -> None:
        writes = [[p, v] for v, p, _ in acked] + [[0, v] for v in [*failed, *unknown]]
        type_, outcome = write_outcome(
            [[v, p, o, epoch, duplicate] for v, p, o in acked], list(failed), list(unknown)
        )
        value: dict[str, Any] = {"topic": topic, "inc": inc, "writes": writes}
        if acks is not None:
            value["acks"] = acks
        self.op(process, f, value, type_, outcome)

    def read(
        self, topic: str, inc: int, partition: int, offset: int, values: list[str], f: str = "read"
    ) -> None:
        records = [[offset + i, v] for i, v in enumerate(values)]
        self.op(
            "1",
            f,
            {"topic": topic, "inc": inc, "partition": partition, "offset": offset},
            OK,
            {"records": records},
        )

    def final(
        self,
        topic: str,
        inc: int,
        partition: int,
        records: list[tuple[int, str]],
        earliest: int = 0,
        hw: int | None = None,
    ) -> None:
        hw = (records[-1][0] + 1 if records else earliest) if hw is None else hw
        self.op(
            "final",
            "final_read",
            {"topic": topic, "inc": inc, "partition": partition},
            OK,
            {"earliest": earliest, "hw": hw, "records": [list(r) for r in records]},
        )

    def chain(self, topic: str, inc: int, partition: int, segments: list[tuple[int, int, int]]) -> None:
        self.op(
            "final",
            "final_chain",
            {"topic": topic, "inc": inc, "partition": partition},
            OK,
            {"segments": [[e, s, end, "ACTIVE" if end < 0 else "SEALED"] for e, s, end in segments]},
        )

    def session(self, process: str, topic: str, inc: int, group: str, session: int) -> dict[str, Any]:
        return {"topic": topic, "inc": inc, "group": group, "session": session, "process": process}

    def subscribe(self, s: dict[str, Any], positions: list[tuple[int, int]]) -> None:
        process = s["process"]
        key = {k: v for k, v in s.items() if k != "process"}
        self.op(process, "subscribe", key, OK, {"positions": [list(p) for p in positions]})

    def poll(self, s: dict[str, Any], records: list[tuple[int, int, str]], type_: str = OK) -> None:
        key = {k: v for k, v in s.items() if k != "process"}
        self.op(s["process"], "poll", key, type_, {"records": [list(r) for r in records]})

    def commit(self, s: dict[str, Any], offsets: list[tuple[int, int]], type_: str = OK) -> None:
        key = {k: v for k, v in s.items() if k != "process"}
        self.op(s["process"], "commit", {**key, "offsets": [list(o) for o in offsets]}, type_)

    def written(self, count: int = 10) -> Build:
        """Writes of ``v(0) .. v(count - 1)`` with unknown outcomes, so reading them is no phantom."""
        self.write("t", 1, unknown=[v(n) for n in range(count)], process="9")
        return self

    def anomalies(self) -> set[str]:
        return set(check(self.history.ops()).anomalies)


def v(n: int, inc: int = 1, topic: str = "t", process: str = "0") -> str:
    return write_value(topic, inc, process, n)


def clean() -> Build:
    """Writes, reads, a consumer session with commits, a seal, a delete and re-create, final reads."""
    b = Build()
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], epoch=0, f="produce")
    b.write("t", 1, [(v(2), 0, 2)])
    b.write("t", 1, unknown=[v(3)])  # outcome unknown, never read: tolerated
    b.op("2", "seal", {"topic": "t", "inc": 1, "partition": 0}, OK, {"epoch": 0, "end": 3, "next_epoch": 1})
    b.write("t", 1, [(v(4), 0, 3)], epoch=1, f="produce")
    b.read("t", 1, 0, 1, [v(1), v(2)])
    s = b.session("3", "t", 1, "g3", 1)
    b.subscribe(s, [(0, 0)])
    b.poll(s, [(0, 0, v(0)), (0, 1, v(1))])
    b.commit(s, [(0, 2)])
    s2 = b.session("3", "t", 1, "g3", 2)
    b.subscribe(s2, [(0, 2)])
    b.poll(s2, [(0, 2, v(2))])
    b.op("4", "delete", {"topic": "t", "inc": 1})
    b.op("4", "create", {"topic": "t", "inc": 2})
    b.write("t", 2, [(v(0, inc=2), 0, 0)])
    s3 = b.session("3", "t", 2, "g3", 3)
    b.subscribe(s3, [(0, 0)])  # the group's offsets went with the old incarnation
    b.final("t", 2, 0, [(0, v(0, inc=2))])
    b.chain("t", 2, 0, [(0, 0, -1)])
    return b


def test_a_clean_history_passes_and_tolerates_unknown_writes() -> None:
    analysis = check(clean().history.ops())
    assert analysis.valid, analysis.report()
    assert analysis.tolerated["unseen"].count == 2  # v(3) unknown; v(4) acked, its incarnation deleted unread
    assert "indeterminate_write" in analysis.tolerated


def test_values_name_their_incarnation() -> None:
    assert value_tag(write_value("a#b", 3, "7", 12)) == ("a#b", 3)
    assert value_tag("garbage") is None


def test_lost_write_after_the_final_read_and_after_a_read_passed_it() -> None:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)])
    b.final("t", 1, 0, [(0, v(0))])  # log ends at 1: v(1) is gone
    assert "lost_write" in b.anomalies()
    b = Build()  # an incarnation with no final read: a read returned a range holding the offset
    b.write("t", 1, [(v(1), 0, 1)])
    b.read("t", 1, 0, 0, [v(0), v(7), v(8)])
    b.write("t", 1, [(v(0), 0, 0), (v(7), 0, 1), (v(8), 0, 2)], process="1")
    assert "lost_write" in b.anomalies()


def test_an_offset_no_read_covered_is_unseen_not_lost() -> None:
    b = Build()
    b.write("t", 1, [(v(n), 0, n) for n in range(6)])
    b.read("t", 1, 0, 0, [v(0), v(1)])
    b.read("t", 1, 0, 4, [v(4), v(5)])  # offsets 2 and 3 were never in a read's range
    analysis = check(b.history.ops())
    assert analysis.valid, analysis.report()
    assert analysis.tolerated["unseen"].count == 2


def test_duplicate_one_value_at_two_offsets() -> None:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0)])
    b.final("t", 1, 0, [(0, v(0)), (1, v(0))])
    assert b.anomalies() == {"duplicate"}


def test_inconsistent_offsets_and_reused_offsets() -> None:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0)])
    b.write("t", 1, unknown=[v(1)], process="1")
    b.read("t", 1, 0, 0, [v(1)])
    assert "inconsistent_offsets" in b.anomalies()
    b = Build()
    b.write("t", 1, [(v(0), 0, 0)])
    b.write("t", 1, [(v(1), 0, 0)], process="1")
    assert "reused_offset" in b.anomalies()


def test_aborted_read_of_a_failed_write() -> None:
    b = Build()
    b.write("t", 1, failed=[v(0)])
    b.read("t", 1, 0, 0, [v(0)])
    assert b.anomalies() == {"aborted_read"}


def test_phantom_and_misplaced_reads() -> None:
    b = Build()
    b.read("t", 1, 0, 0, ["never written"])
    assert b.anomalies() == {"phantom_read"}
    b = Build()
    b.write("u", 1, [(v(0, topic="u"), 0, 0)])
    b.read("t", 1, 0, 0, [v(0, topic="u")])
    assert "misplaced" in b.anomalies()


def test_resurrected_a_deleted_incarnations_record_in_the_new_one() -> None:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0)])
    b.op("4", "delete", {"topic": "t", "inc": 1})
    b.op("4", "create", {"topic": "t", "inc": 2})
    b.write("t", 2, [(v(0, inc=2), 0, 1)])
    b.final("t", 2, 0, [(0, v(0)), (1, v(0, inc=2))])
    found = check(b.history.ops()).anomalies
    assert set(found) == {"resurrected"}
    assert found["resurrected"].examples[0]["write"] == "acknowledged"


def test_nonmonotonic_poll_and_poll_skip_within_a_session() -> None:
    b = Build().written()
    s = b.session("3", "t", 1, "g", 1)
    b.subscribe(s, [(0, 0)])
    b.poll(s, [(0, 0, v(0)), (0, 1, v(1))])
    b.poll(s, [(0, 1, v(1))])
    assert b.anomalies() == {"nonmonotonic_poll"}
    b = Build().written()
    s = b.session("3", "t", 1, "g", 1)
    b.subscribe(s, [(0, 0)])
    b.poll(s, [(0, 0, v(0)), (0, 2, v(2))])
    assert b.anomalies() == {"poll_skip"}


def test_a_group_starting_past_or_before_its_commit() -> None:
    for start, anomaly in ((7, "poll_skip"), (2, "nonmonotonic_poll")):
        b = Build().written()
        s = b.session("3", "t", 1, "g", 1)
        b.subscribe(s, [(0, 0)])
        b.poll(s, [(0, o, v(o)) for o in range(5)])
        b.commit(s, [(0, 5)])
        b.subscribe(b.session("3", "t", 1, "g", 2), [(0, start)])
        assert b.anomalies() == {anomaly}, start


def test_an_unknown_commit_allows_both_offsets_and_a_commit_past_the_reads_is_a_skip() -> None:
    b = Build().written()
    s = b.session("3", "t", 1, "g", 1)
    b.subscribe(s, [(0, 0)])
    b.poll(s, [(0, 0, v(0)), (0, 1, v(1))])
    b.commit(s, [(0, 2)], INFO)
    b.subscribe(b.session("3", "t", 1, "g", 2), [(0, 0)])
    b.subscribe(b.session("3", "t", 1, "g", 3), [(0, 2)])
    assert b.anomalies() == set()
    s = b.session("3", "t", 1, "g", 4)
    b.subscribe(s, [(0, 2)])
    b.commit(s, [(0, 9)])
    assert b.anomalies() == {"poll_skip"}


def test_noncontiguous_reads_final_logs_and_chains() -> None:
    b = Build()
    b.read("t", 1, 0, 0, [v(0)])
    b.op(
        "1",
        "read",
        {"topic": "t", "inc": 1, "partition": 0, "offset": 0},
        OK,
        {"records": [[0, v(0)], [2, v(2)]]},
    )
    b.write("t", 1, [(v(0), 0, 0), (v(2), 0, 2)])
    assert "noncontiguous" in b.anomalies()
    b = Build()
    b.write("t", 1, [(v(5), 0, 5)])
    b.final("t", 1, 0, [(5, v(5))], earliest=5)  # a topic with no retention starts at 0
    assert b.anomalies() == {"noncontiguous"}
    b = Build()
    b.chain("t", 1, 0, [(0, 0, 10), (1, 12, -1)])
    assert b.anomalies() == {"noncontiguous"}


def test_write_acknowledged_past_its_epochs_sealed_end() -> None:
    b = Build()
    b.op("2", "seal", {"topic": "t", "inc": 1, "partition": 0}, OK, {"epoch": 0, "end": 3, "next_epoch": 1})
    b.write("t", 1, [(v(5), 0, 5)], epoch=0, f="produce")
    assert b.anomalies() == {"write_outside_epoch"}
    b = Build()
    b.chain("t", 1, 0, [(0, 0, 3), (1, 3, -1)])
    b.write("t", 1, [(v(1), 0, 1)], epoch=1, f="produce")
    assert b.anomalies() == {"write_outside_epoch"}
    b = Build()
    b.op("2", "seal", {"topic": "t", "inc": 1, "partition": 0}, OK, {"epoch": 0, "end": 3, "next_epoch": 1})
    b.chain("t", 1, 0, [(0, 0, 4), (1, 4, -1)])
    assert b.anomalies() == {"inconsistent_seal"}


def test_stuck_operations_and_final_reads_that_time_out() -> None:
    b = Build()
    b.history.invoke("0", "send", {"topic": "t", "inc": 1, "writes": [[0, v(0)]]})
    found = check(b.history.ops())
    assert set(found.anomalies) == {"stuck"}
    assert "unseen" in found.tolerated  # its write's outcome is unknown
    b = Build()
    b.op("final", "final_read", {"topic": "t", "inc": 1, "partition": 0}, INFO)
    assert b.anomalies() == {"stuck"}


def test_examples_are_shortest_first_and_bounded() -> None:
    b = Build()
    for n in (1000000, 1, 100):
        b.write("t", 1, [(v(n), 0, n)])
        b.final("t", 1, 0, [(n, v(n)), (n + 1, v(n))], earliest=n)
    finding = check(b.history.ops()).anomalies["duplicate"]
    assert finding.count == 3
    assert [len(str(e)) for e in finding.examples] == sorted(len(str(e)) for e in finding.examples)


def test_a_dumped_history_checks_the_same(tmp_path: Path) -> None:
    b = clean()
    b.write("t", 2, [(v(9, inc=2), 0, 1)])  # acknowledged, missing from the final read
    path = tmp_path / "history.jsonl"
    b.history.dump(path)
    again = check(History.load(path))
    assert again == check(b.history.ops())
    assert set(again.anomalies) == {"lost_write"}


def _final_offsets(b: Build, group: str, offsets: list[tuple[int, int]]) -> None:
    value = {"topic": "t", "inc": 1, "group": group}
    b.op("final", "final_offsets", value, OK, {"offsets": [list(o) for o in offsets]})


def test_a_group_commit_lost_or_changed_by_the_meta_service() -> None:
    """``final_offsets``: what a group holds after healing must be what its commits left."""

    def committed() -> Build:
        b = Build().written()
        s = b.session("3", "t", 1, "g", 1)
        b.subscribe(s, [(0, 0), (1, 0)])
        b.poll(s, [(0, 0, v(0)), (0, 1, v(1))])
        b.commit(s, [(0, 2), (1, 0)])
        s = b.session("3", "t", 1, "g", 2)
        b.subscribe(s, [(0, 2), (1, 0)])
        b.poll(s, [(0, 2, v(2))])
        b.commit(s, [(0, 3), (1, 0)], INFO)  # unknown: 2 or 3 may be left
        return b

    for final in ([(0, 2)], [(0, 3), (1, 0)]):
        b = committed()
        _final_offsets(b, "g", final)
        _final_offsets(b, "other", [])  # a group that never committed holds nothing
        assert b.anomalies() == set(), final
    for final in ([(0, 1)], [], [(0, 4)], [(0, 3), (1, 5)]):  # lost, wiped, or never committed
        b = committed()
        _final_offsets(b, "g", final)
        assert b.anomalies() == {"lost_commit"}, final


def test_a_seal_acknowledged_but_missing_from_the_final_chain() -> None:
    b = Build()
    b.op("2", "seal", {"topic": "t", "inc": 1, "partition": 0}, OK, {"epoch": 0, "end": 3, "next_epoch": 1})
    b.chain("t", 1, 0, [(0, 0, 3), (1, 3, -1)])
    assert b.anomalies() == set()
    b = Build()
    b.op("2", "seal", {"topic": "t", "inc": 1, "partition": 0}, OK, {"epoch": 1, "end": 3, "next_epoch": 2})
    b.chain("t", 1, 0, [(0, 0, 0), (1, 0, -1)])  # the Meta Service forgot the seal of epoch 1
    assert b.anomalies() == {"lost_seal"}


def test_lost_and_resurrected_topics() -> None:
    b = Build()
    b.op("4", "delete", {"topic": "t", "inc": 1}, FAIL, {"missing": True})
    assert b.anomalies() == {"lost_topic"}
    b = Build()
    b.op("final", "final_topic", {"topic": "t", "inc": 1, "expected": True, "exists": False})
    assert b.anomalies() == {"lost_topic"}
    b = Build()
    b.op("4", "delete", {"topic": "t", "inc": 1})
    b.op("4", "create", {"topic": "t", "inc": 2}, FAIL, {"exists": True})
    assert b.anomalies() == {"resurrected"}


def _silent_produce(b: Build, value: str, how: str = "node_silent") -> None:
    b.op(
        "0",
        "produce",
        {"topic": "t", "inc": 1, "writes": [[0, value]]},
        INFO,
        {"acked": [], "failed": [], "unknown": [value], how: True},
    )


def test_stalled_write_unless_the_storage_node_was_down() -> None:
    b = Build()
    _silent_produce(b, v(0))
    assert b.anomalies() == {"stalled_write"}
    b = Build()  # only the Meta Service was down: writes to the node must still be answered
    b.op("nemesis", "inject", {"fault": "kill_meta", "target": "meta"}, INFO)
    _silent_produce(b, v(0))
    b.op("nemesis", "heal", {"fault": "kill_meta", "target": "meta"}, INFO)
    assert b.anomalies() == {"stalled_write"}
    b = Build()
    b.op("nemesis", "inject", {"fault": "pause_node", "target": "node"}, INFO)
    _silent_produce(b, v(0))
    b.op("nemesis", "heal", {"fault": "pause_node", "target": "node"}, INFO)
    _silent_produce(b, v(1))  # within the grace period after the heal
    assert b.anomalies() == set()


def test_a_node_that_says_it_could_not_confirm_a_write_stalled_only_if_nothing_was_broken() -> None:
    b = Build()
    _silent_produce(b, v(0), "node_timed_out")
    assert b.anomalies() == {"stalled_write"}
    b = Build()  # the Meta Service was down: the ISR could not shrink, the node said so in time
    b.op("nemesis", "inject", {"fault": "pause_meta", "target": "meta"}, INFO)
    _silent_produce(b, v(0), "node_timed_out")
    b.op("nemesis", "heal", {"fault": "pause_meta", "target": "meta"}, INFO)
    assert b.anomalies() == set()


def test_an_invalid_write_must_be_refused_when_nothing_is_broken() -> None:
    b = Build()
    b.op(
        "0",
        "send_invalid",
        {"topic": "t", "inc": 1, "writes": [[0, v(0)]]},
        FAIL,
        {"acked": [], "failed": [v(0)], "unknown": []},
    )
    assert b.anomalies() == set()
    b.op(
        "0",
        "send_invalid",
        {"topic": "t", "inc": 1, "writes": [[0, v(1)]]},
        INFO,
        {"acked": [], "failed": [], "unknown": [v(1)]},
    )
    assert b.anomalies() == {"invalid_not_refused"}


def replica(b: Build, node: str, epoch: int, start: int, end: int, values: list[str], **fields: Any) -> None:
    """A node's copy of ``[start, end)`` as the replicated runs record it (digest from values)."""
    copy = {
        "node": node,
        "epoch": epoch,
        "start": start,
        "end": end,
        "sealed": True,
        "in_isr": True,
        "replica": True,
        "whole": len(values) == end - start,
        "digest": "|".join(values),
        "size": sum(map(len, values)),
        "problem": None,
        "records": [[start + i, value] for i, value in enumerate(values)],
        **fields,
    }
    b.op("final", "final_replica", {"topic": "t", "inc": 1, "partition": 0, **copy})


def replicated() -> Build:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], epoch=0, f="produce")
    b.write("t", 1, [(v(2), 0, 2)], epoch=1, f="produce")
    b.final("t", 1, 0, [(0, v(0)), (1, v(1)), (2, v(2))])
    b.chain("t", 1, 0, [(0, 0, 2), (1, 2, -1)])
    return b


def test_identical_replicas_pass_and_their_records_count_as_reads() -> None:
    b = replicated()
    for node in ("a", "b", "c"):
        replica(b, node, 0, 0, 2, [v(0), v(1)])
    replica(b, "d", 0, 0, 2, [v(0)], in_isr=False)  # not in the ISR: not judged
    assert b.anomalies() == set()


def test_replica_divergence_missing_copy_and_a_replica_holding_another_value() -> None:
    b = replicated()
    replica(b, "a", 0, 0, 2, [v(0), v(1)])
    replica(b, "b", 0, 0, 2, [v(0), v(9)])  # same length, other bytes
    replica(b, "c", 0, 0, 2, [v(0)])  # an ISR member without the whole segment
    b.written()
    assert b.anomalies() == {"replica_divergence", "replica_missing", "inconsistent_offsets"}


def test_without_an_isr_every_whole_copy_is_judged() -> None:
    b = replicated()
    replica(b, "a", 0, 0, 2, [v(0), v(1)], in_isr=False)
    replica(b, "b", 0, 0, 2, [v(1), v(0)], in_isr=False)
    assert "replica_divergence" in b.anomalies()


def test_a_read_of_data_that_later_vanished() -> None:
    b = Build()
    b.write("t", 1, unknown=[v(0), v(1)])
    b.read("t", 1, 0, 0, [v(0), v(1)])  # read, then gone from the final log
    b.final("t", 1, 0, [(0, v(0))])
    b.chain("t", 1, 0, [(0, 0, -1)])
    assert b.anomalies() == {"vanished_read"}
    b = Build()  # a record of a deleted incarnation read in the new one: resurrected, not vanished
    b.write("t", 1, unknown=[v(0)])
    b.write("t", 2, unknown=[v(1, inc=2)])
    b.read("t", 2, 0, 0, [v(0)])
    b.final("t", 2, 0, [(0, v(1, inc=2))])
    assert "vanished_read" not in b.anomalies() and "resurrected" in b.anomalies()


def test_histories_of_two_processes_merge_by_time() -> None:
    clock = iter([0.0, 1.0, 1.5, 3.0, 4.0])
    parent = History(clock=lambda: next(clock))
    parent.complete(parent.invoke("nemesis", "inject", {"fault": "x", "target": "net"}), INFO)
    child_clock = iter([2.0, 2.5])
    child = History(clock=lambda: next(child_clock), origin=0.0)
    child.complete(child.invoke("0", "read", {}), FAIL)
    parent.complete(parent.invoke("nemesis", "heal", {"fault": "x", "target": "net"}), INFO)
    parent.merge(child.ops())
    ops = parent.ops()
    assert [op.index for op in ops] == [0, 1, 2, 3, 4, 5]
    assert [(op.process, op.f) for op in ops] == [
        ("nemesis", "inject"),
        ("nemesis", "inject"),
        ("0", "read"),
        ("0", "read"),
        ("nemesis", "heal"),
        ("nemesis", "heal"),
    ]


def test_a_sealed_copy_that_is_not_what_the_seal_recorded() -> None:
    b = replicated()
    replica(b, "a", 0, 0, 2, [v(0), v(1)], crc32c=7, sealed_crc32c=7, sealed_size=len(v(0) + v(1)))
    assert b.anomalies() == set()
    replica(b, "b", 0, 0, 2, [v(0), v(1)], crc32c=8, sealed_crc32c=7, sealed_size=len(v(0) + v(1)))
    assert b.anomalies() == {"seal_checksum_mismatch"}


def offsets(b: Build, process: str, hw: int, partition: int = 0) -> None:
    """A reader's ``list_offsets`` answer: ``[partition, earliest, hw, log end, epoch]``."""
    b.op(process, "list_offsets", {"topic": "t", "inc": 1}, OK, {"offsets": [[partition, 0, hw, hw, 0]]})


def test_a_high_watermark_that_goes_back_for_one_reader() -> None:
    b = Build().written()
    offsets(b, "1", 5)
    b.read("t", 1, 0, 0, [v(n) for n in range(6)])  # process "1" reads offsets 0..5
    offsets(b, "1", 4)  # below what it read (6) and what it was told (5)
    assert b.anomalies() == {"hw_went_back"}
    b = Build()  # its own acks=all produce counts; an acks=1 one does not (not committed yet)
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], process="2", acks="1", f="produce")
    offsets(b, "2", 0)
    assert b.anomalies() == set()
    b.write("t", 1, [(v(2), 0, 2)], process="2", acks="all", f="produce")
    offsets(b, "2", 2)
    offsets(b, "2", 2)  # one drop, reported once
    assert b.anomalies() == {"hw_went_back"}
    assert check(b.history.ops()).anomalies["hw_went_back"].count == 1


def test_offsets_answered_through_a_route_to_a_deleted_incarnation() -> None:
    b = Build().written()
    b.op("setup", "create", {"topic": "t", "inc": 1}, OK, {"meta_incarnation": 11})
    b.op("4", "delete", {"topic": "t", "inc": 1})
    b.op("4", "create", {"topic": "t", "inc": 2}, OK, {"meta_incarnation": 12})
    b.op("1", "list_offsets", {"topic": "t", "inc": 2}, OK, {"offsets": [[0, 0, 400, 400, 9, 11]]})
    b.op("1", "list_offsets", {"topic": "t", "inc": 2}, OK, {"offsets": [[0, 0, 3, 3, 0, 12]]})
    found = check(b.history.ops()).anomalies
    assert set(found) == {"offsets_of_deleted_incarnation"}  # and the stale 400 is not held against 3


def test_a_high_watermark_behind_another_readers_is_tolerated() -> None:
    b = Build().written()
    offsets(b, "1", 7)
    offsets(b, "3", 4)  # another reader, perhaps at a follower: reported, not an anomaly
    analysis = check(b.history.ops())
    assert analysis.valid, analysis.report()
    assert analysis.tolerated["hw_behind_other_reader"].count == 1


def disk_setup(b: Build) -> None:
    b.op(
        "setup",
        "create",
        {"topic": "t", "inc": 1},
        OK,
        {"meta_incarnation": 11, "replication_factor": 3, "min_insync_replicas": 2},
    )
    b.op("nemesis", "membership", {}, OK, {"nodes": [["a", "n1"], ["b", "n2"], ["c", "n3"]]})


def stopped(b: Build, node: str, held: list[list[int]]) -> None:
    value = {"node": node, "host": node, "why": "pause", "shards": [["t", 0, 11, held]]}
    b.op("nemesis", "disk_snapshot", {"node": node}, OK, value)


def test_acks_all_acknowledged_while_both_followers_were_stopped_without_it() -> None:
    b = Build()
    disk_setup(b)
    stopped(b, "b", [[0, 2]])
    stopped(b, "c", [[0, 2]])
    b.write("t", 1, [(v(1), 0, 1)], acks="all")  # the stopped followers hold offset 1
    assert b.anomalies() == set()
    b.write("t", 1, [(v(2), 0, 2)], acks="all")  # on the leader alone
    b.write("t", 1, [(v(3), 0, 3)], acks="1")  # acks=1 promises one copy
    found = check(b.history.ops()).anomalies
    assert set(found) == {"acked_on_too_few_disks"} and found["acked_on_too_few_disks"].count == 1
    example = found["acked_on_too_few_disks"].examples[0]
    assert example["offset"] == 2 and example["stopped_without_it"] == ["b", "c"]
    b = Build()  # one follower stopped, the other running: two copies are possible
    disk_setup(b)
    stopped(b, "b", [[0, 2]])
    b.write("t", 1, [(v(2), 0, 2)], acks="all")
    b.op("nemesis", "thaw", {"node": "b"}, OK)
    stopped(b, "c", [[0, 2]])
    assert b.anomalies() == set()


def test_acks_all_held_by_too_few_nodes_files_at_the_end() -> None:
    b = Build()
    disk_setup(b)
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], acks="all")
    b.final("t", 1, 0, [(0, v(0)), (1, v(1))])
    b.chain("t", 1, 0, [(0, 0, -1)])
    replica(b, "a", 0, 0, 2, [v(0), v(1)], sealed=False)
    replica(b, "b", 0, 0, 2, [v(0), v(1)], sealed=False)
    assert b.anomalies() == set()
    b = Build()
    disk_setup(b)
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], acks="all")
    b.final("t", 1, 0, [(0, v(0)), (1, v(1))])
    b.chain("t", 1, 0, [(0, 0, -1)])
    replica(b, "a", 0, 0, 2, [v(0), v(1)], sealed=False)
    replica(b, "b", 0, 0, 2, [v(0)], sealed=False, in_isr=False)  # lost offset 1 (a lost disk)
    found = check(b.history.ops()).anomalies
    assert set(found) == {"acked_on_too_few_disks"}
    assert found["acked_on_too_few_disks"].examples[0]["held_by"] == ["a"]


def replay(
    b: Build, original: tuple[int, int], answer: tuple[int, int, bool] | None, values: list[str]
) -> None:
    value = {
        "topic": "t",
        "inc": 1,
        "partition": 0,
        "producer_id": 5,
        "sequence": 3,
        "values": values,
        "original": list(original),
    }
    if answer is None:
        b.op("0", "replay", value, INFO)
    else:
        b.op("0", "replay", value, OK, dict(zip(("offset", "epoch", "duplicate"), answer, strict=True)))


def test_a_replay_acknowledged_as_new_or_stored_twice() -> None:
    b = Build()
    b.write("t", 1, [(v(0), 0, 0), (v(1), 0, 1)], epoch=0, f="produce")
    replay(b, (0, 0), (0, 1, True), [v(0), v(1)])  # answered from the window: fine
    replay(b, (0, 0), None, [v(0), v(1)])  # unknown: tolerated
    analysis = check(b.history.ops())
    assert analysis.valid, analysis.report()
    assert analysis.tolerated["replay_not_confirmed"].count == 1
    replay(b, (0, 0), (2, 1, False), [v(0), v(1)])  # stored again at 2..3
    found = check(b.history.ops()).anomalies
    assert set(found) == {"replay_added_records"}
    b.final("t", 1, 0, [(0, v(0)), (1, v(1)), (2, v(0)), (3, v(1))])
    found = check(b.history.ops()).anomalies
    assert set(found) == {"replay_added_records", "duplicate"}
    assert found["replay_added_records"].count == 1  # one batch
    example = found["replay_added_records"].examples[0]
    assert [r[:3] for r in example["replays"]] == [[2, 1, False]] and "t#1/0/0" in example["stored_at"]
