"""Kafka's lag metrics computed from a stream's progress, without Spark."""

from __future__ import annotations

import json

from robustmq.connector import offsets_behind_latest


def _progress(*sources: dict) -> dict:
    return {"sources": list(sources)}


def test_lag_per_partition_as_kafka_computes_it_and_per_topic() -> None:
    source = {
        "endOffset": json.dumps({"a": {"0": 10, "1": 7}, "@topics": {"a": {"created_ms": 1}}}),
        "latestOffset": json.dumps({"a": {"0": 12, "1": 7}, "b": {"0": 5}, "@topics": {}}),
    }
    (lag,) = offsets_behind_latest(_progress(source))
    # b partition 0 was not read yet: behind by all of it (Kafka counts such a partition from 0).
    assert lag == {
        "minOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 5,
        "avgOffsetsBehindLatest": 7 / 3,
        "offsetsBehindLatestByTopic": {"a": 2, "b": 5},
    }


def test_other_sources_and_missing_latest_offsets_give_nothing() -> None:
    rate = {"endOffset": "12", "latestOffset": "15"}
    files = {"endOffset": '{"logOffset": 3}', "latestOffset": '{"logOffset": 4}'}
    unreported = {"endOffset": '{"a": {"0": 1}}', "latestOffset": "None"}
    gone_back = {"endOffset": '{"a": {"0": 9}}', "latestOffset": '{"a": {"0": 4}}'}
    lags = offsets_behind_latest(json.dumps(_progress(rate, files, unreported, gone_back)))
    assert lags[:3] == [{}, {}, {}]
    assert lags[3]["maxOffsetsBehindLatest"] == 0
