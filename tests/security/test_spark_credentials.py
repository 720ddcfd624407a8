"""The Spark connector on a secured cluster: a real TLS Meta Service, real Spark.

What Spark shows of a query (``explain``, errors) never holds the password; a wrong password and
a missing ACL fail the query clearly. (Reading and writing records also needs the storage nodes'
CURVE transport on the client side; those runs belong with the secured cluster tests.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq import Credentials
from robustmq._client import Client
from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq.security._credentials import init_credentials
from tests.e2e._procs import ROOT, ServerProcess, free_port, wait_until

PASSWORD = "Sp4rk-s3cret-pw"


@pytest.fixture(scope="module")
def secured_meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("spark-secured")
    creds = root / "creds"
    init_credentials(creds, nodes=["n1"])
    port = free_port()
    meta = ServerProcess(
        [
            "meta",
            "--data-dir",
            str(root / "meta"),
            "--meta-port",
            str(port),
            "--tls-ca",
            str(creds / "ca.pem"),
            "--tls-cert",
            str(creds / "meta.pem"),
            "--tls-key",
            str(creds / "meta.key"),
            "--tier-url",
            f"file://{root / 'tier'}",
        ]
    )
    address = f"127.0.0.1:{port}"
    node = ServerProcess(
        [
            "storage-node",
            "--data-dir",
            str(root / "n1"),
            "--node-port",
            str(free_port()),
            "--meta",
            address,
            "--io-workers",
            "1",
            "--tls-ca",
            str(creds / "ca.pem"),
            "--tls-cert",
            str(creds / "node-n1.pem"),
            "--tls-key",
            str(creds / "node-n1.key"),
        ]
    )
    try:
        meta.start()
        node.start()
        admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
        with MetaClient(address, credentials=admin, timeout_s=60.0) as client:
            wait_until(lambda: len(client.list_nodes()) == 1, timeout_s=60)
            for topic in ("in", "other"):
                client.create_topic(topic, partitions=1)
            client.create_user("etl", PASSWORD)
            reads = pb.AclBinding(
                principal="user:etl", resource_type="topic", resource_name="in", operation="read"
            )
            client.create_acl(reads)
        yield address, creds
    finally:
        node.stop()
        meta.stop()


def _options(address: str, creds: Path, **more: str) -> dict[str, str]:
    return {
        "metaAddress": address,
        "user": "etl",
        "password": PASSWORD,
        "tlsCa": str(creds / "ca.pem"),
        **more,
    }


def _failure(action: object) -> str:
    try:
        action()  # type: ignore[operator]
    except Exception as error:  # what Spark raises: the text is what a user sees
        return str(error)
    raise AssertionError("expected the query to fail")


def test_explain_and_errors_never_show_the_password(spark, secured_meta: tuple[str, Path]) -> None:  # type: ignore[no-untyped-def]
    address, creds = secured_meta
    frame = spark.read.format("robustmq").options(**_options(address, creds, topic="in")).load()
    # A missing ACL (etl may read "in", not "other"): refused, named, without the password.
    other = spark.read.format("robustmq").options(**_options(address, creds, topic="other"))
    message = _failure(other.load)
    assert PASSWORD not in message
    assert "AuthorizationFailed" in message or "not allowed" in message or "user:etl" in message, message
    # A wrong password: refused, and neither password is shown.
    wrong = _options(address, creds, topic="in")
    wrong["password"] = "wrong-" + PASSWORD
    message = _failure(spark.read.format("robustmq").options(**wrong).load)
    assert PASSWORD not in message and "AuthenticationFailed" in message, message
    # Spark's own rendering of the plan (options included, where it shows them).
    execution = frame._jdf.queryExecution()
    plans = [execution.logical().toString(), execution.analyzed().toString()]
    for plan in plans:
        assert PASSWORD not in plan, plan


def test_the_sink_refuses_a_user_without_write(spark, secured_meta: tuple[str, Path]) -> None:  # type: ignore[no-untyped-def]
    address, creds = secured_meta
    frame = spark.createDataFrame([("a",)], ["value"])
    writer = frame.write.format("robustmq").options(**_options(address, creds, topic="in")).mode("append")
    message = _failure(writer.save)
    assert PASSWORD not in message
    # etl has no write on "in": the driver's check of the topic or the first InitProducerId refuses.
    assert "AuthorizationFailed" in message or "user:etl" in message, message


def test_the_sink_writes_and_the_source_reads_a_secured_cluster(  # type: ignore[no-untyped-def]
    spark, secured_meta: tuple[str, Path]
) -> None:
    """Records really cross TLS and CURVE both ways, with exactly the ACLs they need."""
    address, creds = secured_meta
    admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
    with MetaClient(address, credentials=admin, timeout_s=60.0) as client:
        client.create_topic("secured-out", partitions=2)
        for operation in ("read", "write"):
            client.create_acl(
                pb.AclBinding(
                    principal="user:etl",
                    resource_type="topic",
                    resource_name="secured-out",
                    operation=operation,
                )
            )
    frame = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(30)], ["key", "value"])
    writer = frame.write.format("robustmq").options(**_options(address, creds, topic="secured-out"))

    def written() -> bool:  # ACLs reach the node with its next heartbeat
        try:
            writer.mode("append").save()
            return True
        except Exception as error:
            if "AuthorizationFailed" not in str(error) and "may not" not in str(error):
                raise
            return False

    wait_until(written, timeout_s=30)
    read = spark.read.format("robustmq").options(**_options(address, creds, topic="secured-out")).load()
    values = sorted(row.value.decode() for row in read.select("value").collect())
    assert values == sorted(f"v{i}" for i in range(30))
    plan = read._jdf.queryExecution().toString()  # every plan Spark renders, physical included
    assert PASSWORD not in plan


def _job(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "robustmq.cli", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_job_commands_log_in_with_the_client_flags_and_env(
    secured_meta: tuple[str, Path], tmp_path: Path
) -> None:
    address, creds = secured_meta
    (tmp_path / "wrong").write_text("wrong-" + PASSWORD + "\n")
    table = ["--table", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "ck"), "--available-now"]
    # Flags: a wrong password is refused before Spark starts, one line, exit 2, no password shown.
    flags = ["--user", "etl", "--password-file", str(tmp_path / "wrong"), "--tls-ca", str(creds / "ca.pem")]
    done = _job("topic-to-delta", "--meta", address, "--topic", "in", *table, *flags)
    assert done.returncode == 2 and "AuthenticationFailed" not in done.stdout, done
    assert "password" in done.stderr.lower() and PASSWORD not in done.stderr + done.stdout, done.stderr
    # The environment: the same, through ROBUSTMQ_*; a topic the user may not describe is named.
    env = {"ROBUSTMQ_USER": "etl", "ROBUSTMQ_PASSWORD": PASSWORD, "ROBUSTMQ_TLS_CA": str(creds / "ca.pem")}
    done = _job("compact", "--meta", address, "--topic", "other", "--table", str(tmp_path / "c"), env=env)
    assert done.returncode == 2 and PASSWORD not in done.stderr + done.stdout, done.stderr
    assert "user:etl may not describe topic 'other'" in done.stderr and "Traceback" not in done.stderr
    # A user without a password: one line naming what is missing.
    no_password = {"ROBUSTMQ_PASSWORD": "", "ROBUSTMQ_PASSWORD_FILE": ""}
    user = ["--user", "etl", "--tls-ca", str(creds / "ca.pem")]
    done = _job("topic-to-delta", "--meta", address, "--topic", "in", *table, *user, env=no_password)
    assert done.returncode == 2 and "needs a password" in done.stderr, done.stderr


def test_the_tier_job_tiers_a_secured_cluster(secured_meta: tuple[str, Path], tmp_path: Path) -> None:
    """`robustmq tier` logs in as a user with exactly what tiering needs (Describe and Alter on the
    cluster, Read on the topic) and copies a sealed segment from a CURVE node to the object store."""
    address, creds = secured_meta
    admin = Credentials(ca=creds / "ca.pem", cert=creds / "admin.pem", key=creds / "admin.key")
    with Client(address, credentials=admin, timeout_s=30) as client:
        client.create_topic("cold", partitions=1)
        with client.producer(acks="1") as producer:
            for future in [producer.send("cold", value=b"v%d" % i) for i in range(50)]:
                future.result(30)
        client.meta.create_user("tierer", PASSWORD)
        grants = [
            ("topic", "cold", "read"),
            ("cluster", "cluster", "describe"),
            ("cluster", "cluster", "alter"),
        ]
        for resource_type, name, operation in grants:
            client.meta.create_acl(
                pb.AclBinding(
                    principal="user:tierer",
                    resource_type=resource_type,
                    resource_name=name,
                    operation=operation,
                )
            )
        client.seal("cold", 0)
        password = tmp_path / "password"
        password.write_text(PASSWORD)
        login = ["--user", "tierer", "--password-file", str(password), "--tls-ca", str(creds / "ca.pem")]

        def tiered() -> bool:  # the node learns tierer's read ACL with its next heartbeat
            done = _job("tier", "--once", "--meta", address, "--checkpoint", str(tmp_path / "ck"), *login)
            assert done.returncode in (0, 1), done.stderr
            return client.meta.get_shard("cold_0").segments[0].state == pb.TIERED

        wait_until(tiered, timeout_s=120)
