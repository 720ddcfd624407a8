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
    robustmq topic-to-delta --topic orders --table s3://bucket/orders --checkpoint ./checkpoints/orders \\
        --storage-option AWS_REGION=eu-west-1 [--fail-on-data-loss false] [--once]

Records that retention removed before the job read them fail the job with a
message saying so (``--fail-on-data-loss true``, the default), or are skipped
with a warning (``false``), as are records of a topic deleted or re-created
while the job was reading it.

The command line checks the Meta Service and the topic before it starts Spark
or creates anything, and stops the query cleanly on Ctrl-C (SIGINT, exit 130)
or SIGTERM (exit 143); see :func:`main`.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from robustmq.connector._options import credential_options
from robustmq.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    InvalidConfig,
    RetriableError,
    RobustMQError,
    TopicNotFound,
)
from robustmq.security._client_auth import Credentials
from robustmq.security._flags import credentials_of

from ._delta import PARTITION_BY, TABLE_SCHEMA, AppendedBatch, DeltaAppender, delta_spark_available
from ._stopping import BatchGate, StopSignals, count_of, run_gated_query
from ._table import MIN_ORPHAN_RETENTION_HOURS, prepare_table

__all__ = ["check_source", "default_group", "main", "parser", "spark_session", "start_topic_to_delta"]

log = logging.getLogger("robustmq.jobs")

PROG = "robustmq topic-to-delta"
EXIT_FAILED, EXIT_USAGE = 1, 2

DESCRIPTION = r"""Materialise topics into a Delta table, exactly once across restarts and
checkpoint resets.

The job reads the topics with Spark and appends every micro-batch to a Delta
table partitioned by the records' UTC date. Each record lands once, keyed by
(topic, partition, offset), however often the job is stopped or killed and
started again (docs/spark.md, "Topics into Delta tables").

examples:
  robustmq topic-to-delta --topic orders --table ./tables/orders --checkpoint ./checkpoints/orders
  robustmq topic-to-delta --topic orders --table s3://bucket/orders --checkpoint ./checkpoints/orders \
      --storage-option AWS_REGION=eu-west-1 --once

Before it starts Spark or creates anything, the job checks that the Meta
Service answers and that every --topic exists. Records lost before the job
read them (removed by retention, or their topic deleted or re-created) fail
the job, or with --fail-on-data-loss false are skipped with a warning.

On stdout: ready once the query runs, one line per micro-batch (rows appended,
the table's Delta version) and, with --once, one line at the end; logs go to
stderr.

exit codes: 0 done (--once); 1 the query failed, or the cluster did
not answer; 2 bad arguments, no such topic, or a table of another shape; 130
stopped by Ctrl-C (SIGINT); 143 stopped by SIGTERM. Either signal stops the
query cleanly; a second one ends the job at once.
"""


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
    gate: Callable[[Callable[[Any, int], None]], BatchGate] | None = None,
    credentials: Credentials | None = None,
) -> Any:
    """Prepare the table (create or check it, vacuum orphans) and start the query; returns it.

    ``credentials``: a secured cluster's (passed to the source as its options, and used by the
    driver and the tasks that read offset ranges).

    ``gate`` (``BatchGate``, say) wraps the job's ``foreachBatch`` function, so the caller can
    stop the query between micro-batches (:mod:`._stopping`).

    ``group`` defaults to one named after the Delta table's id, so a run with a
    new checkpoint resumes from where the previous one's group got, whichever
    way the table's path is spelled, and a table dropped and rebuilt at the same
    path (another id) starts from the beginning of the topic. A table of another
    shape raises :class:`~robustmq.streaming_jobs.errors.TableMismatch` before the
    query starts. A ``topic`` that does not exist raises
    :class:`~robustmq.errors.TopicNotFound` before the table is created (see
    :func:`check_source`), unless ``fail_on_data_loss`` is false and the
    checkpoint has progress: the restarted query then goes on without it.
    """
    if _topics_must_exist(fail_on_data_loss, checkpoint):
        check_source(meta_address, topic, credentials=credentials)
    location = prepare_table(
        table_path,
        TABLE_SCHEMA,
        PARTITION_BY,
        storage_options=storage_options,
        orphan_retention_hours=orphan_retention_hours,
    )
    group = group or default_group(location.table_id)
    # Without delta-spark, tasks read each micro-batch's offset ranges straight from the nodes as
    # Arrow and write Parquet: the records never become JVM rows (slow for nested columns). The
    # source's output=offsets gives a row per offset, so that Spark's progress counts the records.
    output = "records" if delta_spark_available(spark) else "offsets"
    reader = (
        spark.readStream.format("robustmq")
        .option("metaAddress", meta_address)
        .option("startingOffsets", "group")
        .option("group", group)
        .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
        .option("output", output)
        .options(**credential_options(credentials))
    )
    reader = reader.option("topicPattern", topic_pattern) if topic_pattern else reader.option("topic", topic)
    if max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", max_records_per_trigger)
    appender = DeltaAppender(
        location.uri,
        meta_address=meta_address,
        storage_options=storage_options,
        fail_on_data_loss=fail_on_data_loss,
        credentials=credentials,
    )
    name = (
        "topic_to_delta_"
        + hashlib.sha256(f"{topic or topic_pattern} {location.uri}".encode()).hexdigest()[:12]
    )
    writer = (
        reader.load()
        .writeStream.foreachBatch(appender if gate is None else gate(appender))
        .option("checkpointLocation", checkpoint)
        .queryName(name)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    )
    return writer.start()


def check_source(
    meta_address: str, topic: str | None, *, timeout_s: float = 10.0, credentials: Credentials | None = None
) -> None:
    """The Meta Service answers and each topic of ``topic`` (one name or a comma-separated list)
    exists: one call, before Spark starts or anything is created.

    Raises :class:`~robustmq.errors.TopicNotFound` naming the first missing topic, or a
    :class:`~robustmq.errors.RetriableError` when the Meta Service does not answer within
    ``timeout_s``. A ``topicPattern`` job may start before its topics exist, so it is not
    checked. With ``failOnDataLoss=false`` callers skip the check, as the source does: a job
    restarted from its checkpoint then goes on without a topic deleted meanwhile.
    """
    import robustmq

    with robustmq.connect(meta_address, timeout_s=timeout_s, credentials=credentials) as client:
        existing = set(client.list_topics())
    for name in (t.strip() for t in (topic or "").split(",") if t.strip()):
        if name not in existing:
            raise TopicNotFound(f"topic {name!r} does not exist at {meta_address}", topic=name)


def _topics_must_exist(fail_on_data_loss: bool, checkpoint: str) -> bool:
    """Whether a missing ``--topic`` is an error before the start: always, except when lost records
    are skipped and the checkpoint has progress (a restart goes on without a deleted topic, as the
    source does). A checkpoint this process cannot list (a URI other than file://) counts as one
    with progress."""
    if fail_on_data_loss:
        return True
    parsed = urllib.parse.urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return False
    offsets = Path(urllib.parse.unquote(parsed.path) if parsed.scheme else checkpoint) / "offsets"
    return not (offsets.is_dir() and any(offsets.iterdir()))


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


def _at_least(convert: Callable[[str], float], minimum: float, what: str) -> Callable[[str], Any]:
    """An argument type: ``convert(text)``, at least ``minimum``; else an error saying ``what``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not minimum <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


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


def _meta_addresses(text: str) -> str:
    """``--meta`` (and ``$ROBUSTMQ_META``, its default, which argparse checks the same way)."""
    from robustmq._meta_addresses import parse_meta_addresses

    try:
        return ",".join(parse_meta_addresses(text))
    except InvalidConfig as error:
        raise argparse.ArgumentTypeError(error.message) from None


def add_meta_option(parser: argparse.ArgumentParser) -> None:
    """``--meta`` and the client security flags (``--user``, ``--password-file``, ``--tls-ca``,
    ``--tls-cert``, ``--tls-key``, falling back to ``ROBUSTMQ_*``), as every job's command line
    has them; :func:`robustmq.cli._security.credentials_of` reads the latter."""
    from robustmq.security._flags import add_client_flags

    parser.add_argument(
        "--meta",
        type=_meta_addresses,
        default=os.environ.get("ROBUSTMQ_META") or "127.0.0.1:7070",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the Meta Service; several: the instances of a highly available one, whose leader is "
        "followed (default: $ROBUSTMQ_META or 127.0.0.1:7070)",
    )
    add_client_flags(parser)


def add_trigger_options(parser: argparse.ArgumentParser) -> None:
    """``--trigger-seconds`` and ``--max-records-per-trigger`` of the jobs that read records."""
    parser.add_argument(
        "--trigger-seconds",
        type=_at_least(float, 0, "a number of seconds (0 or more)"),
        default=1.0,
        metavar="SECONDS",
        help="seconds between micro-batches (default 1; 0: one right after another)",
    )
    parser.add_argument(
        "--max-records-per-trigger",
        type=_at_least(int, 1, "a positive integer"),
        default=None,
        metavar="N",
        help="at most N records per micro-batch (default: everything waiting)",
    )


def add_storage_option(parser: argparse.ArgumentParser) -> None:
    """``--storage-option``, as every command that opens a Delta table has it."""
    parser.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a delta-rs storage option, repeatable, e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000 "
        "(default: none; delta-rs then reads its settings from the environment)",
    )


def add_table_job_options(parser: argparse.ArgumentParser) -> None:
    """``--storage-option``, ``--orphan-retention-hours`` and ``--master`` of the jobs writing a
    Delta table."""
    add_storage_option(parser)
    parser.add_argument(
        "--orphan-retention-hours",
        type=_retention_hours,
        default=168,
        metavar="HOURS",
        help=f"vacuum unreferenced files older than this at start (default 168, at least "
        f"{MIN_ORPHAN_RETENTION_HOURS}; -1 never)",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        metavar="URL",
        help="the Spark master (default local[2]: two local cores)",
    )


def parser() -> argparse.ArgumentParser:
    """The command line of ``robustmq topic-to-delta``."""
    from robustmq._arguments import OneLineArgumentParser  # usage errors in one line, as every subcommand

    parser = OneLineArgumentParser(
        prog="robustmq topic-to-delta",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_meta_option(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--topic",
        help="the topic to read, or a comma-separated list of topics "
        "(--topic or --topic-pattern is required)",
    )
    source.add_argument(
        "--topic-pattern",
        metavar="REGEX",
        help="read every topic whose whole name matches; topics created later are picked up",
    )
    parser.add_argument(
        "--table", required=True, help="the Delta table: a path or a URI delta-rs accepts (s3://, file://...)"
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="the Spark checkpoint directory; a new one resumes from the --group's offsets",
    )
    parser.add_argument(
        "--once",
        "--available-now",
        dest="once",
        action="store_true",
        help="append what the topics hold now, then exit (Trigger.AvailableNow; default: off, keep "
        "running and append new records)",
    )
    add_trigger_options(parser)
    parser.add_argument(
        "--group",
        default=None,
        help="the consumer group the job commits to, for lag and restarts with a new checkpoint "
        "(default: robustmq-topic-to-delta-ID, ID being the Delta table's id)",
    )
    parser.add_argument(
        "--fail-on-data-loss",
        type=_boolean,
        default=True,
        metavar="{true,false}",
        help="records lost before the job read them (retention, a topic deleted or re-created): "
        "fail (true, the default) or skip them with a warning (false)",
    )
    add_table_job_options(parser)
    return parser


def options_table(of: argparse.ArgumentParser | None = None) -> str:
    """A command's options (this one's by default) as the Markdown table in docs/spark.md (a test
    keeps them equal)."""
    lines = ["| option | meaning |", "|---|---|"]
    for action in (of or parser())._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[0]
        if action.nargs != 0:
            flag += f" {action.metavar or action.dest.upper()}"
        required = " (required)" if action.required else ""
        aliases = "".join(f" (or `{alias}`)" for alias in action.option_strings[1:])
        lines.append(f"| `{flag}`{required}{aliases} | {str(action.help).replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def _failure_message(failure: Any) -> str:
    """The RobustMQ error inside a Spark failure (a Python traceback wrapped in Java's), else the
    failure's first line, in the command line's terms."""
    text = str(failure)
    found = re.findall(r"robustmq\.(?:streaming_jobs\.)?errors\.(\w+): ([^\n]+)", text)
    if found:
        name, message = found[-1]
        return _in_cli_terms(f"{name}: {message}")
    return _in_cli_terms(text.splitlines()[0] if text else repr(failure))


def _in_cli_terms(message: str) -> str:
    """The source's hints name its option (``set failOnDataLoss=false``); here they name the flag."""
    message = re.sub(r"\bset failOnDataLoss=false\b", "run with --fail-on-data-loss false", message)
    return message.replace("failOnDataLoss", "--fail-on-data-loss")


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``robustmq topic-to-delta``: exit codes 0 (done), 1 (the query failed, or the cluster did not
    answer), 2 (bad arguments, no such topic, a table of another shape), 130 (SIGINT) and 143
    (SIGTERM); every failure is one line on stderr."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = StopSignals()
    stop.install()
    try:
        args.credentials = credentials_of(args)
        if _topics_must_exist(args.fail_on_data_loss, args.checkpoint):
            check_source(args.meta, args.topic, credentials=args.credentials)
    except InvalidConfig as error:
        return _fail(error.message, EXIT_USAGE)
    except (AuthenticationFailed, AuthorizationFailed) as error:  # who we are, what we may: the setup's
        return _fail(f"--meta {args.meta}: {error.message}", EXIT_USAGE)
    except TopicNotFound as error:
        where = f"no such topic at the Meta Service {args.meta} (robustmq topic list shows the topics)"
        return _fail(f"--topic {error.fields['topic']}: {where}", EXIT_USAGE)
    except RetriableError as error:
        return _fail(f"--meta {args.meta}: cannot reach the Meta Service: {error.message}", EXIT_FAILED)
    if stop.event.is_set():
        return stop.announce(PROG)
    spark = spark_session("robustmq-topic-to-delta", master=args.master)
    stop.install()  # the SparkContext installed its own SIGINT handler
    try:
        return _run(spark, args, stop)
    finally:
        spark.stop()


def _run(spark: Any, args: argparse.Namespace, stop: StopSignals) -> int:
    def start(gate: Callable[[Callable[[Any, int], None]], BatchGate]) -> Any:
        return start_topic_to_delta(
            spark,
            meta_address=args.meta,
            table_path=args.table,
            checkpoint=args.checkpoint,
            topic=args.topic,
            topic_pattern=args.topic_pattern,
            available_now=args.once,
            trigger_seconds=args.trigger_seconds,
            max_records_per_trigger=args.max_records_per_trigger,
            group=args.group,
            storage_options=dict(args.storage_option) or None,
            fail_on_data_loss=args.fail_on_data_loss,
            orphan_retention_hours=None if args.orphan_retention_hours < 0 else args.orphan_retention_hours,
            gate=gate,
            credentials=args.credentials,
        )

    report = AppendReport(args.table)
    try:
        return run_gated_query(spark, start, stop, prog=PROG, describe=_failure_message, report=report)
    except RobustMQError as error:  # a table of another shape, a bad option: the input's; else the cluster's
        return _fail(_in_cli_terms(error.message), EXIT_FAILED if error.retriable else EXIT_USAGE)


class AppendReport:
    """The command line's lines on stdout (a :class:`._stopping.BatchReport`): one per micro-batch,
    ``batch 3: 100,003 rows appended to ./tables/orders (Delta version 4)``, and one at the end of
    a ``--once`` run, the rows of the whole run and the table's version."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.rows = 0
        self.version: int | None = None
        self.by_delta_spark = 0  # micro-batches written by delta-spark, whose rows are not counted

    def after_batch(self, batch: Any, batch_id: int) -> str | None:
        last: AppendedBatch | None = getattr(batch, "last", None)
        if last is None:
            return None
        if last.rows is None:
            self.by_delta_spark += 1
            return f"batch {batch_id}: appended to {self.table} with delta-spark"
        if last.version is None:
            return f"batch {batch_id}: nothing new for {self.table} (it holds these records already)"
        self.rows += last.rows
        self.version = last.version
        rows = count_of(last.rows, "row")
        return f"batch {batch_id}: {rows} appended to {self.table} (Delta version {last.version})"

    def at_end(self) -> str | None:
        if self.by_delta_spark:
            batches = count_of(self.by_delta_spark, "micro-batch", "micro-batches")
            return f"{batches} appended to {self.table} with delta-spark"
        if self.version is None:
            return f"0 rows appended: {self.table} holds every record the topic had"
        return f"{count_of(self.rows, 'row')} appended to {self.table}; it is at Delta version {self.version}"


if __name__ == "__main__":
    sys.exit(main())
