"""Option checking of the robustmq data source, without Spark: unknown, inapplicable and refused
options are errors naming them; Kafka's names are aliases; docs/spark.md lists every option."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robustmq.connector import SinkOptions, SourceOptions
from robustmq.errors import InvalidConfig

DOCS = Path(__file__).parents[2] / "docs" / "spark.md"


def _read(mode: str = "read", **options: str) -> SourceOptions:
    return SourceOptions.parse({"metaAddress": "127.0.0.1:7070", **options}, mode)


@pytest.mark.parametrize("mode", ["read", "readStream"])
def test_an_unknown_option_is_an_error_naming_it(mode: str) -> None:
    with pytest.raises(InvalidConfig, match=r"option 'colour': unknown option for spark\.read"):
        _read(mode, topic="t", colour="red")
    with pytest.raises(InvalidConfig, match=r"option 'startingOffset'.*did you mean 'startingOffsets'"):
        _read(mode, topic="t", startingOffset="latest")


@pytest.mark.parametrize(
    "mode, options, name",
    [
        ("readStream", {"key": "k"}, "key"),
        ("readStream", {"tags": "eu"}, "tags"),
        ("readStream", {"minTimestamp": "1"}, "minTimestamp"),
        ("readStream", {"maxTimestamp": "1"}, "maxTimestamp"),
        ("readStream", {"endingOffsets": "latest"}, "endingOffsets"),
        ("readStream", {"endingTimestamp": "1"}, "endingTimestamp"),
        ("read", {"maxRecordsPerTrigger": "5"}, "maxRecordsPerTrigger"),
        ("read", {"maxOffsetsPerTrigger": "5"}, "maxOffsetsPerTrigger"),
        ("read", {"minOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger"),
        ("read", {"acks": "all"}, "acks"),
        ("readStream", {"maxRequestBytes": "100000"}, "maxRequestBytes"),
    ],
)
def test_an_option_of_another_kind_of_query_is_an_error_naming_it(
    mode: str, options: dict, name: str
) -> None:
    with pytest.raises(InvalidConfig, match=f"option '{name}': applies to .* only, not to spark.{mode}"):
        _read(mode, topic="t", **options)


def test_load_takes_the_options_of_either_kind_of_reading_but_not_both() -> None:
    """load() cannot tell spark.read from spark.readStream; options of both kinds cannot be right."""
    assert _read("load", topic="t", endingOffsets="latest").ending == "latest"
    assert _read("load", topic="t", maxOffsetsPerTrigger="5").max_records_per_trigger == 5
    with pytest.raises(
        InvalidConfig, match=r"option 'maxOffsetsPerTrigger': applies to spark\.readStream only, and 'key' to"
    ):
        _read("load", topic="t", key="k", maxOffsetsPerTrigger="5")
    with pytest.raises(InvalidConfig, match=r"option 'acks': applies to df.write, df.writeStream only"):
        _read("load", topic="t", acks="all")
    with pytest.raises(InvalidConfig, match=r"option 'colour': unknown option for spark.read/readStream"):
        _read("load", topic="t", colour="red")


@pytest.mark.parametrize("mode", ["write", "writeStream"])
def test_sink_refuses_source_options(mode: str) -> None:
    for name, value in [("startingOffsets", "earliest"), ("failOnDataLoss", "false"), ("subscribe", "t")]:
        with pytest.raises(InvalidConfig, match=f"option '{name}': applies to spark.read"):
            SinkOptions.parse({"topic": "t", name: value}, ["value"], mode)
    with pytest.raises(InvalidConfig, match=r"option 'colour': unknown option for df\.write"):
        SinkOptions.parse({"topic": "t", "colour": "red"}, ["value"], mode)


def test_kafka_names_are_aliases() -> None:
    options = _read(
        "readStream",
        subscribe="a, b",
        maxOffsetsPerTrigger="100",
        minOffsetsPerTrigger="10",
        maxTriggerDelay="30s",
    )
    assert options.topics == ("a", "b")
    assert (options.max_records_per_trigger, options.min_records_per_trigger) == (100, 10)
    assert options.max_trigger_delay_ms == 30_000
    assert _read("readStream", subscribePattern="a.*").topic_pattern == "a.*"
    sink = SinkOptions.parse({"topic": "t", "kafka.acks": "-1"}, ["value"], "writeStream")
    assert sink.acks == "all"


def test_the_sinks_acks_default_to_all_and_take_the_producers_spellings() -> None:
    assert SinkOptions.parse({"topic": "t"}, ["value"], "write").acks == "all"
    for raw, expected in (("QUORUM", "quorum"), ("1", "1"), (" all ", "all")):
        assert SinkOptions.parse({"topic": "t", "acks": raw}, ["value"], "write").acks == expected
    with pytest.raises(InvalidConfig, match="option 'acks': expected all, quorum or 1"):
        SinkOptions.parse({"topic": "t", "acks": "leader"}, ["value"], "write")


def test_spark_lower_cases_option_names() -> None:
    options = SourceOptions.parse({"subscribe": "a", "maxoffsetspertrigger": "7"}, "readStream")
    assert options.max_records_per_trigger == 7
    with pytest.raises(InvalidConfig, match="option 'maxOffsetsPerTrigger'"):
        SourceOptions.parse({"subscribe": "a", "maxoffsetspertrigger": "many"}, "readStream")


def test_a_name_and_its_alias_together_are_an_error() -> None:
    with pytest.raises(InvalidConfig, match="option 'subscribe': means the same as 'topic'"):
        _read(topic="a", subscribe="b")
    with pytest.raises(InvalidConfig, match="set either 'topic' or 'topicPattern'"):
        _read(topic="a", topicPattern="b.*")
    with pytest.raises(InvalidConfig, match="set either 'startingOffsets' or 'startingTimestamp'"):
        _read(topic="a", startingOffsets="latest", startingTimestamp="5")


@pytest.mark.parametrize(
    "name, reason",
    [
        ("kafka.bootstrap.servers", "metaAddress"),
        ("kafka.group.id", "group"),
        ("groupIdPrefix", "group"),
        ("kafka.max.poll.records", "Kafka's Java client"),
        ("kafkaConsumer.pollTimeoutMs", "requestTimeoutS"),
        ("fetchOffset.numRetries", "retries"),
        ("path", "topic option"),
    ],
)
def test_kafka_options_without_an_equivalent_are_refused_with_the_reason(name: str, reason: str) -> None:
    with pytest.raises(InvalidConfig, match=f"option '{name}': not supported: .*{reason}"):
        _read(topic="t", **{name: "x"})


def test_spark_own_options_reach_the_stream_writer_and_are_accepted() -> None:
    options = {"topic": "t", "checkpointlocation": "/tmp/ck", "queryname": "q"}
    assert SinkOptions.parse(options, ["value"], "writeStream").topic == "t"
    with pytest.raises(InvalidConfig, match="option 'checkpointlocation'"):
        SinkOptions.parse(options, ["value"], "write")


def test_timestamp_options() -> None:
    by_partition = '{"t": {"0": 1000, "1": 2000}}'
    options = _read(
        topic="t", startingOffsetsByTimestamp=by_partition, startingOffsetsByTimestampStrategy="error"
    )
    assert options.starting_by_timestamp == {"t": {0: 1000, 1: 2000}}
    assert options.starting_timestamp_strategy == "error"
    assert _read(topic="t", startingTimestamp="5").starting_timestamp_strategy == "latest"
    assert _read(topic="t", endingTimestamp="9").ending_timestamp_ms == 9
    assert _read(topic="t", endingOffsetsByTimestamp=by_partition).ending_by_timestamp == {
        "t": {0: 1000, 1: 2000}
    }
    with pytest.raises(InvalidConfig, match="option 'startingOffsetsByTimestampStrategy': applies only with"):
        _read(topic="t", startingOffsetsByTimestampStrategy="error")
    with pytest.raises(InvalidConfig, match=r"option 'startingOffsetsByTimestamp': .*milliseconds"):
        _read(topic="t", startingOffsetsByTimestamp='{"t": {"0": -1}}')
    with pytest.raises(
        InvalidConfig, match="option 'endingOffsetsByTimestamp': names topics that are not read"
    ):
        _read(topic="t", endingOffsetsByTimestamp='{"u": {"0": 1}}')


def test_assign() -> None:
    options = _read(assign='{"b": [1, 0], "a": [2]}')
    assert options.topics == ("a", "b") and options.assign == {"a": (2,), "b": (0, 1)}
    with pytest.raises(InvalidConfig, match="option 'assign'"):
        _read(assign='{"b": "0"}')
    with pytest.raises(
        InvalidConfig, match=r"option 'startingOffsets': topic 'a': partitions \[0\] are not assigned"
    ):
        _read(assign='{"a": [2]}', startingOffsets='{"a": {"0": 5}}')


def test_trigger_limits() -> None:
    with pytest.raises(
        InvalidConfig, match="option 'maxTriggerDelay': applies only with minRecordsPerTrigger"
    ):
        _read("readStream", topic="t", maxTriggerDelay="5s")
    with pytest.raises(InvalidConfig, match="option 'maxTriggerDelay': expected a duration"):
        _read("readStream", topic="t", minRecordsPerTrigger="5", maxTriggerDelay="soon")
    with pytest.raises(
        InvalidConfig, match="option 'minOffsetsPerTrigger': 50 is above maxOffsetsPerTrigger"
    ):
        _read("readStream", topic="t", minOffsetsPerTrigger="50", maxOffsetsPerTrigger="10")
    assert _read("readStream", topic="t", minRecordsPerTrigger="5").max_trigger_delay_ms == 15 * 60_000


def test_filters_do_not_combine_with_ranges_output() -> None:
    with pytest.raises(InvalidConfig, match="option 'key': does not apply with output=ranges"):
        _read(topic="t", output="ranges", key="k")


def test_group_on_a_batch_read_only_names_where_it_starts() -> None:
    with pytest.raises(InvalidConfig, match="option 'group': a batch read commits no offsets"):
        _read("read", topic="t", group="g")
    assert _read("read", topic="t", group="g", startingOffsets="group").group == "g"
    assert _read("readStream", topic="t", group="g").group == "g"
    assert _read("load", topic="t", group="g").group == "g"  # load() cannot tell which kind


@pytest.mark.parametrize(
    "options, name",
    [
        ({"acks": "0"}, "acks"),
        ({"acks": "2"}, "acks"),
        ({"maxRequestBytes": "1000"}, "maxRequestBytes"),
        ({"maxRequestBytes": str(100 * 1024 * 1024)}, "maxRequestBytes"),
    ],
)
def test_bad_sink_values_name_the_option(options: dict, name: str) -> None:
    with pytest.raises(InvalidConfig, match=f"option '{name}'"):
        SinkOptions.parse({"topic": "t", **options}, ["value"])


def test_docs_list_every_option_as_the_table_has_it() -> None:
    from robustmq.connector._option_table import documented, render_docs

    text = DOCS.read_text()
    assert documented(text) == render_docs(), (
        "docs/spark.md's option tables differ from connector/_option_table.py; regenerate them with "
        "python -c \"from robustmq.connector import _option_table as t; t.rewrite('docs/spark.md')\""
    )


def test_the_readme_creates_the_topics_its_spark_example_writes_to() -> None:
    """A write does not create its topic: a README example that skips `topic create` fails."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    writes = [
        (block.start() + write.start(), write.group(1))
        for block in re.finditer(r"```python\n.*?```", readme, re.S)
        for write in re.finditer(
            r'\.write(?:Stream)?\.format\("robustmq"\)(.*?)\.(?:start|save)\(', block.group(), re.S
        )
    ]
    assert writes, "the README's Python examples no longer write to a topic"
    for at, chain in writes:
        for topic in re.findall(r'\.option\("topic", "([^"]+)"\)', chain):
            created = re.search(rf"topic create {re.escape(topic)}\b", readme[:at])
            assert created, f"README writes to {topic!r} before creating it (robustmq topic create {topic})"


@pytest.mark.parametrize(
    "value, message",
    [
        ("earliest", r"option 'endingOffsets': 'earliest' cannot end a batch query"),
        (" EARLIEST ", r"option 'endingOffsets': 'earliest' cannot end a batch query"),
        (
            '{"t": {"0": 5, "1": -2}}',
            r"option 'endingOffsets': topic 't' partition 1: -2 \(earliest\) cannot end",
        ),
    ],
)
def test_earliest_is_refused_as_an_ending_as_kafka_does(value: str, message: str) -> None:
    """Kafka's source refuses both; here -2 used to read nothing and 'earliest' was 'not valid JSON'."""
    with pytest.raises(InvalidConfig, match=message):
        _read(topic="t", endingOffsets=value)
    assert _read(topic="t", endingOffsets='{"t": {"0": 5, "1": -1}}').ending == {"t": {0: 5, 1: -1}}


def test_meta_address_takes_the_instances_of_a_highly_available_meta_service() -> None:
    assert _read(metaAddress=" 127.0.0.1:7070, 127.0.0.1:7071", topic="t").meta_address == (
        "127.0.0.1:7070,127.0.0.1:7071"
    )
    with pytest.raises(InvalidConfig, match=r"option 'metaAddress': an empty Meta Service address"):
        _read(metaAddress="127.0.0.1:7070,,127.0.0.1:7071", topic="t")
    with pytest.raises(InvalidConfig, match=r"option 'metaAddress': invalid Meta Service address 'h2'"):
        _read(metaAddress="127.0.0.1:7070,h2", topic="t")
