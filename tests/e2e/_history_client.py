"""The client side of a history run in its own network namespace (a child process).

``python -m tests.e2e._history_client --seed S --variant V --meta HOST:PORT --out F --origin T
[--operations A,B] [--credentials DIR --password-file F]`` derives the run's settings from the
seed (and the nemesis operations asked for), creates the topics, runs the workers,
and talks to the parent (which runs the servers and the nemesis) over lines:

- it prints ``created`` once the workers run (or ``unsupported <reason>`` and
  exits 3 when the cluster refuses replicated topics);
- on ``stop`` (stdin) it stops the workers (bounded), prints ``stopped``;
- on ``final`` (sent once every fault is healed) it settles, probes and reads
  back every partition, writes its history (times counted from the parent's
  ``--origin`` on the same monotonic clock) to ``--out`` and prints ``done``.

A parent that dies closes stdin: the child then stops its workers and exits.

On a secured cluster (``--credentials``: a :class:`tests.e2e._history_secure.SecureSetup`)
the admin creates the topics, the workload's user and its ACLs and waits until every node
has them; the workers and the final phase then run as that user.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from tests.e2e._history import History
from tests.e2e._history_run import ReplicationUnavailable, create_topics, final_phase, join_workers
from tests.e2e._history_secure import SecureSetup, grant
from tests.e2e._history_worker import Worker
from tests.e2e._history_workload import Settings


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--meta", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--origin", type=float, required=True)
    parser.add_argument("--operations", default="", help="comma-separated (see Settings.derive)")
    parser.add_argument("--credentials", default="", help="a secured cluster: the credentials directory")
    parser.add_argument("--password-file", default="", help="the workload user's password")
    args = parser.parse_args(argv)
    secure = SecureSetup.from_argv(args.credentials, args.password_file) if args.credentials else None
    admin = secure.admin() if secure else None
    user = secure.worker() if secure else None
    settings = Settings.derive(args.seed, args.variant, tuple(filter(None, args.operations.split(","))))
    history = History(origin=args.origin)
    stop = threading.Event()
    try:
        slots = create_topics(settings, history, args.meta, admin)
    except ReplicationUnavailable as refused:
        _say(f"unsupported {refused}")
        return 3
    if secure is not None:
        grant(settings, secure, args.meta, settings.admin_timeout_s)
    workers = [
        Worker(index, settings, slots, history, args.meta, stop, user)
        for index in range(len(settings.worker_seeds))
    ]
    for worker in workers:
        worker.start()
    _say("created")
    command = sys.stdin.readline().strip()
    stop.set()
    join_workers(workers, settings, history)
    _say("stopped")
    if command == "stop" and sys.stdin.readline().strip() == "final":
        final_phase(settings, slots, history, args.meta, user)
    history.dump(args.out)
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
