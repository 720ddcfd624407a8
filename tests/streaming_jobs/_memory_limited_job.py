"""Run ``robustmq compact`` with a small driver: a JVM heap of ``--jvm-heap`` and a Python driver
process that may grow by at most ``--growth-mib`` once Spark is up.

    python tests/streaming_jobs/_memory_limited_job.py --jvm-heap 512m --growth-mib 160 -- \\
        --meta HOST:PORT --topic T --table PATH --once

In local mode the driver is two processes: the JVM (Spark's driver, whose heap also serves the
executors' JVM side) and this Python process, where ``foreachBatch`` runs; executors' Python
workers are separate processes the JVM starts. The JVM's limit is its heap (``-Xmx`` from
``spark.driver.memory``). This process's limit is on its resident memory, as a container's memory
limit is: its footprint once Spark is up, plus ``--growth-mib``. A watchdog thread ends the process
(exit 137, as the kernel's OOM killer would) as soon as the resident size passes it, and at the
end the kernel's own peak (``VmHWM``, which no polling can miss) is checked against it too (exit
137). The last line of stdout is JSON: the limit, the peak, and the job's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

EXIT_OUT_OF_MEMORY = 137


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _watch(limit_kib: int) -> None:
    while True:
        resident = _status_kib("VmRSS")
        if resident > limit_kib:
            print(
                json.dumps(
                    {"killed": True, "limit_mib": limit_kib // 1024, "resident_mib": resident // 1024}
                ),
                flush=True,
            )
            os._exit(EXIT_OUT_OF_MEMORY)
        threading.Event().wait(0.02)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jvm-heap", default="512m")
    parser.add_argument("--growth-mib", type=int, required=True)
    parser.add_argument("job", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from robustmq.streaming_jobs import compact_to_delta

    # The job's own session (compact_to_delta.main calls spark_session, whose getOrCreate returns
    # this one), with a small JVM heap: it must be set before the JVM starts.
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("robustmq-compact")
        .config("spark.driver.memory", args.jvm_heap)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.range(1).collect()  # one job: the driver's footprint with Spark up
    limit_kib = max(_status_kib("VmRSS"), _status_kib("VmHWM")) + args.growth_mib * 1024
    threading.Thread(target=_watch, args=(limit_kib,), daemon=True).start()
    code = compact_to_delta.main(job)
    peak_kib = _status_kib("VmHWM")
    print(
        json.dumps({"limit_mib": limit_kib // 1024, "peak_mib": peak_kib // 1024, "exit": code}), flush=True
    )
    return EXIT_OUT_OF_MEMORY if peak_kib > limit_kib else code


if __name__ == "__main__":
    sys.exit(main())
