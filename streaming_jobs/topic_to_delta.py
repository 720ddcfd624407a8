"""Materialise topics into a Delta table, exactly once across restarts and checkpoint resets.

Reads with the ``robustmq`` source (``group`` offsets committed, so ``robustmq
groups`` shows the job's lag) and appends every micro-batch to a Delta table
partitioned by date (see ``_delta``). Each record lands once, keyed by
``(topic, partition, offset)``, however often the job is killed and restarted,
whether from its checkpoint or after the checkpoint was deleted: the table
records how far each topic partition is in it, and a batch writes only what is
past that. At start the job creates the table or checks that its schema,
partitioning and protocol are the job's, and vacuums orphan files of crashed
batches older than ``--orphan-retention-hours``.

Run it::

    robustmq topic-to-delta --topic orders --table ./tables/orders --checkpoint ./checkpoints/orders
    robustmq topic-to-delta --topic orders --table s3://bucket/orders --checkpoint ./checkpoints/orders \
        --storage-option AWS_REGION=eu-west-1 [--fail-on-data-loss false] [--available-now]

Records that retention removed before the job read them fail the job with a
message saying so (``--fail-on-data-loss true``, the default), or are skipped
with a warning (``false``), as are records of a topic deleted or re-created
while the job was reading it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from robustmq._ready import announce_ready

from ._delta import PARTITION_BY, TABLE_SCHEMA, DeltaAppender, delta_spark_available
from ._table import MIN_ORPHAN_RETENTION_HOURS, prepare_table

__all__ = ["default_group", "main", "parser", "spark_session", "start_topic_to_delta"]

log = logging.getLogger("robustmq.jobs")


def spark_session(app_name: str, *, master: str = "local[2]", shuffle_partitions: int = 2) -> Any:
    """A SparkSession set up for RobustMQ jobs (UTC session time zone, filter pushdown on)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        # Larger Arrow batches between Python sources and the JVM: ~20% faster reads, measured.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )


def start_topic_to_delta(
    spark: Any,
    *,
    meta_address: str,
    table_path: str,
    checkpoint: str,
    topic: str | None = None,
    topic_pattern: str | None = None,
    available_now: bool = False,
    trigger_seconds: float = 1.0,
    max_records_per_trigger: int | None = None,
    group: str | None = None,
    storage_options: dict[str, str] | None = None,
    fail_on_data_loss: bool = True,
    orphan_retention_hours: int | None = 168,
) -> Any:
    """Prepare the table (create or check it, vacuum orphans) and start the query; returns it.

    ``group`` defaults to one named after the Delta table's id, so a run with a
    new checkpoint resumes from where the previous one's group got, whichever
    way the table's path is spelled, and a table dropped and rebuilt at the same
    path (another id) starts from the beginning of the topic. A table of another
    shape raises :class:`~robustmq.streaming_jobs.errors.TableMismatch` before the
    query starts.
    """
    location = prepare_table(
        table_path,
        TABLE_SCHEMA,
        PARTITION_BY,
        storage_options=storage_options,
        orphan_retention_hours=orphan_retention_hours,
    )
    group = group or default_group(location.table_id)
    # Without delta-spark, tasks read each micro-batch's offset ranges straight from the nodes as
    # Arrow and write Parquet: the records never become JVM rows (slow for nested columns).
    output = "records" if delta_spark_available(spark) else "ranges"
    reader = (
        spark.readStream.format("robustmq")
        .option("metaAddress", meta_address)
        .option("startingOffsets", "group")
        .option("group", group)
        .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
        .option("output", output)
    )
    reader = reader.option("topicPattern", topic_pattern) if topic_pattern else reader.option("topic", topic)
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", max_records_per_trigger)
    appender = DeltaAppender(
        location.uri,
        meta_address=meta_address,
        storage_options=storage_options,
        fail_on_data_loss=fail_on_data_loss,
    )
    name = (
        "topic_to_delta_"
        + hashlib.sha256(f"{topic or topic_pattern} {location.uri}".encode()).hexdigest()[:12]
    )
    writer = (
        reader.load()
        .writeStream.foreachBatch(appender)
        .option("checkpointLocation", checkpoint)
        .queryName(name)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    )
    return writer.start()


def default_group(table_id: str) -> str:
    """The job's consumer group for the Delta table of this id (``metaData.id``)."""
    return f"robustmq-topic-to-delta-{table_id}"


def _boolean(text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.strip().lower() == "true"


def _storage_option(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _retention_hours(text: str) -> int:
    try:
        hours = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of hours, got {text!r}") from None
    if hours != -1 and hours < MIN_ORPHAN_RETENTION_HOURS:
        raise argparse.ArgumentTypeError(
            f"expected -1 (never) or at least {MIN_ORPHAN_RETENTION_HOURS} hours, got {hours}: a shorter "
            "retention could delete the files of a batch another job on the table is about to commit"
        )
    return hours


def parser() -> argparse.ArgumentParser:
    """The command line of ``robustmq topic-to-delta``."""
    from robustmq.cli import OneLineArgumentParser  # usage errors in one line, as every subcommand

    parser = OneLineArgumentParser(
        prog="robustmq topic-to-delta",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--meta", default=os.environ.get("ROBUSTMQ_META", "127.0.0.1:7070"))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--topic")
    source.add_argument("--topic-pattern")
    parser.add_argument("--table", required=True, help="Delta table: a path or a URI delta-rs accepts")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--trigger-seconds", type=float, default=1.0)
    parser.add_argument("--max-records-per-trigger", type=int, default=None)
    parser.add_argument("--group", default=None, help="consumer group (default: derived from the table)")
    parser.add_argument(
        "--fail-on-data-loss",
        type=_boolean,
        default=True,
        metavar="{true,false}",
        help="records removed by retention before the job read them: fail (true) or skip them (false)",
    )
    parser.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a delta-rs storage option (repeatable), e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000",
    )
    parser.add_argument(
        "--orphan-retention-hours",
        type=_retention_hours,
        default=168,
        help=f"vacuum unreferenced files older than this at start (default 168, at least "
        f"{MIN_ORPHAN_RETENTION_HOURS}; -1 never)",
    )
    parser.add_argument("--master", default="local[2]")
    return parser


def _failure_message(failure: Any) -> str:
    """The RobustMQ error inside a Spark failure (a Python traceback wrapped in Java's), else the failure."""
    text = str(failure)
    found = re.findall(r"robustmq\.(?:streaming_jobs\.)?errors\.(\w+): ([^\n]+)", text)
    if found:
        name, message = found[-1]
        return f"{name}: {message}"
    return text.splitlines()[0] if text else repr(failure)


def main(argv: Sequence[str] | None = None) -> int:
    from robustmq.errors import RobustMQError

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = spark_session("robustmq-topic-to-delta", master=args.master)
    try:
        query = start_topic_to_delta(
            spark,
            meta_address=args.meta,
            table_path=args.table,
            checkpoint=args.checkpoint,
            topic=args.topic,
            topic_pattern=args.topic_pattern,
            available_now=args.available_now,
            trigger_seconds=args.trigger_seconds,
            max_records_per_trigger=args.max_records_per_trigger,
            group=args.group,
            storage_options=dict(args.storage_option) or None,
            fail_on_data_loss=args.fail_on_data_loss,
            orphan_retention_hours=None if args.orphan_retention_hours < 0 else args.orphan_retention_hours,
        )
    except RobustMQError as error:
        spark.stop()
        print(f"robustmq topic-to-delta: {error.message}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    announce_ready()
    while query.isActive and not stop.is_set():
        try:
            query.awaitTermination(1)
        except Exception:  # the query failed: query.exception() below says why
            break
    if query.isActive:
        query.stop()
    failure = query.exception()
    spark.stop()
    if failure is not None:
        log.debug("the query failed: %s", failure)
        print(f"robustmq topic-to-delta: the query failed: {_failure_message(failure)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
