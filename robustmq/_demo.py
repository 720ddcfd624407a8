"""``robustmq demo``: the main job, end to end on one machine.

1. start an embedded single-node cluster (Meta Service + storage node) in a
   temporary directory, on free loopback ports;
2. create an ``orders`` topic and produce a stream of order events (JSON
   values, customer keys, region and payment tags, timestamps over the last
   hours), while
3. a Spark Structured Streaming job (``topic_to_delta``) reads the topic with
   ``format("robustmq")`` and appends it exactly once to a Delta table;
4. seal the partitions' active segments;
5. query the Delta table with Spark SQL (revenue by country and by hour);
6. stop everything it started and remove the directory (unless ``--keep``).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

from robustmq._progress import Progress
from robustmq._records import TAGS_TYPE, TIMESTAMP_TYPE, coerce_records, now_ms

__all__ = ["run_demo"]

COUNTRIES = ["DE", "FR", "US", "BR", "JP", "IN", "GB", "ES"]
REGIONS = {"DE": "eu", "FR": "eu", "GB": "eu", "ES": "eu", "US": "na", "BR": "sa", "JP": "apac", "IN": "apac"}
PRODUCTS = ["keyboard", "monitor", "laptop", "headset", "dock", "webcam", "chair", "desk"]
PAYMENTS = ["card", "paypal", "invoice"]


def _orders(rng: random.Random, start: int, count: int, total: int, end_ms: int) -> pa.Table:
    """Order events ``start`` to ``start + count`` of ``total``, spread evenly over the 6 hours
    before ``end_ms``."""
    keys, values, stamps, tags = [], [], [], []
    for number in range(start, start + count):
        country = rng.choice(COUNTRIES)
        customer = f"customer-{rng.randrange(20_000):05d}"
        order = {
            "order": number,
            "customer": customer,
            "country": country,
            "product": rng.choice(PRODUCTS),
            "quantity": rng.randint(1, 4),
            "amount": round(rng.uniform(5, 900), 2),
        }
        keys.append(customer.encode())
        values.append(json.dumps(order, separators=(",", ":")).encode())
        stamps.append(end_ms - 6 * 3600 * 1000 + number * (6 * 3600 * 1000) // total)
        tags.append([REGIONS[country], rng.choice(PAYMENTS)])
    return coerce_records(
        pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "timestamp": pa.array(stamps, pa.int64()).cast(TIMESTAMP_TYPE),
                "tags": pa.array(tags, TAGS_TYPE),
            }
        )
    )


def _step(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.monotonic()


def run_demo(*, records: int = 400_000, keep: bool = False) -> int:
    from robustmq import connect
    from robustmq._embedded import EmbeddedCluster
    from robustmq.streaming_jobs import read_table, spark_session, start_topic_to_delta

    root = Path(tempfile.mkdtemp(prefix="robustmq-demo-"))
    began = time.monotonic()
    cluster = EmbeddedCluster(root / "cluster", meta_port=0, node_port=0)
    spark = None
    try:
        _step("starting an embedded single-node cluster")
        cluster.start()
        assert cluster.node is not None
        print(f"Meta Service {cluster.meta_address}, storage node {cluster.node.address}, data in {root}")
        with connect(cluster.meta_address) as client:
            client.create_topic("orders", 4, segment_bytes_max=8 * 1024 * 1024)
            print("created topic orders (4 partitions, segment engine, 8 MiB segments)")

            _step("starting Spark and the streaming ETL: topic orders -> Delta table (exactly once)")
            spark = spark_session("robustmq-demo")
            spark.sparkContext.setLogLevel("ERROR")
            table = str(root / "tables" / "orders")
            query = start_topic_to_delta(
                spark,
                meta_address=cluster.meta_address,
                table_path=table,
                checkpoint=str(root / "checkpoints" / "orders"),
                topic="orders",
                trigger_seconds=1.0,
                group="demo-etl",
            )
            print(f"query {query.name} running")

            _step(f"producing {records:,} order events while the ETL runs")
            end_ms = now_ms()
            failure: list[BaseException] = []

            def produce() -> None:
                rng = random.Random(42)
                progress = Progress("produce orders", records, unit="events")
                try:
                    with client.producer() as producer:
                        for start in range(0, records, 20_000):
                            count = min(20_000, records - start)
                            events = _orders(rng, start, count, records, end_ms)
                            producer.send_batch("orders", events).result(120)
                            progress.advance(count)
                    progress.done()
                except BaseException as error:  # reported by the main thread
                    failure.append(error)

            producer_thread = threading.Thread(target=produce, name="demo-producer")
            producer_thread.start()
            producer_thread.join(600)
            if failure:
                raise failure[0]

            _step("waiting for the ETL to catch up")
            progress = Progress("delta table orders", records, unit="rows")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                lag = client.group_lag("demo-etl", "orders").partitions
                done = sum(max(p.committed, 0) for p in lag)
                progress.update(done)
                if done >= records:
                    break
                if query.exception() is not None:
                    raise RuntimeError(f"the ETL query failed: {query.exception()}")
                time.sleep(0.5)
            progress.done()
            query.stop()
            print(f"the ETL committed group offsets for all {records:,} records; query stopped")

            _step("sealing the active segments")
            for partition in range(4):
                with contextlib.suppress(Exception):  # an empty active segment has nothing to seal
                    client.seal("orders", partition)
            description = client.describe_topic("orders")
            for shard in description.shards:
                chain = ", ".join(
                    f"epoch {s.epoch} [{s.start_offset}, {'...' if s.end_offset < 0 else s.end_offset})"
                    for s in shard.segments
                )
                print(f"  partition {shard.partition}: {chain}")

            _step("querying the Delta table with Spark SQL")
            read_table(spark, table).createOrReplaceTempView("orders")
            spark.sql("""
                select get_json_object(cast(value as string), '$.country') as country,
                       get_json_object(cast(value as string), '$.amount') as amount, timestamp
                from orders""").createOrReplaceTempView("parsed")
            total = spark.sql(
                "select count(*) as rows, count(distinct topic, partition, offset) as "
                "distinct_records from orders"
            ).collect()[0]
            print(f"the table holds {total['rows']:,} rows, {total['distinct_records']:,} distinct records")
            print("revenue by country:")
            spark.sql("""select country, count(*) as orders,
                                cast(sum(cast(amount as double)) as decimal(14, 2)) as revenue
                         from parsed group by country order by revenue desc""").show(truncate=False)
            print("orders per hour:")
            spark.sql("""select date_format(date_trunc('hour', timestamp), 'yyyy-MM-dd HH:00') as hour,
                                count(*) as orders
                         from parsed group by 1 order by 1""").show(10, truncate=False)
            ok = total["rows"] == records == total["distinct_records"]
        print(f"\ndemo {'finished' if ok else 'FAILED'} in {time.monotonic() - began:.0f}s", flush=True)
        return 0 if ok else 1
    finally:
        _step("stopping everything")
        if spark is not None:
            spark.stop()
        cluster.stop()
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        sys.stdout.flush()
