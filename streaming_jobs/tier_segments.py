"""Tier sealed segments to the cluster's object store: the ``robustmq tier`` Spark streaming job.

A streaming query over the sealed-segment stream (:mod:`._sealed_source`, one input partition per
segment): each micro-batch's segments are copied from their replicas, checked and written as
Parquet objects in executors, many in parallel (:mod:`._segment_upload`); then the driver records
each in the Meta Service (``MarkTiered``, idempotent). A replay after a crash anywhere (a killed
job, a lost executor) finds the objects already put, verifies them, and marks them again: every
sealed segment lands in the store exactly once and is recorded once (docs/tiering.md).

Run it::

    robustmq tier --meta 127.0.0.1:7070 --checkpoint ./checkpoints/tier
    robustmq tier --once          # what is sealed now, then exit

The command line checks that the Meta Service answers, that it has a tier URL, and that the
object store is reachable and usable, before it starts Spark (with ``--once``, also that a
segment waits to be tiered: if none does, it says so and how to seal, and exits 0); it stops the
query cleanly on Ctrl-C (SIGINT, exit 130) or SIGTERM (exit 143); see :func:`main`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from robustmq.connector._options import credential_options
from robustmq.errors import (
    InvalidConfig,
    ObjectStoreUnavailable,
    RetriableError,
    RobustMQError,
    ShardNotFound,
    TopicNotFound,
)
from robustmq.security._client_auth import Credentials

from ._scratch import CHECKPOINT_PREFIX, UPLOAD_PREFIX, scratch_dir, sweep
from ._sealed_source import SealedSegmentsSource, meta_client_for
from ._segment_upload import EXISTED, RESULT_SCHEMA, UPLOADED, shared_store, tier_partitions
from ._stopping import BatchGate, StopSignals, count_of, mib, run_gated_query
from .topic_to_delta import _at_least, _failure_message, add_meta_option, spark_session

__all__ = [
    "NOTHING_SEALED",
    "SegmentCommitter",
    "TierReport",
    "check_tier_url",
    "has_untiered",
    "main",
    "parser",
    "record_tiered",
    "start_tiering",
]

log = logging.getLogger("robustmq.jobs")

PROG = "robustmq tier"
EXIT_FAILED, EXIT_USAGE = 1, 2
# What `robustmq tier --once` prints, without starting Spark, when no segment waits to be tiered.
NOTHING_SEALED = (
    "0 segments sealed and not yet tiered: nothing to tier; seal with `robustmq segments seal TOPIC` "
    "or wait for segment_bytes_max / roll_interval_ms (robustmq topic describe TOPIC shows them)"
)

DESCRIPTION = r"""Tier sealed segments to the cluster's object store (a Spark streaming job).

Every sealed segment is copied from one of its replicas, checked against the
CRC-32C its seal recorded, written as one Parquet file at
TIER_URL/TOPIC/PARTITION/EPOCH-START.parquet and recorded in the Meta Service
as tiered. Many segments upload in parallel across Spark executors. Killed and
started again (with the same checkpoint or a new one), the job finishes what
was left: each segment is in the store once (docs/tiering.md).

examples:
  robustmq tier --meta 127.0.0.1:7070 --checkpoint ./checkpoints/tier
  robustmq tier --once

The tier URL is the Meta Service's (robustmq meta --tier-url). Before it
starts Spark, the job checks that the Meta Service answers, that it has a tier
URL, and that the store is reachable and writable. Only sealed segments are
tiered: with --once and none waiting, the job says so and exits 0 (seal with
robustmq segments seal TOPIC). It prints one line per micro-batch (segments
and bytes tiered) and, with --once, one at the end.

exit codes: 0 done (--once); 1 the query failed (an object that does not match
its segment, a segment no replica could serve), or the cluster or the store did
not answer; 2 bad arguments, no tier URL, or a store that refuses us (no such
bucket or directory, access denied); 130 stopped by Ctrl-C (SIGINT); 143
stopped by SIGTERM. Either signal stops the query cleanly; a second one ends
the job at once.
"""


def has_untiered(
    meta_address: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
) -> bool:
    """Whether any segment is sealed and not tiered yet (one ``ListSealed`` call)."""
    from robustmq._meta_client import MetaClient

    with MetaClient(meta_address, timeout_s=timeout_s, credentials=credentials) as meta:
        return bool(meta.list_sealed(0, limit=1, untiered_only=True).segments)


def check_tier_url(
    meta_address: str, *, timeout_s: float = 10.0, credentials: Credentials | None = None
) -> str:
    """The cluster's tier URL, checked: the Meta Service answers, has one, and its store is usable.

    Raises :class:`~robustmq.errors.InvalidConfig` when the cluster has no tier URL,
    :class:`~robustmq.errors.ObjectStoreError` when the store refuses us (naming its URL), and a
    :class:`~robustmq.errors.RetriableError` when the Meta Service or the store does not answer.
    """
    from robustmq._meta_client import MetaClient
    from robustmq.tier._store import ObjectStore

    with MetaClient(meta_address, timeout_s=timeout_s, credentials=credentials) as meta:
        url = meta.cluster_config().tier_url
    if not url:
        raise InvalidConfig(
            f"the cluster at {meta_address} has no tier URL: start its Meta Service with --tier-url "
            "(s3://bucket/prefix or file:///path)",
            setting="tier_url",
        )
    ObjectStore.from_url(url).check()
    return str(url)


class SegmentCommitter:
    """The ``foreachBatch`` function: upload the batch's segments in executors, then ``MarkTiered``.

    Runs on the driver (Py4J's callback thread). A segment whose upload found it gone from the
    chain, or whose ``MarkTiered`` says so (retention or a topic deletion in between), has its
    object deleted again: nothing would ever refer to it.
    """

    def __init__(
        self,
        *,
        meta_address: str,
        tier_url: str,
        timeout_s: float = 30.0,
        credentials: Credentials | None = None,
    ) -> None:
        self.meta_address = meta_address
        self.credentials = credentials
        self.tier_url = tier_url
        self.timeout_s = timeout_s
        self.tiered = 0  # segments recorded tiered by this process (for the log and tests)
        self.tiered_bytes = 0
        self.last: tuple[int, int, int] = (0, 0, 0)  # the latest batch's segments tiered, bytes, skipped

    def __call__(self, frame: Any, batch_id: int) -> None:
        started = time.monotonic()
        self.last = (0, 0, 0)
        upload = tier_partitions(self.meta_address, self.tier_url, self.timeout_s, self.credentials)
        rows = [row.asDict() for row in frame.mapInArrow(upload, RESULT_SCHEMA).collect()]
        if not rows:
            return
        store = shared_store(self.tier_url)
        meta = meta_client_for(self.meta_address, self.timeout_s, self.credentials)
        marked = marked_bytes = 0
        for row in rows:
            if row["outcome"] in (UPLOADED, EXISTED) and record_tiered(meta, store, row):
                marked += 1
                marked_bytes += row["object_bytes"]
        self.tiered += marked
        self.tiered_bytes += marked_bytes
        self.last = (marked, marked_bytes, len(rows) - marked)
        log.info(
            "batch %d: %d segments tiered (%d uploaded, %d found already put), %d skipped, in %.1f s",
            batch_id,
            marked,
            sum(row["outcome"] == UPLOADED for row in rows),
            sum(row["outcome"] == EXISTED for row in rows),
            len(rows) - marked,
            time.monotonic() - started,
        )


def record_tiered(meta: Any, store: Any, row: dict[str, Any]) -> bool:
    """``MarkTiered`` for one result row of an ``uploaded``/``existed`` segment; False (and the
    object deleted) if the segment left the chain since, so nothing would ever refer to it."""
    shard = f"{row['topic']}_{row['partition']}"
    try:
        meta.mark_tiered(
            shard,
            row["incarnation"],
            row["epoch"],
            row["object_url"],
            row["object_bytes"],
            row["max_timestamp_ms"],
        )
        return True
    except (TopicNotFound, ShardNotFound):
        pass
    except RobustMQError as error:
        if error.retriable or _still_sealed(meta, shard, row):
            raise
    log.info(
        "segment %s epoch %d left the chain before it was marked: deleting its object", shard, row["epoch"]
    )
    store.delete(store.key_of(row["object_url"]))
    return False


def _still_sealed(meta: Any, shard: str, row: dict[str, Any]) -> bool:
    """Whether the segment of ``row`` is still in its shard's chain (so a refusal is not "gone")."""
    try:
        info = meta.get_shard(shard)
    except (TopicNotFound, ShardNotFound):
        return False
    if info.incarnation != row["incarnation"]:
        return False
    return any(s.epoch == row["epoch"] and s.start_offset == row["start_offset"] for s in info.segments)


def start_tiering(
    spark: Any,
    *,
    meta_address: str,
    tier_url: str,
    checkpoint: str,
    once: bool = False,
    trigger_seconds: float = 10.0,
    max_segments_per_trigger: int | None = None,
    timeout_s: float = 30.0,
    gate: Callable[[Callable[[Any, int], None]], BatchGate] | None = None,
    credentials: Credentials | None = None,
) -> Any:
    """Start the tiering query (``once``: ``Trigger.AvailableNow``); returns it.

    ``credentials``: a secured cluster's (its source, the driver and the upload tasks log in).

    ``gate`` (``BatchGate``, say) wraps the ``foreachBatch`` function, so the caller can stop
    the query between micro-batches (:mod:`._stopping`).
    """
    spark.dataSource.register(SealedSegmentsSource)
    reader = (
        spark.readStream.format(SealedSegmentsSource.name())
        .option("metaAddress", meta_address)
        .option("requestTimeoutS", str(timeout_s))
        .options(**credential_options(credentials))
    )
    if max_segments_per_trigger:
        reader = reader.option("maxSegmentsPerTrigger", str(max_segments_per_trigger))
    committer = SegmentCommitter(
        meta_address=meta_address, tier_url=tier_url, timeout_s=timeout_s, credentials=credentials
    )
    writer = (
        reader.load()
        .writeStream.foreachBatch(committer if gate is None else gate(committer))
        .option("checkpointLocation", checkpoint)
        .queryName("robustmq_tier")
    )
    writer = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    )
    return writer.start()


def parser() -> argparse.ArgumentParser:
    """The command line of ``robustmq tier``."""
    from robustmq._arguments import OneLineArgumentParser

    parser = OneLineArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_meta_option(parser)
    parser.add_argument(
        "--once",
        "--available-now",
        dest="once",
        action="store_true",
        help="tier every segment sealed before the start, then exit (Trigger.AvailableNow; default: "
        "off, keep tiering new seals)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="the Spark checkpoint directory (default: a temporary one, removed at exit; a new "
        "checkpoint is safe, the job skips what is tiered already)",
    )
    parser.add_argument(
        "--trigger-seconds",
        type=_at_least(float, 0, "a number of seconds (0 or more)"),
        default=10.0,
        metavar="SECONDS",
        help="seconds between micro-batches (default 10)",
    )
    parser.add_argument(
        "--max-segments-per-trigger",
        type=_at_least(int, 1, "a positive integer"),
        default=100,
        metavar="N",
        help="at most N segments per micro-batch (default 100); a batch's segments are recorded "
        "tiered when all of it is uploaded",
    )
    parser.add_argument(
        "--timeout-s",
        type=_at_least(float, 1, "a number of seconds (1 or more)"),
        default=30.0,
        metavar="SECONDS",
        help="deadline of each request to the cluster (default 30)",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        metavar="URL",
        help="the Spark master (default local[2]: two local cores, two uploads at a time)",
    )
    return parser


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``robustmq tier``: exit codes 0 (done), 1 (the query failed, or the cluster or store did not
    answer), 2 (bad arguments, no tier URL, a store that refuses us), 130 (SIGINT), 143 (SIGTERM);
    every failure is one line on stderr."""
    args = parser().parse_args(argv)
    from robustmq.security._flags import credentials_of

    try:
        credentials = credentials_of(args)
    except RobustMQError as error:
        return _fail(error.message, EXIT_USAGE)
    args.credentials = credentials
    stop = StopSignals()
    stop.install()
    try:
        tier_url = check_tier_url(args.meta, timeout_s=min(args.timeout_s, 10.0), credentials=credentials)
        # --once with nothing sealed: say so and how to seal, rather than start Spark to tier nothing.
        if args.once and not has_untiered(
            args.meta, timeout_s=min(args.timeout_s, 10.0), credentials=credentials
        ):
            print(NOTHING_SEALED, flush=True)
            return 0
    except ObjectStoreUnavailable as error:  # its message names the store's URL
        return _fail(f"the object store did not answer: {error.message}", EXIT_FAILED)
    except RetriableError as error:
        return _fail(f"--meta {args.meta}: cannot reach the Meta Service: {error.message}", EXIT_FAILED)
    except RobustMQError as error:  # no tier URL, a store that refuses us: the setup's
        return _fail(error.message, EXIT_USAGE)
    if stop.event.is_set():
        return stop.announce(PROG)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # "found credentials in ...": noise
    sweep(UPLOAD_PREFIX)  # what jobs killed before left (executors on this machine)
    checkpoint = args.checkpoint or str(scratch_dir(CHECKPOINT_PREFIX))
    spark = spark_session("robustmq-tier", master=args.master)
    stop.install()  # the SparkContext installed its own SIGINT handler
    try:
        return _run(spark, args, stop, tier_url, checkpoint)
    finally:
        spark.stop()
        if args.checkpoint is None:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _run(spark: Any, args: argparse.Namespace, stop: StopSignals, tier_url: str, checkpoint: str) -> int:
    def start(gate: Callable[[Callable[[Any, int], None]], BatchGate]) -> Any:
        return start_tiering(
            spark,
            meta_address=args.meta,
            tier_url=tier_url,
            checkpoint=checkpoint,
            once=args.once,
            trigger_seconds=args.trigger_seconds,
            max_segments_per_trigger=args.max_segments_per_trigger,
            timeout_s=args.timeout_s,
            gate=gate,
            credentials=args.credentials,
        )

    try:
        return run_gated_query(
            spark, start, stop, prog=PROG, describe=_failure_message, report=TierReport(tier_url)
        )
    except RobustMQError as error:
        return _fail(error.message, EXIT_FAILED if error.retriable else EXIT_USAGE)


class TierReport:
    """The command line's lines on stdout (a :class:`._stopping.BatchReport`): one per micro-batch,
    ``batch 0: 4 segments tiered (2.1 MiB)``, and one at the end of a ``--once`` run."""

    def __init__(self, tier_url: str) -> None:
        self.tier_url = tier_url
        self.segments = 0
        self.bytes = 0

    def after_batch(self, batch: Any, batch_id: int) -> str | None:
        segments, size, skipped = batch.last
        self.segments += segments
        self.bytes += size
        line = f"batch {batch_id}: {count_of(segments, 'segment')} tiered ({mib(size)})"
        if skipped:
            line += f"; {skipped} skipped (deleted by retention or with their topic meanwhile)"
        return line

    def at_end(self) -> str | None:
        return f"{count_of(self.segments, 'segment')} tiered ({mib(self.bytes)}) to {self.tier_url}"


if __name__ == "__main__":
    sys.exit(main())
