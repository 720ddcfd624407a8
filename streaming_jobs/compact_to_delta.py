"""Compact a ``cleanup=compact`` topic into a Delta table keyed by ``key``, exactly once.

Reads the topic with the ``robustmq`` source (``group`` offsets committed, so
``robustmq groups`` shows the job's lag) and merges every micro-batch into a
Delta table bucketed by key, in Spark tasks (see :mod:`._compaction`): per key
the record with the highest offset wins, a record with a null value deletes its
key, and a replayed batch changes nothing, however often the job is killed and
restarted, whether from its checkpoint or after it was deleted. A micro-batch
holds about ``--max-bytes-per-trigger`` of records (256 MiB by default; with
``--once`` too), estimated from the size of the topic's newest records when the
job starts.

Run it::

    robustmq compact --topic profiles --table ./tables/profiles --checkpoint ./checkpoints/profiles
    robustmq compact --topic profiles --table s3://bucket/profiles --once \\
        --storage-option AWS_REGION=eu-west-1

Before Spark starts the command checks that the Meta Service answers, that the
topic exists and is ``cleanup=compact`` (a ``delete`` topic may hold records
without a key, which a table keyed by key cannot hold: refused), and that the
table is missing or a compacted table of this topic. Ctrl-C (exit 130) and
SIGTERM (143) stop the query between micro-batches.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from robustmq._records import COMPACT_POLICY
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

from ._compaction import (
    DEFAULT_BUCKETS,
    MAX_BUCKETS,
    CompactMerger,
    MergeResult,
    prepare_compact_table,
    topic_incarnation,
)
from ._stopping import BatchGate, StopSignals, count_of, run_gated_query
from .topic_to_delta import (
    _boolean,
    _failure_message,
    _in_cli_terms,
    add_meta_option,
    add_table_job_options,
    add_trigger_options,
    options_table,
    spark_session,
)

__all__ = ["compacted_topic", "default_group", "main", "parser", "records_per_trigger", "start_compaction"]

log = logging.getLogger("robustmq.jobs")

PROG = "robustmq compact"
EXIT_FAILED, EXIT_USAGE = 1, 2
MiB = 1024 * 1024
DEFAULT_MAX_BYTES_PER_TRIGGER = 256 * MiB
SAMPLE_RECORDS = 200  # the newest records of each partition, to estimate a record's size
GUESSED_RECORD_BYTES = 1024  # a record's size when the topic has none to measure

DESCRIPTION = r"""Compact a cleanup=compact topic into a Delta table keyed by key, exactly once.

Every micro-batch is reduced to the latest record per key (the highest offset)
and merged into the table: a newer record replaces the stored one, a record
with a null value (a tombstone) deletes its key. The merge runs in Spark tasks,
one per key bucket of the table, never on the driver; a micro-batch holds about
--max-bytes-per-trigger of records. A replayed micro-batch (after a crash or a
restart) changes nothing (docs/spark.md, "Compaction").

examples:
  robustmq compact --topic profiles --table ./tables/profiles --checkpoint ./checkpoints/profiles
  robustmq compact --topic profiles --table s3://bucket/profiles --once \
      --storage-option AWS_REGION=eu-west-1

Before it starts Spark or creates anything, the job checks that the Meta
Service answers, that --topic exists and is a cleanup=compact topic, and that
--table is missing or a compacted table of that topic.

On stdout: ready once the query runs, one line per micro-batch (records merged,
keys, the table's Delta version) and, with --once, one line at the end; logs go
to stderr.

exit codes: 0 done (--once); 1 the query failed, or the cluster did not answer;
2 bad arguments, no such topic, a topic that is not cleanup=compact, or a table
of another shape or topic; 130 stopped by Ctrl-C (SIGINT); 143 stopped by
SIGTERM. Either signal stops the query cleanly; a second one ends the job at once.
"""


def default_group(table_id: str) -> str:
    """The job's consumer group for the Delta table of this id (``metaData.id``)."""
    return f"robustmq-compact-{table_id}"


def default_checkpoint(table_path: str) -> str:
    """Where the checkpoint goes without ``--checkpoint``: a directory named after the table."""
    digest = hashlib.sha256(table_path.encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser("~"), ".robustmq", "checkpoints", f"compact-{digest}")


def compacted_topic(
    meta_address: str, topic: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
) -> int:
    """Check ``topic`` exists and is ``cleanup=compact``; returns its incarnation.

    Raises :class:`~robustmq.errors.TopicNotFound`, :class:`~robustmq.errors.InvalidConfig`
    (another cleanup policy), or a :class:`~robustmq.errors.RetriableError` when the Meta
    Service does not answer within ``timeout_s``.
    """
    import robustmq
    from robustmq.connector._offsets import identity_of

    with robustmq.connect(meta_address, timeout_s=timeout_s, credentials=credentials) as client:
        try:
            described = client.describe_topic(topic, tail=1).topic
        except TopicNotFound:
            raise TopicNotFound(f"topic {topic!r} does not exist at {meta_address}", topic=topic) from None
    if described.config.cleanup_policy != COMPACT_POLICY:
        raise InvalidConfig(
            f"topic {topic} is cleanup={described.config.cleanup_policy}, not cleanup=compact: its records "
            "need not have keys, and a compacted table is keyed by key. Create the topic with "
            "--cleanup compact (robustmq topic create NAME --cleanup compact)",
            topic=topic,
            cleanup_policy=described.config.cleanup_policy,
        )
    return topic_incarnation(identity_of(described))


def records_per_trigger(meta_address: str, topic: str, max_bytes: int, *, timeout_s: float = 10.0) -> int:
    """About how many of ``topic``'s records make ``max_bytes`` of Arrow data: ``max_bytes`` over
    the largest mean size of the newest :data:`SAMPLE_RECORDS` records of each partition
    (:data:`GUESSED_RECORD_BYTES` when the topic holds none). An estimate made once: records
    much larger later make larger micro-batches."""
    import robustmq
    from robustmq.errors import RobustMQError as Failed

    sizes = []
    with robustmq.connect(meta_address, timeout_s=timeout_s) as client:
        for partition, (start, high) in sorted(client.list_offsets(topic).items()):
            if high <= start:
                continue
            try:
                sample = client.read(topic, partition, max(start, high - SAMPLE_RECORDS), SAMPLE_RECORDS)
            except Failed as error:  # retention moved the start meanwhile, say: another partition tells
                log.info("could not sample %s partition %d: %s", topic, partition, error.message)
                continue
            if sample.num_rows:
                sizes.append(sample.nbytes / sample.num_rows)
    size = max(sizes, default=GUESSED_RECORD_BYTES)
    records = max(1, int(max_bytes // max(1.0, size)))
    log.info(
        "%s: records of about %d bytes (%s): %d records per micro-batch make %d MiB",
        topic,
        size,
        "sampled" if sizes else "guessed, the topic is empty",
        records,
        max_bytes // MiB,
    )
    return records


def start_compaction(
    spark: Any,
    *,
    meta_address: str,
    topic: str,
    table_path: str,
    checkpoint: str,
    once: bool = False,
    trigger_seconds: float = 1.0,
    max_records_per_trigger: int | None = None,
    max_bytes_per_trigger: int | None = DEFAULT_MAX_BYTES_PER_TRIGGER,
    buckets: int | None = None,
    group: str | None = None,
    storage_options: dict[str, str] | None = None,
    fail_on_data_loss: bool = True,
    orphan_retention_hours: int | None = 168,
    gate: Callable[[Callable[[Any, int], None]], BatchGate] | None = None,
    credentials: Credentials | None = None,
) -> Any:
    """Check the topic, prepare the table (create or check it, remove orphans), start the query.

    Returns the running ``StreamingQuery``. ``gate`` wraps the ``foreachBatch`` function
    (:class:`._stopping.BatchGate`). ``group`` defaults to one named after the table's id.
    A micro-batch holds at most ``max_records_per_trigger`` records and about
    ``max_bytes_per_trigger`` bytes (:func:`records_per_trigger`; None: no byte bound).
    ``buckets`` is the key bucket count of a table this call creates (default
    :data:`~._compaction.DEFAULT_BUCKETS`); an existing table keeps its own, and another
    count given here is refused (``TableMismatch``).
    """
    incarnation = compacted_topic(meta_address, topic, credentials=credentials)
    location = prepare_compact_table(
        table_path,
        topic=topic,
        incarnation=incarnation,
        buckets=buckets,
        storage_options=storage_options,
        orphan_retention_hours=orphan_retention_hours,
    )
    group = group or default_group(location.table_id)
    reader = (
        spark.readStream.format("robustmq")
        .option("metaAddress", meta_address)
        .option("topic", topic)
        .option("startingOffsets", "group")
        .option("group", group)
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true" if fail_on_data_loss else "false")
        .options(**credential_options(credentials))
    )
    limits = [max_records_per_trigger] if max_records_per_trigger else []
    if max_bytes_per_trigger:
        limits.append(records_per_trigger(meta_address, topic, max_bytes_per_trigger))
    if limits:
        reader = reader.option("maxRecordsPerTrigger", min(limits))
    merger = CompactMerger(
        location.uri,
        topic=topic,
        incarnation=incarnation,
        meta_address=meta_address,
        storage_options=storage_options,
        credentials=credentials,
        expected_batch_bytes=max_bytes_per_trigger,
    )
    merger.warm_up(spark)  # Python workers started and ready before the first batch, not during it
    name = "compact_" + hashlib.sha256(f"{topic} {location.uri}".encode()).hexdigest()[:12]
    writer = (
        reader.load()
        .writeStream.foreachBatch(merger if gate is None else gate(merger))
        .option("checkpointLocation", checkpoint)
        .queryName(name)
    )
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start()


_SIZE = re.compile(r"(\d+)\s*([kmg]?)(i?b)?", re.IGNORECASE)


def _byte_size(text: str) -> int:
    """``268435456``, ``256m``, ``256MiB``, ``1g``: bytes (k, m, g are powers of 1024), at least 1 MiB."""
    found = _SIZE.fullmatch(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"expected a size such as 256MiB or 268435456, got {text!r}")
    value = int(found[1]) * 1024 ** " kmg".index(found[2].lower() or " ")
    if value < MiB:
        raise argparse.ArgumentTypeError(f"expected at least 1MiB, got {text!r}")
    return value


def _buckets(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BUCKETS:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_BUCKETS}, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line of ``robustmq compact``."""
    from robustmq._arguments import OneLineArgumentParser

    parser = OneLineArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_meta_option(parser)
    parser.add_argument("--topic", required=True, help="the cleanup=compact topic to compact")
    parser.add_argument(
        "--table", required=True, help="the Delta table: a path or a URI delta-rs accepts (s3://, file://...)"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="the Spark checkpoint directory (default: ~/.robustmq/checkpoints/compact-HASH, HASH "
        "from --table); a new one resumes from the --group's offsets",
    )
    parser.add_argument(
        "--once",
        "--available-now",
        dest="once",
        action="store_true",
        help="compact what is there, then exit (Trigger.AvailableNow; default: off, keep running)",
    )
    add_trigger_options(parser)
    for action in parser._actions:  # here a micro-batch is bounded by bytes too
        if action.dest == "max_records_per_trigger":
            action.help = (
                "at most N records per micro-batch (default: as many as --max-bytes-per-trigger allows)"
            )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=_byte_size,
        default=DEFAULT_MAX_BYTES_PER_TRIGGER,
        metavar="SIZE",
        help="about this much record data per micro-batch, with --once too (default 256MiB; k, m, g "
        "are KiB, MiB, GiB), as a record count estimated from the topic's newest records at start",
    )
    parser.add_argument(
        "--buckets",
        type=_buckets,
        default=None,
        metavar="N",
        help=f"the key buckets of a table the job creates: each is merged by one task, so a bucket "
        f"must fit a task's memory (default {DEFAULT_BUCKETS}; an existing table keeps its own)",
    )
    parser.add_argument(
        "--group",
        default=None,
        help="the consumer group the job commits to, for lag and restarts with a new checkpoint "
        "(default: robustmq-compact-ID, ID being the Delta table's id)",
    )
    parser.add_argument(
        "--fail-on-data-loss",
        type=_boolean,
        default=True,
        metavar="{true,false}",
        help="records removed by retention before the job read them: fail (true, the default) or "
        "skip them with a warning (false)",
    )
    add_table_job_options(parser)
    return parser


def compact_options_table() -> str:
    """The options as the Markdown table in docs/spark.md (a test keeps them equal)."""
    return options_table(parser())


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``robustmq compact``: exit codes 0, 1, 2, 130, 143 (see the description); every failure is
    one line on stderr."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = StopSignals()
    stop.install()
    try:
        args.credentials = credentials_of(args)
    except InvalidConfig as error:
        return _fail(error.message, EXIT_USAGE)
    try:
        compacted_topic(args.meta, args.topic, credentials=args.credentials)
    except (AuthenticationFailed, AuthorizationFailed) as error:  # who we are, what we may: the setup's
        return _fail(f"--meta {args.meta}: {error.message}", EXIT_USAGE)
    except TopicNotFound:
        where = f"no such topic at the Meta Service {args.meta} (robustmq topic list shows the topics)"
        return _fail(f"--topic {args.topic}: {where}", EXIT_USAGE)
    except InvalidConfig as error:
        return _fail(f"--topic {args.topic}: {error.message}", EXIT_USAGE)
    except RetriableError as error:
        return _fail(f"--meta {args.meta}: cannot reach the Meta Service: {error.message}", EXIT_FAILED)
    if stop.event.is_set():
        return stop.announce(PROG)
    spark = spark_session("robustmq-compact", master=args.master)
    stop.install()  # the SparkContext installed its own SIGINT handler
    try:
        return _run(spark, args, stop)
    finally:
        spark.stop()


def _run(spark: Any, args: argparse.Namespace, stop: StopSignals) -> int:
    def start(gate: Callable[[Callable[[Any, int], None]], BatchGate]) -> Any:
        return start_compaction(
            spark,
            meta_address=args.meta,
            topic=args.topic,
            table_path=args.table,
            checkpoint=args.checkpoint or default_checkpoint(args.table),
            once=args.once,
            trigger_seconds=args.trigger_seconds,
            max_records_per_trigger=args.max_records_per_trigger,
            max_bytes_per_trigger=args.max_bytes_per_trigger,
            buckets=args.buckets,
            group=args.group,
            storage_options=dict(args.storage_option) or None,
            fail_on_data_loss=args.fail_on_data_loss,
            orphan_retention_hours=None if args.orphan_retention_hours < 0 else args.orphan_retention_hours,
            gate=gate,
            credentials=args.credentials,
        )

    report = MergeReport(args.table)
    try:
        return run_gated_query(spark, start, stop, prog=PROG, describe=_failure_message, report=report)
    except RobustMQError as error:  # a table of another shape or topic: the input's; else the cluster's
        return _fail(_in_cli_terms(error.message), EXIT_FAILED if error.retriable else EXIT_USAGE)


class MergeReport:
    """The command line's lines on stdout (a :class:`._stopping.BatchReport`): one per micro-batch,
    ``batch 2: 30,000 records merged into ./tables/profiles as 1,000 keys (Delta version 3)``, and
    one at the end of a ``--once`` run."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.records = 0
        self.version: int | None = None

    def after_batch(self, batch: Any, batch_id: int) -> str | None:
        last: MergeResult | None = getattr(batch, "last", None)
        if last is None:
            return None
        if last.version is None:
            return f"batch {batch_id}: nothing new for {self.table} (it holds these records already)"
        self.records += last.fresh
        self.version = last.version
        return (
            f"batch {batch_id}: {count_of(last.fresh, 'record')} merged into {self.table} as "
            f"{count_of(last.keys, 'key')} (Delta version {last.version})"
        )

    def at_end(self) -> str | None:
        if self.version is None:
            return f"0 records merged: {self.table} holds every record the topic had"
        merged = count_of(self.records, "record")
        return f"{merged} merged into {self.table}; it is at Delta version {self.version}"


if __name__ == "__main__":
    sys.exit(main())
