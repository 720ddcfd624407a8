"""OPTIMIZE then VACUUM a Delta table, safe while the streaming jobs write it.

``robustmq table-maintenance --table PATH`` compacts small files (delta-rs
``optimize.compact()``: files rewritten into larger ones, ``dataChange=false``)
and then vacuums files that versions older than the retention removed. Why it
is safe next to ``robustmq compact`` and ``robustmq topic-to-delta``:

- OPTIMIZE commits with Delta's optimistic concurrency: when a job's commit
  (a MERGE that rewrote the same files) lands first, delta-rs refuses
  OPTIMIZE's commit, and it is retried from the new version (up to
  :data:`OPTIMIZE_ATTEMPTS` times); a MERGE that loses to OPTIMIZE is retried
  by the job the same way. Nothing is half-applied: a commit is one atomic
  log entry.
- VACUUM removes only files that a version removed at least ``--retain-hours``
  ago (Delta's tombstones; not the "full" mode that also deletes files no
  version references, which would take the files of a micro-batch being
  committed right now). A reader or writer working from a snapshot younger
  than the retention still finds every file it needs. The default is Delta's
  168 hours; under 1 hour is refused unless ``--allow-short-retention``.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from robustmq.errors import InvalidConfig, RobustMQError

from ._table import TableLocation, open_table
from .errors import TableConflict

__all__ = ["MIN_RETAIN_HOURS", "OPTIMIZE_ATTEMPTS", "MaintenanceResult", "main", "maintain", "parser"]

log = logging.getLogger("robustmq.jobs")

PROG = "robustmq table-maintenance"
EXIT_FAILED, EXIT_USAGE = 1, 2
DEFAULT_RETAIN_HOURS = 168  # Delta's delta.deletedFileRetentionDuration default
MIN_RETAIN_HOURS = 1  # below this, a snapshot a running job still reads may lose its files
OPTIMIZE_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    """What a run did: files OPTIMIZE removed and added (0 and 0: nothing to compact), the
    versions before and after, and the files VACUUM deleted."""

    files_removed: int
    files_added: int
    version_before: int
    version_after: int
    vacuumed: list[str]
    attempts: int


def maintain(
    table_path: str,
    *,
    retain_hours: int = DEFAULT_RETAIN_HOURS,
    allow_short_retention: bool = False,
    storage_options: Mapping[str, str] | None = None,
    target_size_bytes: int | None = None,
) -> MaintenanceResult:
    """OPTIMIZE (retried on conflicting commits), then VACUUM files removed over ``retain_hours`` ago.

    Raises :class:`~robustmq.errors.InvalidConfig` for a retention under
    :data:`MIN_RETAIN_HOURS` without ``allow_short_retention``, and
    :class:`~robustmq.streaming_jobs.errors.TableConflict` when OPTIMIZE lost
    :data:`OPTIMIZE_ATTEMPTS` races in a row.
    """
    from deltalake import CommitProperties

    if retain_hours < 0 or (retain_hours < MIN_RETAIN_HOURS and not allow_short_retention):
        raise InvalidConfig(
            f"--retain-hours {retain_hours:g} is below {MIN_RETAIN_HOURS:g}: a job or reader working from "
            "an older snapshot could lose files it still needs (pass --allow-short-retention if nothing "
            "else uses the table)",
            retain_hours=retain_hours,
        )
    location = TableLocation.parse(table_path)
    table = open_table(location, storage_options)
    before = int(table.version())
    metrics: dict[str, Any] = {}
    attempt = 0
    for attempt in range(1, OPTIMIZE_ATTEMPTS + 1):
        try:
            metrics = table.optimize.compact(
                target_size=target_size_bytes,
                commit_properties=CommitProperties(max_commit_retries=3),
            )
            break
        except Exception as error:
            if not _is_conflict(error):
                raise
            if attempt == OPTIMIZE_ATTEMPTS:
                raise TableConflict(
                    f"OPTIMIZE of {location.uri} lost {attempt} races in a row to other commits: {error}; "
                    "nothing was changed, run it again later",
                    table=location.uri,
                    version=int(table.version()),
                ) from error
            pause = min(2.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0)
            log.info("OPTIMIZE conflicted with another commit (%s); retrying in %.2fs", error, pause)
            time.sleep(pause)
            table = open_table(location, storage_options)
    table.update_incremental()
    vacuumed = table.vacuum(
        retention_hours=retain_hours,
        dry_run=False,
        enforce_retention_duration=False,  # checked above, with our own floor
        full=False,  # tombstones only: never files a commit in flight is about to reference
    )
    return MaintenanceResult(
        files_removed=int(metrics.get("numFilesRemoved", 0)),
        files_added=int(metrics.get("numFilesAdded", 0)),
        version_before=before,
        version_after=int(table.version()),
        vacuumed=list(vacuumed),
        attempts=attempt,
    )


def _is_conflict(error: Exception) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(error, CommitFailedError) or "concurrent" in str(error).lower()


def parser() -> argparse.ArgumentParser:
    """The command line of ``robustmq table-maintenance``."""
    from robustmq._arguments import OneLineArgumentParser

    from .topic_to_delta import add_storage_option

    parser = OneLineArgumentParser(
        prog=PROG,
        description="Compact a Delta table's small files (OPTIMIZE), then delete files removed longer "
        "ago than the retention (VACUUM). Safe while robustmq compact and robustmq topic-to-delta "
        "write the table (docs/spark.md, 'Table maintenance').",
    )
    parser.add_argument(
        "--table", required=True, help="the Delta table: a path or a URI delta-rs accepts (s3://, file://...)"
    )
    parser.add_argument(
        "--retain-hours",
        type=int,
        default=DEFAULT_RETAIN_HOURS,
        metavar="H",
        help=f"vacuum files removed more than H hours ago (default {DEFAULT_RETAIN_HOURS:g}, Delta's; "
        f"at least {MIN_RETAIN_HOURS:g} unless --allow-short-retention)",
    )
    parser.add_argument(
        "--allow-short-retention",
        action="store_true",
        help="allow --retain-hours below 1 (default: off; only when nothing else reads or writes the table)",
    )
    parser.add_argument(
        "--target-size-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="the size OPTIMIZE aims at (default: the table's delta.targetFileSize, else 100 MiB)",
    )
    add_storage_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``robustmq table-maintenance``: 0 done, 1 the table or store failed, 2 bad input; one line
    on stderr for a failure, what was done on stdout."""
    from deltalake.exceptions import TableNotFoundError

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        done = maintain(
            args.table,
            retain_hours=args.retain_hours,
            allow_short_retention=args.allow_short_retention,
            storage_options=dict(args.storage_option) or None,
            target_size_bytes=args.target_size_bytes,
        )
    except TableNotFoundError:
        return _fail(f"--table {args.table}: no Delta table there", EXIT_USAGE)
    except RobustMQError as error:
        usage = isinstance(error, InvalidConfig)
        return _fail(error.message, EXIT_USAGE if usage else EXIT_FAILED)
    except Exception as error:  # delta-rs / object store: one line, no traceback
        log.debug("table maintenance failed", exc_info=True)
        first = (str(error).splitlines() or [type(error).__name__])[0]
        return _fail(f"--table {args.table}: {type(error).__name__}: {first}", EXIT_FAILED)
    print(
        f"optimize: {done.files_removed} files compacted into {done.files_added} "
        f"(version {done.version_before} -> {done.version_after}"
        f"{'' if done.attempts <= 1 else f', after {done.attempts - 1} conflicting commits'})"
    )
    print(f"vacuum: {len(done.vacuumed)} files removed (removed more than {args.retain_hours:g} h ago)")
    return 0


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
