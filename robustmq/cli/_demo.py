"""``robustmq demo``: the main job, end to end on one machine.

1. start an embedded single-node cluster (Meta Service + storage node) in a
   temporary directory, on free loopback ports;
2. create an ``orders`` topic and produce a stream of order events (JSON
   values, customer keys, region and payment tags, timestamps over the last
   hours), while
3. a Spark Structured Streaming job (``topic_to_delta``) reads the topic with
   ``format("robustmq")`` and appends it exactly once to a Delta table;
4. seal the partitions' active segments;
5. tier the sealed segments to the embedded object store (``file://`` in the
   directory) with the tiering job, a Spark streaming query, and read one
   tiered segment back from its Parquet object (:mod:`._demo_tiering`);
6. query the Delta table with Spark SQL (revenue by country and by hour);
7. compact a keyed topic of customer profiles (``cleanup=compact``, updates
   and deletes) into a Delta table with the compaction job and check it holds
   the latest profile of each live customer (:mod:`._demo_compaction`);
8. stop everything it started and remove the directory (unless ``--keep``).

Before anything starts it checks that Java (which Spark needs) is there, so a
missing Java is one line, not a Spark traceback after the cluster started.
Ctrl-C and SIGTERM stop it within seconds (the producer thread checks a stop
flag at least once a second) and still remove the directory. If the ETL does
not catch up within ``catch_up_timeout_s`` the demo says so and exits 1.

Signals and Py4J: a signal handler that raises while the main thread is
inside a Py4J call breaks that call's connection (Py4J logs tracebacks, and
every later call fails the same way), and Spark installs its own SIGINT
handler, which makes a Py4J call from inside the handler. So the demo puts
its own handler back once Spark has started, and that handler raises only
while the main thread is in a plain Python wait (:meth:`_Demo.interruptible`);
elsewhere it sets the stop flag, which the demo checks between steps and
between Spark calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa

from robustmq._records import TAGS_TYPE, TIMESTAMP_TYPE, coerce_records, now_ms
from robustmq.cli._progress import Progress
from robustmq.errors import RequestTimeout

__all__ = ["java_problem", "run_demo"]

JAVA_MIN_VERSION = 17  # Spark 4
STOP_WAIT_S = 5.0  # how long stopping waits for the producer thread
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

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


def java_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why Spark could not start its JVM here (no Java, or one too old), or ``None`` if it can.

    Looks where PySpark looks: ``$JAVA_HOME/bin/java`` if ``JAVA_HOME`` is set,
    else ``java`` on the ``PATH``.
    """
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH"))
    where = f"JAVA_HOME={home}" if home else "the PATH"
    if java is None or not Path(java).exists():
        return (
            f"Java not found in {where}: Spark needs Java {JAVA_MIN_VERSION} or newer "
            f"(install it, or set JAVA_HOME)"
        )
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{java} -version failed ({error}): Spark needs a working Java {JAVA_MIN_VERSION}+"
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if done.returncode != 0 or found is None:
        return f"{java} -version failed: Spark needs a working Java {JAVA_MIN_VERSION}+"
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0_392" is Java 8
        major = int(found.group(2))
    if major < JAVA_MIN_VERSION:
        return f"{java} is Java {major}: Spark needs Java {JAVA_MIN_VERSION} or newer"
    return None


def _step(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.monotonic()


class _Interrupted(BaseException):  # like KeyboardInterrupt: no `except Exception` swallows it
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run_demo(*, records: int = 400_000, keep: bool = False, catch_up_timeout_s: float = 300.0) -> int:
    """Run the demo; the exit code: 0 done, 1 failed, 130 Ctrl-C, 143 SIGTERM."""
    problem = java_problem()
    if problem is not None:
        print(f"robustmq demo: {problem}", file=sys.stderr, flush=True)
        return 1

    demo = _Demo(Path(tempfile.mkdtemp(prefix="robustmq-demo-")), records, catch_up_timeout_s)
    previous = {sig: signal.signal(sig, demo.on_signal) for sig in STOP_SIGNALS}
    code = 1
    try:
        code = demo.run()
    except (_Interrupted, KeyboardInterrupt) as stop:
        signum = stop.signum if isinstance(stop, _Interrupted) else signal.SIGINT
        print(f"robustmq demo: interrupted ({signal.Signals(signum).name}); stopping", file=sys.stderr)
        code = 128 + signum
    finally:
        for sig in previous:  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        try:
            demo.stop(keep=keep)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return code


class _Demo:
    """The demo's parts, so that :meth:`stop` can stop whatever was started, from any step."""

    def __init__(self, root: Path, records: int, catch_up_timeout_s: float) -> None:
        from robustmq.cli._embedded import EmbeddedCluster

        self.root = root
        self.records = records
        self.catch_up_timeout_s = catch_up_timeout_s
        self.began = time.monotonic()
        self.cluster = EmbeddedCluster(root / "cluster", meta_port=0, node_port=0)
        self.client: Any = None
        self.spark: Any = None
        self.stopping = threading.Event()
        self.signalled: int | None = None
        self._interruptible = False
        self.producer_thread: threading.Thread | None = None
        self.failure: list[BaseException] = []

    # -- signals (see the module docstring) -------------------------------------------------

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = signum
        self.stopping.set()
        if self._interruptible:
            self._interruptible = False
            raise _Interrupted(signum)

    @contextlib.contextmanager
    def interruptible(self) -> Any:
        """A stretch with no Py4J call in it: a signal may raise here."""
        self.check()
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def check(self) -> None:
        """Raise for a signal that came while the main thread could not be interrupted."""
        if self.signalled is not None:
            raise _Interrupted(self.signalled)

    def run(self) -> int:
        from robustmq import connect

        _step("starting an embedded single-node cluster")
        with self.interruptible():
            self.cluster.start()
        assert self.cluster.node is not None
        print(
            f"Meta Service {self.cluster.meta_address}, storage node {self.cluster.node.address}, "
            f"data in {self.root}"
        )
        self.client = connect(self.cluster.meta_address)
        self.client.create_topic("orders", 4, segment_bytes_max=8 * 1024 * 1024)
        print("created topic orders (4 partitions, segment engine, 8 MiB segments)")
        query = self._start_etl()
        if query is None:
            return 1
        self.check()
        self._produce()
        if not self._wait_for_etl(query):
            return 1
        query.stop()
        self.check()
        print(f"the ETL committed group offsets for all {self.records:,} records; query stopped")
        self._seal()
        self.check()
        if not self._tier():
            return 1
        self.check()
        ok = self._query()
        self.check()
        ok = self._compact() and ok
        self.check()
        print(f"\ndemo {'finished' if ok else 'FAILED'} in {time.monotonic() - self.began:.0f}s", flush=True)
        return 0 if ok else 1

    def _start_etl(self) -> Any:
        from robustmq.streaming_jobs import spark_session, start_topic_to_delta

        _step("starting Spark and the streaming ETL: topic orders -> Delta table (exactly once)")
        try:
            self.spark = spark_session("robustmq-demo")
        except Exception as error:  # Py4J/JVM start-up failures have no better type
            print(f"robustmq demo: Spark did not start: {_first_line(error)}", file=sys.stderr, flush=True)
            return None
        for sig in STOP_SIGNALS:  # SparkContext replaced SIGINT's handler with its own
            signal.signal(sig, self.on_signal)
        self.spark.sparkContext.setLogLevel("ERROR")
        query = start_topic_to_delta(
            self.spark,
            meta_address=self.cluster.meta_address,
            table_path=str(self.root / "tables" / "orders"),
            checkpoint=str(self.root / "checkpoints" / "orders"),
            topic="orders",
            trigger_seconds=1.0,
            group="demo-etl",
        )
        print(f"query {query.name} running")
        return query

    def _produce(self) -> None:
        _step(f"producing {self.records:,} order events while the ETL runs")
        thread = threading.Thread(target=self._produce_loop, name="demo-producer", daemon=True)
        self.producer_thread = thread
        thread.start()
        with self.interruptible():
            while thread.is_alive():  # short joins: a signal is handled within half a second
                thread.join(0.5)
        if self.failure:
            raise self.failure[0]

    def _produce_loop(self) -> None:
        rng = random.Random(42)
        progress = Progress("produce orders", self.records, unit="events")
        end_ms = now_ms()
        producer = self.client.producer()
        try:
            for start in range(0, self.records, 20_000):
                count = min(20_000, self.records - start)
                events = _orders(rng, start, count, self.records, end_ms)
                if not _wait(producer.send_batch("orders", events), self.stopping, 120.0):
                    return
                progress.advance(count)
            progress.done()
        except BaseException as error:  # reported by the main thread
            self.failure.append(error)
        finally:
            producer.close(timeout_s=1.0 if self.stopping.is_set() else 60.0)

    def _wait_for_etl(self, query: Any) -> bool:
        """Wait until the ETL's group has committed every record; False (said) if it did not in time."""
        _step("waiting for the ETL to catch up")
        progress = Progress("delta table orders", self.records, unit="rows")
        deadline = time.monotonic() + self.catch_up_timeout_s
        done = 0
        while True:
            lag = self.client.group_lag("demo-etl", "orders").partitions
            done = sum(max(p.committed, 0) for p in lag)
            progress.update(done)
            if done >= self.records:
                progress.done()
                return True
            failed = query.exception()
            if failed is not None or time.monotonic() >= deadline:
                break
            if self.stopping.wait(0.5):
                self.check()
        progress.done()
        why = (
            f"the ETL query failed: {_first_line(failed)}"
            if failed is not None
            else f"the ETL committed offsets for {done:,} of {self.records:,} records within "
            f"{self.catch_up_timeout_s:g} s"
        )
        print(f"robustmq demo: FAILED: {why}", file=sys.stderr, flush=True)
        return False

    def _seal(self) -> None:
        _step("sealing the active segments")
        for partition in range(4):
            with contextlib.suppress(Exception):  # an empty active segment has nothing to seal
                self.client.seal("orders", partition)
        for shard in self.client.describe_topic("orders").shards:
            chain = ", ".join(
                f"epoch {s.epoch} [{s.start_offset}, {'...' if s.end_offset < 0 else s.end_offset})"
                for s in shard.segments
            )
            print(f"  partition {shard.partition}: {chain}")

    def _tier(self) -> bool:
        from robustmq.cli._demo_tiering import tier_and_read_back
        from robustmq.streaming_jobs import read_table

        _step("tiering the sealed segments to the object store (robustmq tier, a Spark streaming job)")
        return tier_and_read_back(
            self.spark,
            self.client,
            meta_address=self.cluster.meta_address,
            tier_url=self.cluster.tier_url,
            checkpoint=str(self.root / "checkpoints" / "tier"),
            table=read_table(self.spark, str(self.root / "tables" / "orders")),
            topic="orders",
            wait=self._sleep,
        )

    def _compact(self) -> bool:
        from robustmq.cli._demo_compaction import compact_customers

        _step("compacting a keyed topic of customer profiles into a Delta table (robustmq compact)")
        return compact_customers(
            self.spark, self.client, meta_address=self.cluster.meta_address, root=self.root, wait=self._sleep
        )

    def _sleep(self, seconds: float) -> None:
        """Sleep between Spark calls; raise if the demo is being stopped."""
        if self.stopping.wait(seconds):
            self.check()

    def _query(self) -> bool:
        from robustmq.streaming_jobs import read_table

        _step("querying the Delta table with Spark SQL")
        spark = self.spark
        read_table(spark, str(self.root / "tables" / "orders")).createOrReplaceTempView("orders")
        spark.sql("""
            select get_json_object(cast(value as string), '$.country') as country,
                   get_json_object(cast(value as string), '$.amount') as amount, timestamp
            from orders""").createOrReplaceTempView("parsed")
        total = spark.sql(
            "select count(*) as rows, count(distinct topic, partition, offset) as distinct_records "
            "from orders"
        ).collect()[0]
        print(f"the table holds {total['rows']:,} rows, {total['distinct_records']:,} distinct records")
        self.check()
        print("revenue by country:")
        spark.sql("""select country, count(*) as orders,
                            cast(sum(cast(amount as double)) as decimal(14, 2)) as revenue
                     from parsed group by country order by revenue desc""").show(truncate=False)
        self.check()
        print("orders per hour:")
        spark.sql("""select date_format(date_trunc('hour', timestamp), 'yyyy-MM-dd HH:00') as hour,
                            count(*) as orders
                     from parsed group by 1 order by 1""").show(10, truncate=False)
        return bool(total["rows"] == self.records == total["distinct_records"])

    def stop(self, *, keep: bool) -> None:
        """Stop what was started (producer thread, Spark, client, cluster); remove the directory."""
        _step("stopping everything")
        self.stopping.set()
        if self.producer_thread is not None:
            self.producer_thread.join(STOP_WAIT_S)
        if self.spark is not None:
            with contextlib.suppress(Exception):  # after Ctrl-C in a terminal the JVM may be gone
                self.spark.stop()
        if self.client is not None:
            self.client.close()
        self.cluster.stop()
        if keep:
            print(f"kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        sys.stdout.flush()


def _wait(future: Future[Any], stopping: threading.Event, timeout_s: float) -> bool:
    """Wait for ``future`` (raising its error); False if ``stopping`` was set first."""
    deadline = time.monotonic() + timeout_s
    while not stopping.is_set():
        try:
            future.result(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            return True
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise RequestTimeout(
                    f"a batch of order events was not acknowledged within {timeout_s:g} s"
                ) from None
    return False


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
