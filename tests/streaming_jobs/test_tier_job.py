"""The tiering job end to end: a real SparkSession, real nodes and Meta Service, a real S3 API
server; ``robustmq tier`` as a user runs it, SIGKILLed mid-upload and started again."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import robustmq
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.streaming_jobs.tier_segments import parser, start_tiering
from robustmq.streaming_jobs.topic_to_delta import options_table
from robustmq.tier._store import ObjectStore, segment_key
from tests._s3 import S3Server
from tests.e2e._meta_proxy import MetaProxy, Rule
from tests.e2e._procs import ROOT, free_port
from tests.streaming_jobs._tiering import check_tiered, seal_segments, sealed_segments

ROBUSTMQ = [sys.executable, "-m", "robustmq.cli"]


def _tier(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ROBUSTMQ, "tier", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env
    )


@pytest.fixture(scope="module")
def s3_env(s3_server: S3Server) -> Iterator[dict[str, str]]:
    """The environment that reaches the S3 server, in this process too (the Meta Service is here)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.environment.items():
            patch.setenv(name, value)
        yield s3_server.environment


def _s3_cluster(root: Path, s3_server: S3Server, bucket: str) -> EmbeddedCluster:
    s3_server.boto3_client().create_bucket(Bucket=bucket)
    return EmbeddedCluster(root, meta_port=0, node_port=0, tier_url=f"s3://{bucket}/tiered").start()


@pytest.mark.spark
def test_tier_once_in_spark_tiers_every_sealed_segment(
    spark: Any, cluster: Any, client: Any, tmp_path: Path
) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=3)
    seal_segments(client, topic, segments=2, records=2500, partitions=3, value_bytes=200)
    with MetaClient(cluster.meta_address, timeout_s=30) as meta:
        query = start_tiering(
            spark,
            meta_address=cluster.meta_address,
            tier_url=meta.cluster_config().tier_url,
            checkpoint=str(tmp_path / "ck"),
            once=True,
            max_segments_per_trigger=4,
        )
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None
        assert len(query.recentProgress) >= 2  # 6 segments, at most 4 a batch
        assert check_tiered(client, meta, topic, 3) == 6


@pytest.mark.spark
def test_a_corrupt_object_fails_the_query_and_is_never_marked(
    spark: Any, cluster: Any, client: Any, tmp_path: Path
) -> None:
    topic = f"x{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, partitions=1)
    seal_segments(client, topic, segments=1, records=500)
    with MetaClient(cluster.meta_address, timeout_s=30) as meta:
        store = ObjectStore.from_url(meta.cluster_config().tier_url)
        ((_, incarnation, segment),) = sealed_segments(meta, topic, 1)
        key = segment_key(topic, 0, segment.epoch, segment.start_offset, incarnation=incarnation)
        store.put_if_absent(key, b"PAR1 not a segment PAR1")
        query = start_tiering(
            spark,
            meta_address=cluster.meta_address,
            tier_url=store.url,
            checkpoint=str(tmp_path / "ck"),
            once=True,
        )
        with pytest.raises(Exception, match="CorruptObject"):
            query.awaitTermination(180)
        failure = str(query.exception())
        assert "CorruptObject" in failure and store.url_of(key) in failure, failure[-3000:]
        ((_, _, after),) = sealed_segments(meta, topic, 1)
        assert after.state == pb.SEALED and not after.object_url


@pytest.mark.e2e
def test_a_missing_unreachable_or_refusing_store_is_one_line_naming_it(
    s3_server: S3Server, s3_env: dict[str, str], tmp_path: Path
) -> None:
    with EmbeddedCluster(tmp_path / "none", meta_port=0, node_port=0, tier_url="none") as bare:
        none = _tier("--meta", bare.meta_address, "--once")
    assert none.returncode == 2 and len(none.stderr.splitlines()) == 1, none.stderr
    assert "has no tier URL" in none.stderr and "--tier-url" in none.stderr
    cluster = _s3_cluster(tmp_path / "doomed", s3_server, "doomed")
    try:
        url = "s3://doomed/tiered"
        down = {**s3_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
        unreachable = _tier("--meta", cluster.meta_address, "--once", env={**os.environ, **down})
        assert unreachable.returncode == 1, unreachable.stderr
        assert len(unreachable.stderr.splitlines()) == 1 and url in unreachable.stderr, unreachable.stderr
        s3_server.boto3_client().delete_bucket(Bucket="doomed")
        refused = _tier("--meta", cluster.meta_address, "--once")
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and url in refused.stderr, refused.stderr
        assert "Traceback" not in unreachable.stderr + refused.stderr + none.stderr
    finally:
        cluster.stop()


@pytest.mark.e2e
def test_tier_once_with_nothing_sealed_says_so_and_starts_no_spark(tmp_path: Path) -> None:
    """100,000 small records fill no segment: ``tier --once`` says that nothing is sealed and how
    to seal, instead of starting Spark to tier nothing and printing only ``ready``."""
    tier = tmp_path / "tier"
    with EmbeddedCluster(tmp_path / "c", meta_port=0, node_port=0, tier_url=f"file://{tier}") as cluster:
        with robustmq.connect(cluster.meta_address) as client:
            client.create_topic("unsealed", partitions=2)
            with client.producer() as producer:
                producer.send_batch("unsealed", pa.table({"value": [b"x"] * 100_000})).result()
        done = _tier("--meta", cluster.meta_address, "--once", timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "0 segments sealed and not yet tiered: nothing to tier; seal with `robustmq segments seal TOPIC` "
        "or wait for segment_bytes_max / roll_interval_ms (robustmq topic describe TOPIC shows them)"
    ], done.stdout
    assert "Traceback" not in done.stderr and "SparkContext" not in done.stderr, done.stderr


def _segment_objects(s3: Any, bucket: str) -> int:
    """The segment objects in ``bucket`` (not the job's start-up probe of the store, an object put
    and deleted at once: a kill on seeing it landed before any upload)."""
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    return sum(item["Key"].endswith(".parquet") for item in listed)


def _kill_when(job: list[str], ready: Callable[[], bool], delay_s: float, env: dict[str, str]) -> None:
    """Run ``job`` until ``ready()``, then SIGKILL it ``delay_s`` later."""
    child = subprocess.Popen(
        job, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 180
        while not ready():
            assert child.poll() is None, child.communicate(timeout=30)[1][-3000:]
            assert time.monotonic() < deadline, "the job did not get there within 180 s"
            time.sleep(0.02)
        time.sleep(delay_s)
        child.kill()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        child.stderr.close()  # type: ignore[union-attr]


@pytest.mark.spark
@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    "rounds",
    [
        1,  # the kill between a put and its MarkTiered, then a restart: two JVMs, ~35 s quiet
        # two kills a moment after a put first (each job a JVM: ~70 s quiet): make test-long
        pytest.param(3, marks=pytest.mark.long),
    ],
)
def test_sigkill_mid_upload_and_restart_tier_each_segment_exactly_once(
    s3_server: S3Server, s3_env: dict[str, str], tmp_path: Path, rounds: int
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed} (rerun: replace randrange with this value)")
    rng = random.Random(seed)
    cluster = _s3_cluster(tmp_path / "cluster", s3_server, "killed")
    # The killed jobs reach the Meta Service through a proxy: in the last round it loses their
    # MarkTiered requests, so that kill surely lands between a put and its MarkTiered (a window
    # a kill a moment after a put finds only now and then).
    proxy = MetaProxy("127.0.0.1:0", cluster.meta_address, seed=seed).start()
    s3 = s3_server.boto3_client()
    try:
        with (
            robustmq.connect(cluster.meta_address, timeout_s=30) as client,
            MetaClient(cluster.meta_address, timeout_s=30) as meta,
        ):
            topic = "orders"
            client.create_topic(topic, partitions=2)
            job = [*ROBUSTMQ, "tier", "--meta", proxy.address, "--checkpoint", str(tmp_path / "ck")]
            job += ["--trigger-seconds", "0", "--max-segments-per-trigger", "1"]
            scratch = tmp_path / "tmp"  # the jobs' temporary directory: what killed ones leave
            scratch.mkdir()
            env = {**os.environ, "TMPDIR": str(scratch)}
            unmarked = 0  # rounds killed between a put and its MarkTiered
            for round_ in range(rounds):
                seal_segments(
                    client, topic, segments=2, records=2000, partitions=2, value_bytes=200, seed=round_
                )
                before = _segment_objects(s3, "killed")
                if round_ < rounds - 1:  # killed a moment after it put a segment (marked or not)
                    put = lambda before=before: _segment_objects(s3, "killed") > before  # noqa: E731
                    _kill_when(job, put, rng.uniform(0, 0.1), env)
                else:  # killed while its MarkTiered, after a put (or one found done), is lost
                    proxy.set_rules([Rule("lose", methods=("MarkTiered",))])
                    _kill_when(job, lambda: bool(proxy.stats()["lost"]), rng.uniform(0, 0.1), env)
                    proxy.clear()
                objects = _segment_objects(s3, "killed")
                tiered = sum(s.state == pb.TIERED for _, _, s in sealed_segments(meta, topic, 2))
                unmarked += objects > tiered
                print(f"round {round_}: {objects} objects, {tiered} segments tiered")
            assert unmarked, "no round was killed between a put and its MarkTiered"
            final = _tier(
                "--meta", cluster.meta_address, "--checkpoint", str(tmp_path / "ck"), "--once", env=env
            )
            assert final.returncode == 0, final.stderr[-3000:]
            assert check_tiered(client, meta, topic, 2) == 4 * rounds
            # Killed jobs' scratch files are swept by the next job, not left to fill the disk.
            assert sorted(p.name for p in scratch.glob("robustmq-tier-*")) == []
    finally:
        proxy.stop()
        cluster.stop()


def test_help_docs_and_bad_arguments() -> None:
    shown = _tier("--help", timeout_s=60)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    for action in parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.option_strings[0] in shown.stdout and "default" in str(action.help), action.dest
    match = re.search(
        r"<!-- generated: tier-options -->\n(.*?)\n<!-- end: tier-options -->",
        (ROOT / "docs" / "spark.md").read_text(),
        re.DOTALL,
    )
    assert match and match.group(1) == options_table(parser()), (
        f"docs/spark.md should list:\n{options_table(parser())}"
    )
    bad = _tier("--max-segments-per-trigger", "0", timeout_s=60)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "--max-segments-per-trigger" in bad.stderr and "Traceback" not in bad.stderr
    listed = subprocess.run([*ROBUSTMQ, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "tier" in listed.stdout
