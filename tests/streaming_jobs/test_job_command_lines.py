"""The Spark jobs' command lines: one spelling of "what is there, then exit" for all, and what they
print on stdout, a line per micro-batch and one for the whole run."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

from robustmq.streaming_jobs import compact_to_delta, tier_segments, topic_to_delta
from robustmq.streaming_jobs._compaction import MergeResult
from robustmq.streaming_jobs._delta import AppendedBatch
from robustmq.streaming_jobs._stopping import BatchGate
from robustmq.streaming_jobs.compact_to_delta import MergeReport
from robustmq.streaming_jobs.tier_segments import TierReport
from robustmq.streaming_jobs.topic_to_delta import AppendReport

JOBS: dict[str, tuple[Callable[[], object], list[str]]] = {
    "topic-to-delta": (topic_to_delta.parser, ["--topic", "t", "--table", "./t", "--checkpoint", "./c"]),
    "tier": (tier_segments.parser, []),
    "compact": (compact_to_delta.parser, ["--topic", "t", "--table", "./t"]),
}


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("flag", ["--once", "--available-now"])
def test_every_job_takes_once_and_available_now_as_its_alias(job: str, flag: str) -> None:
    make, required = JOBS[job]
    assert make().parse_args([*required, flag]).once is True  # type: ignore[attr-defined]
    assert make().parse_args(required).once is False  # type: ignore[attr-defined]
    assert "--once, --available-now" in make().format_help()  # type: ignore[attr-defined]


def test_a_gate_prints_its_report_after_a_micro_batch_that_ran_to_its_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def batch(frame: object, batch_id: int) -> None:
        if frame == "bad":
            raise ValueError("the batch failed")

    gate = BatchGate(batch, report=lambda batch_id: f"batch {batch_id}: done")
    gate("good", 3)
    with pytest.raises(ValueError):
        gate("bad", 4)
    assert capsys.readouterr().out == "batch 3: done\n"


def test_each_job_words_its_micro_batches_and_its_whole_run() -> None:
    appends = AppendReport("./tables/orders")
    appender = SimpleNamespace(last=AppendedBatch(rows=100_003, version=1))
    assert (
        appends.after_batch(appender, 0)
        == "batch 0: 100,003 rows appended to ./tables/orders (Delta version 1)"
    )
    appender.last = AppendedBatch(rows=0, version=None)  # a replayed batch: the table has it
    assert appends.after_batch(appender, 1) == (
        "batch 1: nothing new for ./tables/orders (it holds these records already)"
    )
    assert appends.at_end() == "100,003 rows appended to ./tables/orders; it is at Delta version 1"
    assert AppendReport("t").at_end() == "0 rows appended: t holds every record the topic had"

    tiers = TierReport("file:///tier")
    committer = SimpleNamespace(last=(4, 3 << 20, 0))
    assert tiers.after_batch(committer, 0) == "batch 0: 4 segments tiered (3.0 MiB)"
    committer.last = (1, 1 << 19, 2)
    assert tiers.after_batch(committer, 1) == (
        "batch 1: 1 segment tiered (0.5 MiB); 2 skipped (deleted by retention or with their topic meanwhile)"
    )
    assert tiers.at_end() == "5 segments tiered (3.5 MiB) to file:///tier"

    merges = MergeReport("./tables/profiles")
    merger = SimpleNamespace(
        last=MergeResult(records=30_000, fresh=30_000, keys=1_000, version=3, metrics={})
    )
    assert merges.after_batch(merger, 2) == (
        "batch 2: 30,000 records merged into ./tables/profiles as 1,000 keys (Delta version 3)"
    )
    assert merges.at_end() == "30,000 records merged into ./tables/profiles; it is at Delta version 3"
