"""A Spark streaming job for the sink crash test: copy one topic into another, slowly.

Usage: python -m tests.e2e._copy_job META SOURCE TARGET CHECKPOINT [ACKS]

Each micro-batch holds 20,000 records; a Python UDF sleeps a little per row, so
a batch's writes to the target (64 KiB requests) spread over about two seconds
and a kill lands mid-batch. The UDF returns its input unchanged: the output is
deterministic, as exactly-once needs.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    meta, source, target, checkpoint = sys.argv[1:5]
    acks = sys.argv[5] if len(sys.argv) > 5 else None
    from pyspark.sql import functions as F

    from robustmq.streaming_jobs import spark_session

    spark = spark_session("robustmq-copy-job")

    @F.udf("binary")
    def slow(value: bytes) -> bytes:
        time.sleep(0.0001)
        return value

    query = (
        spark.readStream.format("robustmq")
        .option("metaAddress", meta)
        .option("topic", source)
        .option("maxRecordsPerTrigger", 20_000)
        .load()
        .select("key", slow("value").alias("value"))
        .writeStream.format("robustmq")
        .option("metaAddress", meta)
        .option("topic", target)
        .option("maxRequestBytes", 64 * 1024)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
    )
    if acks is not None:
        query = query.option("acks", acks)
    query = query.start()
    print("ready", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
