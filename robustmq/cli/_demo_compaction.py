"""``robustmq demo``'s compaction step: a keyed topic of customer profiles into a Delta table.

:func:`compact_customers` creates a ``cleanup=compact`` topic, produces 1,000 customer
profiles in three rounds of updates and deletes 100 customers (tombstones: a null
value), runs the compaction job once (``robustmq compact``, a Spark streaming query with
``Trigger.AvailableNow``, here in the demo's own Spark session), then checks that the
Delta table holds exactly the latest profile of every live customer and queries it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["compact_customers"]

TOPIC = "customers"
CUSTOMERS = 1_000
ROUNDS = 3
DELETED = 100
COMPACT_TIMEOUT_S = 180.0
CITIES = ["Berlin", "Paris", "Austin", "Recife", "Osaka", "Pune", "Leeds", "Sevilla"]
TIERS = ["basic", "plus", "pro"]


def compact_customers(
    spark: Any, client: Any, *, meta_address: str, root: Path, wait: Callable[[float], None]
) -> bool:
    """Produce, compact and check the customer profiles; True if the table is the expected one.

    ``wait(seconds)`` sleeps, raising if the demo is being stopped.
    """
    from robustmq.cli._demo_tiering import run_once
    from robustmq.streaming_jobs.compact_to_delta import start_compaction

    client.create_topic(TOPIC, 2, cleanup_policy="compact")
    expected = _produce(client)
    print(
        f"produced {CUSTOMERS:,} customer profiles x {ROUNDS} rounds of updates and {DELETED} deletes "
        f"(tombstones) to {TOPIC} (cleanup=compact)"
    )
    table_path = str(root / "tables" / TOPIC)
    query = start_compaction(
        spark,
        meta_address=meta_address,
        topic=TOPIC,
        table_path=table_path,
        checkpoint=str(root / "checkpoints" / TOPIC),
        once=True,
    )
    if not run_once(query, "the compaction job", COMPACT_TIMEOUT_S, wait):
        return False
    return _check(spark, table_path, expected)


def _produce(client: Any) -> dict[bytes, bytes]:
    """Every round updates every customer; then some are deleted. The expected table."""
    rng = random.Random(7)
    expected: dict[bytes, bytes] = {}
    producer = client.producer()
    try:
        for round_ in range(1, ROUNDS + 1):
            keys, values = [], []
            for number in range(CUSTOMERS):
                key = f"customer-{number:05d}".encode()
                profile = {
                    "customer": number,
                    "city": rng.choice(CITIES),
                    "tier": rng.choice(TIERS),
                    "version": round_,
                }
                keys.append(key)
                values.append(json.dumps(profile, separators=(",", ":")).encode())
                expected[key] = values[-1]
            producer.send_batch(
                TOPIC, pa.table({"key": pa.array(keys, pa.binary()), "value": values})
            ).result(60)
        gone = [f"customer-{number:05d}".encode() for number in rng.sample(range(CUSTOMERS), DELETED)]
        tombstones = pa.table({"key": pa.array(gone, pa.binary()), "value": pa.nulls(DELETED, pa.binary())})
        producer.send_batch(TOPIC, tombstones).result(60)
        for key in gone:
            del expected[key]
    finally:
        producer.close(timeout_s=60.0)
    return expected


def _check(spark: Any, table_path: str, expected: dict[bytes, bytes]) -> bool:
    from robustmq.streaming_jobs import read_table

    table = read_table(spark, table_path)
    rows = {bytes(row["key"]): bytes(row["value"]) for row in table.select("key", "value").collect()}
    same = rows == expected
    print(
        f"the table holds {len(rows):,} customers, "
        + ("exactly the latest profile of each live one" if same else "FAILED: not the latest profiles")
    )
    table.createOrReplaceTempView(TOPIC)
    print("customers by city:")
    spark.sql(f"""
        select get_json_object(cast(value as string), '$.city') as city, count(*) as customers
        from {TOPIC} group by 1 order by customers desc, city""").show(truncate=False)
    return same
