"""The ``robustmq`` command line as a user runs it: real subprocesses against a real server.

Every subcommand gets bad input (missing and malformed arguments, unknown
names, an unreachable Meta Service) and must answer with one line on stderr
and exit code 2 (bad input) or 1 (a runtime failure), never a traceback.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import robustmq
from robustmq import build_records
from tests.e2e._cli import cli, cli_many, pipe_is_drained
from tests.e2e._procs import ROOT, free_port, running, wait_until

pytestmark = pytest.mark.e2e

META = "<meta>"  # replaced by --meta with the test server's address
CLOSED = "<closed>"  # replaced by --meta with a port nobody listens on, and a short timeout


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("cli")
    port = free_port()
    command = ["server", "--data-dir", str(root), "--meta-port", str(port), "--node-port", str(free_port())]
    with running(command):
        address = f"127.0.0.1:{port}"
        with robustmq.connect(address) as client:
            client.create_topic("known", 2)
            client.create_topic("compacted", 2, cleanup_policy="compact")
        yield address


# (arguments, exit code, text the one line on stderr must contain, stdin)
BAD_INPUT: list[tuple[list[str], int, str, str | None]] = [
    ([], 2, "required", None),
    (["nosuch"], 2, "invalid choice", None),
    (["server", "--meta-port", "abc"], 2, "--meta-port", None),
    (["cluster", "--nodes", "0"], 2, "--nodes", None),
    (["cluster", "--nodes", "many"], 2, "--nodes", None),
    (["cluster", "--meta-port", "x"], 2, "--meta-port", None),
    (["cluster", "--base-port", "65535", "--nodes", "3"], 2, "--base-port", None),
    (["cluster", "--base-port", "7101", "--meta-port", "7102"], 2, "--meta-port", None),
    (["server", "--node-port", "70000"], 2, "--node-port", None),
    (["meta", "--meta-port", "-1"], 2, "--meta-port", None),
    (["storage-node", "--io-workers", "0"], 2, "--io-workers", None),
    (["storage-node", "--node-id", "bad id!"], 2, "--node-id", None),
    (["storage-node", "--meta", "no-port-here"], 2, "--meta", None),
    (["topic"], 2, "required", None),
    (["topic", "create"], 2, "name", None),
    (["topic", "create", "t", "--partitions", "x"], 2, "--partitions", None),
    (["topic", "create", "bad/name", META], 2, "bad/name", None),
    (["topic", "create", "t", "--partitions", "0", META], 2, "--partitions", None),
    (["topic", "create", "t", "--partitions", "-1", META], 2, "--partitions", None),
    (["topic", "create", "t", "--segment-bytes", "0", META], 2, "--segment-bytes", None),
    (["topic", "create", "t", "--segment-bytes", "1000", META], 2, "--segment-bytes", None),
    (["topic", "create", "t", "--retention-ms", "0", META], 2, "--retention-ms", None),
    (["topic", "create", "t", "--min-insync-replicas", "x"], 2, "--min-insync-replicas", None),
    (["topic", "create", "t", "--local-retention-ms", "-2", META], 2, "--local-retention-ms", None),
    (["topic", "create", "t", "--local-retention-bytes", "x"], 2, "--local-retention-bytes", None),
    (["meta", "--tier-url", "gs://bucket/x"], 2, "--tier-url", None),
    (["meta", "--token-lifetime-ms", "5"], 2, "--token-lifetime-ms", None),
    (["server", "--tier-url", "file://relative/path"], 2, "--tier-url", None),
    (["cluster", "--retention-check-ms", "0"], 2, "--retention-check-ms", None),
    (["topic", "create", "t", "--min-insync-replicas", "0", META], 2, "--min-insync-replicas", None),
    (["topic", "create", "t", "--min-insync-replicas", "2", META], 2, "--min-insync-replicas", None),
    (["topic", "create", "t", "--replication-factor", "3", META], 1, "need 3 live storage nodes", None),
    (["topic", "create", "t", "--replication-factor", "2", "--engine", "memory", META], 2, "segment", None),
    (["topic", "list", "--json", CLOSED], 1, "unavailable", None),
    (["produce", "compacted", META], 2, "every record needs a key", "x\n"),
    (["produce", "compacted", "--format", "json", META], 2, "have no key", '{"value": "a"}\n'),
    (["topic", "create", "t", "--cleanup", "shred"], 2, "--cleanup", None),
    (["topic", "describe", "nosuch", META], 2, "nosuch", None),
    (["topic", "alter", "known"], 2, "--set", None),
    (["topic", "alter", "known", "--set", "retention_ms"], 2, "KEY=VALUE", None),
    (["topic", "alter", "known", "--set", "partitions=4"], 2, "fixed at creation", None),
    (["topic", "alter", "known", "--set", "cleanup=compact"], 2, "fixed at creation", None),
    (["topic", "alter", "known", "--set", "retention-ms=soon"], 2, "integer", None),
    (["topic", "alter", "known", "--set", "colour=blue"], 2, "unknown setting", None),
    (["topic", "alter", "known", "--set", "retention_ms=0", META], 2, "retention_ms", None),
    (["topic", "alter", "known", "--set", "min_insync_replicas=2", META], 2, "min_insync_replicas", None),
    (
        ["topic", "alter", "known", "--set", "retention_ms=1", "--set", "retention_ms=2", META],
        2,
        "twice",
        None,
    ),
    (["topic", "alter", "nosuch", "--set", "retention_ms=1000", META], 2, "nosuch", None),
    (["topic", "delete", "nosuch", META], 2, "nosuch", None),
    (["topic", "list", CLOSED], 1, "unavailable", None),
    (["produce"], 2, "topic", None),
    (["produce", "nosuch", META], 2, "nosuch", "x\n"),
    (["produce", "known", "--format", "json", META], 2, "line 1", "not json\n"),
    (["produce", "known", "--format", "json", META], 2, "line 2", '{"value": "a"}\n[1]\n'),
    (["produce", "known", "--file", "/nonexistent/lines.txt", META], 2, "/nonexistent/lines.txt", None),
    (["produce", "known", "--key-separator", "", META], 2, "--key-separator", None),
    (["produce", "known", "--key-separator", "TAB", META], 2, "line 2", "k\tv\nno key\n"),
    (["produce", "known", "--format", "json", META], 2, "line 1", '{"value": "a", "partition": 2}\n'),
    (["produce", "known", "--linger-ms", "-1"], 2, "--linger-ms", None),
    (["produce", "known", "--acks", "2"], 2, "--acks", None),
    (["produce", "known", "--acks", "leader"], 2, '"all", "quorum" or "1"', None),
    (["produce", "known", CLOSED], 1, "unavailable", "x\n"),
    (["consume"], 2, "topic", None),
    (["consume", "known", "--from", "yesterday"], 2, "--from", None),
    (["consume", "known", "--from", "-3"], 2, "--from", None),
    (["consume", "known", "--from", "group", META], 2, "--group", None),
    # Issue 22 item 7: an offset past int64, a non-ASCII digit, an empty group name, a timestamp
    # past int64 in a JSON line, an out-of-range quota flag.
    (["consume", "known", "--from", "99999999999999999999", META], 2, "--from", None),
    (["consume", "known", "--from", "\u00b2", META], 2, "--from", None),
    (["consume", "known", "--group", "", META], 2, "--group", None),
    (["consume", "known", "--from-timestamp", "99999999999999999999", META], 2, "--from-timestamp", None),
    (["groups", "--group", "", META], 2, "--group", None),
    (
        ["produce", "known", "--format", "json", META],
        2,
        "line 2",
        '{"value": "a"}\n{"value": "b", "timestamp": -100000000000000000000}\n',
    ),
    (["produce", "known", "--format", "json", META], 2, "line 1", '{"value": "b", "timestamp": -1e20}\n'),
    (["meta", "--max-segments-per-shard", "1"], 2, "--max-segments-per-shard", None),
    (["consume", "known", "--from-timestamp", "not-a-time"], 2, "--from-timestamp", None),
    (["consume", "known", "--max-records", "0"], 2, "--max-records", None),
    (["consume", "known", "--idle-timeout-s", "-1"], 2, "--idle-timeout-s", None),
    (["consume", "known", "--partition", "7", "--max-records", "1", META], 2, "partition 7", None),
    (["consume", "nosuch", "--max-records", "1", META], 2, "nosuch", None),
    (["consume", "known", "--timeout-s", "0"], 2, "--timeout-s", None),
    (["consume", "known", "--max-records", "1", CLOSED], 1, "unavailable", None),
    (["groups", "--topic", "nosuch", META], 2, "nosuch", None),
    (["groups", "--group", "nosuch", META], 2, "nosuch", None),
    (["groups", "delete"], 2, "group", None),
    (["groups", "delete", "nosuch", META], 2, "nosuch", None),
    (["groups", CLOSED], 1, "unavailable", None),
    (["segments"], 2, "TOPIC", None),
    (["segments", "nosuch", META], 2, "nosuch", None),
    (["segments", "nosuch", "--json", META], 2, "nosuch", None),
    (["segments", "seal", META], 2, "TOPIC", None),
    (["segments", "seal", "nosuch", META], 2, "nosuch", None),
    (["segments", "seal", "known", "9", META], 2, "partition 9", None),
    (["segments", "seal", "known", "x", META], 2, "PARTITION", None),
    (["segments", "known", "0", META], 2, "seal", None),
    (["nodes", "--bogus"], 2, "--bogus", None),
    (["nodes", CLOSED], 1, "unavailable", None),
    (["node"], 2, "required", None),
    (["node", "remove"], 2, "node_id", None),
    (["node", "drain"], 2, "node_id", None),
    (["node", "drain", "nosuch", META], 2, "nosuch", None),
    (["node", "drain", "nosuch", "--undo", META], 2, "nosuch", None),
    (["node", "drain", "x", CLOSED], 1, "unavailable", None),
    (["node", "evict", "x"], 2, "invalid choice", None),
    (["node", "remove", "nosuch", META], 2, "nosuch", None),
    (["node", "remove", "bad id!", META], 2, "bad id!", None),
    (["user"], 2, "required", None),
    (["user", "add"], 2, "required", None),
    (["user", "remove", "bob", CLOSED], 1, "unavailable", None),
    (["security"], 2, "required", None),
    (["security", "init"], 2, "required", None),
    (["security", "add-node", "/nonexistent", "n1"], 2, "ca.pem", None),
    (["security", "revoke-cert", META], 2, "CERT_FILE or --fingerprint", None),
    (["security", "revoke-cert", "/nonexistent.pem", META], 2, "cannot read", None),
    (["security", "revoke-cert", "--fingerprint", "zz", META], 2, "64 hex digits", None),
    (["security", "revoke-cert", "--fingerprint", "ab" * 32, META], 2, "not secured", None),
    (["security", "revoked", CLOSED], 1, "unavailable", None),
    (["acl"], 2, "required", None),
    (["kafka-gateway", "--port", "abc"], 2, "--port", None),
    (["kafka-gateway", "--host", "0.0.0.0"], 2, "--insecure", None),
    # SASL over plaintext would send passwords in clear: off loopback only with a TLS listener
    (
        [
            "kafka-gateway",
            "--host",
            "0.0.0.0",
            "--advertise",
            "203.0.113.1:9092",
            "--tls-ca",
            "/etc/hostname",
        ],
        2,
        "--insecure",
        None,
    ),
    (["kafka-gateway", "--secure"], 2, "needs the cluster's CA", None),
    (["kafka-gateway", "--tls-ca", "/nonexistent.pem"], 2, "cannot read", None),
    (
        ["quota", "set", "--principal", "user:a", "--produce-bytes-per-s", "-1", META],
        2,
        "--produce-bytes-per-s",
        None,
    ),
    (["quota", "remove", META], 2, "--principal", None),
    (["acl", "add", "--topic", "t", "--operation", "read"], 2, "--principal", None),
    (
        ["acl", "add", "--principal", "alice", "--topic", "t", "--operation", "read", META],
        2,
        "--principal",
        None,
    ),
    (["acl", "add", "--principal", "user:a", "--operation", "read", META], 2, "--topic", None),
    (
        ["acl", "remove", "--principal", "user:a", "--topic", "t", "--operation", "fly", META],
        2,
        "--operation",
        None,
    ),
    (["acl", "list", "--principal", "user:a", CLOSED], 1, "unavailable", None),
    (["topic-to-delta"], 2, "required", None),
    (
        ["topic-to-delta", "--topic", "t", "--table", "x", "--checkpoint", "y", "--trigger-seconds", "z"],
        2,
        "",
        None,
    ),
    (["tier", "--max-segments-per-trigger", "0"], 2, "--max-segments-per-trigger", None),
    (["tier", "--once", CLOSED], 1, "cannot reach the Meta Service", None),
    (["compact"], 2, "required", None),
    (["compact", "--topic", "nosuch", "--table", "/nonexistent/t", META], 2, "nosuch", None),
    (["compact", "--topic", "known", "--table", "/nonexistent/t", META], 2, "not cleanup=compact", None),
    (["compact", "--topic", "t", "--table", "x", "--trigger-seconds", "-1"], 2, "--trigger-seconds", None),
    (["table-maintenance"], 2, "required", None),
    (["table-maintenance", "--table", "/nonexistent/t"], 2, "no Delta table", None),
    (["table-maintenance", "--table", "/nonexistent/t", "--retain-hours", "0"], 2, "--retain-hours", None),
    (["doctor", "--meta", "no-port"], 2, "--meta", None),
    (["doctor", "extra"], 2, "unrecognized arguments", None),
    (["demo", "--records", "0"], 2, "--records", None),
    (["demo", "--records", "many"], 2, "--records", None),
]


def _expand(arguments: list[str], meta: str, closed: str) -> list[str]:
    expanded: list[str] = []
    for argument in arguments:
        if argument == META:
            expanded += ["--meta", meta]
        elif argument == CLOSED:
            expanded += ["--meta", closed, "--timeout-s", "1"]
        else:
            expanded.append(argument)
    return expanded


def test_every_subcommand_answers_bad_input_with_one_line_and_no_traceback(meta: str) -> None:
    listed = cli("--help")
    assert listed.returncode == 0
    commands = set(re.findall(r"^    ([a-z][a-z-]+)\s", listed.stdout, flags=re.M))
    assert {"server", "consume", "produce", "nodes", "node", "groups", "demo"} <= commands
    assert commands <= {arguments[0] for arguments, *_ in BAD_INPUT if arguments}, "a subcommand is untested"

    closed = f"127.0.0.1:{free_port()}"
    cases = [
        (_expand(arguments, meta, closed), code, text, stdin) for arguments, code, text, stdin in BAD_INPUT
    ]
    results = cli_many([(arguments, stdin) for arguments, _, _, stdin in cases])
    failures = []
    for (arguments, code, text, _), done in zip(cases, results, strict=True):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        ok = (
            done.returncode == code
            and "Traceback" not in done.stderr
            and len(lines) == 1
            and text in lines[0]
            and "internal error" not in lines[0]
        )
        if not ok:
            failures.append(f"robustmq {' '.join(arguments)} -> {done.returncode}: {done.stderr[-600:]!r}")
    assert not failures, "\n".join(failures)


def test_a_group_commit_covers_exactly_what_was_printed(meta: str) -> None:
    with robustmq.connect(meta) as client:
        client.create_topic("orders", 1)
        with client.producer() as producer:
            producer.send_batch("orders", build_records([f"v{i}".encode() for i in range(10_000)])).result(60)

        done = cli("consume", "orders", "--group", "demo", "--max-records", "3", "--meta", meta)
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["offset"] for line in done.stdout.splitlines()] == [0, 1, 2]
        assert client.group_offsets("demo", "orders") == {0: 3}

        done = cli(
            "consume", "orders", "--from", "group", "--group", "demo", "--max-records", "2", "--meta", meta
        )
        assert done.returncode == 0, done.stderr
        assert [json.loads(line)["offset"] for line in done.stdout.splitlines()] == [3, 4]
        assert client.group_offsets("demo", "orders") == {0: 5}

        # An explicit offset overrides the group's position; earliest/latest only fill in for none.
        done = cli(
            "consume",
            "orders",
            "--from",
            "9998",
            "--group",
            "demo",
            "--idle-timeout-s",
            "1",
            "--format",
            "text",
            "--meta",
            meta,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["v9998", "v9999"]
        assert client.group_offsets("demo", "orders") == {0: 10_000}


def _taken_port() -> socket.socket:
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_taken_node_port_is_one_line_and_exit_1(tmp_path: Path, meta: str) -> None:
    with _taken_port() as holder:
        port = str(holder.getsockname()[1])
        for arguments in (
            [
                "server",
                "--data-dir",
                str(tmp_path / "s"),
                "--meta-port",
                str(free_port()),
                "--node-port",
                port,
            ],
            ["storage-node", "--data-dir", str(tmp_path / "n"), "--node-port", port, "--meta", meta],
            # gRPC's C core printed its own "E... add_port.cc:83] Failed to add port" line first.
            [
                "server",
                "--data-dir",
                str(tmp_path / "m"),
                "--meta-port",
                port,
                "--node-port",
                str(free_port()),
            ],
            ["meta", "--data-dir", str(tmp_path / "o"), "--meta-port", port],
        ):
            done = cli(*arguments)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert done.returncode == 1, done.stderr
            assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
            assert port in lines[0] and "ready" not in done.stdout
            assert "GRPC_VERBOSITY" not in lines[0] and "in use" in lines[0], lines


def test_produce_from_an_open_pipe_flushes_on_a_timer_and_on_ctrl_c(meta: str) -> None:
    import signal

    with robustmq.connect(meta) as client:
        client.create_topic("piped", 1)
        producer = subprocess.Popen(
            [sys.executable, "-m", "robustmq.cli", "produce", "piped", "--meta", meta],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert producer.stdin is not None
            producer.stdin.write("one\ntwo\nthree\n")
            producer.stdin.flush()  # the pipe stays open: no end of input
            wait_until(lambda: client.list_offsets("piped")[0][1] == 3, timeout_s=20)
            assert client.read("piped", 0, 0).column("value").to_pylist() == [b"one", b"two", b"three"]

            producer.stdin.write("four\n")
            producer.stdin.flush()
            wait_until(lambda: client.list_offsets("piped")[0][1] == 4, timeout_s=20)
            producer.send_signal(signal.SIGINT)
            _, stderr = producer.communicate(timeout=30)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait(30)
        assert producer.returncode == 130, stderr
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert "Traceback" not in stderr and len(lines) == 1, stderr
        assert "interrupted" in lines[0] and "4 records" in lines[0]


def test_ctrl_c_flushes_the_lines_read_so_far(meta: str) -> None:
    import signal

    with robustmq.connect(meta) as client:
        client.create_topic("lingering", 1)
        producer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "robustmq.cli",
                "produce",
                "lingering",
                "--linger-ms",
                "600000",
                "--meta",
                meta,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert producer.stdin is not None
            producer.stdin.write("a\nb\n")
            producer.stdin.flush()
            # the process has read the lines (it holds them: linger 10 min); a Ctrl-C before the
            # interpreter finished its imports would be a KeyboardInterrupt, not this test's case
            wait_until(lambda: pipe_is_drained(producer), timeout_s=60)  # type: ignore[arg-type]
            time.sleep(0.5)
            assert client.list_offsets("lingering")[0][1] == 0
            producer.send_signal(signal.SIGINT)
            _, stderr = producer.communicate(timeout=30)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait(30)
        assert producer.returncode == 130, stderr
        assert "Traceback" not in stderr and "2 records" in stderr, stderr
        assert client.read("lingering", 0, 0).column("value").to_pylist() == [b"a", b"b"]


def _json(*arguments: str) -> object:
    done = cli(*arguments)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_json_output_is_typed_and_every_listing_has_it(meta: str) -> None:
    with robustmq.connect(meta) as client:
        client.create_topic("typed", 2)
        client.commit_offsets("typed-group", "typed", {0: 0})
    topics = _json("topic", "list", "--json", "--meta", meta)
    assert isinstance(topics, list)
    assert {
        key: value
        for key, value in next(t for t in topics if t["name"] == "typed").items()
        if key != "retention_ms"
    } == {"name": "typed", "partitions": 2, "engine": "segment", "replication_factor": 1}
    nodes = _json("nodes", "--json", "--meta", meta)
    assert isinstance(nodes, list) and nodes
    for node in nodes:
        assert node["alive"] is True
        assert ISO_UTC.match(node["last_heartbeat"]) and ISO_UTC.match(node["registered"]), node
    groups = _json("groups", "--group", "typed-group", "--json", "--meta", meta)
    assert isinstance(groups, list)
    by_partition = {row["partition"]: row for row in groups}
    assert by_partition[0]["committed"] == 0 and ISO_UTC.match(by_partition[0]["committed_at"])
    assert by_partition[1]["committed"] is None and by_partition[1]["committed_at"] is None
    assert by_partition[1]["lag"] is None or isinstance(by_partition[1]["lag"], int)
    with robustmq.connect(meta) as client, client.producer() as producer:
        producer.send("typed", b"v", partition=1, timestamp_ms=1_763_900_000_123).result(30)
    done = cli("consume", "typed", "--partition", "1", "--max-records", "1", "--meta", meta)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["timestamp"] == "2025-11-23T12:13:20.123Z"


def test_groups_for_a_topic_lists_only_the_groups_that_read_it(meta: str) -> None:
    with robustmq.connect(meta) as client:
        client.create_topic("read-by-one", 1)
        client.create_topic("read-by-other", 1)
        client.commit_offsets("reader-one", "read-by-one", {0: 0})
        client.commit_offsets("reader-other", "read-by-other", {0: 0})
    rows = _json("groups", "--topic", "read-by-one", "--json", "--meta", meta)
    assert isinstance(rows, list)
    assert {row["group"] for row in rows} == {"reader-one"}
    done = cli("groups", "--group", "reader-other", "--topic", "read-by-one", "--meta", meta)
    assert done.returncode == 0 and "reader-other" not in done.stdout, done.stdout


def test_segments_seal_seals_the_active_segments(meta: str) -> None:
    with robustmq.connect(meta) as client:
        client.create_topic("to-seal", 2)
        with client.producer() as producer:
            for value, partition in ((b"a", 0), (b"b", 0), (b"c", 1)):
                producer.send("to-seal", value, partition=partition).result(30)
        done = cli("segments", "seal", "to-seal", "1", "--meta", meta)
        assert done.returncode == 0, done.stderr
        assert "sealed to-seal partition 1" in done.stdout, done.stdout
        chains = {shard.partition: list(shard.segments) for shard in client.describe_topic("to-seal").shards}
        assert [segment.epoch for segment in chains[1]] == [0, 1] and len(chains[0]) == 1
        done = cli("segments", "seal", "to-seal", "--meta", meta)
        assert done.returncode == 0, done.stderr
        assert "partition 1: not sealed" in done.stdout and "empty" in done.stdout, done.stdout
        chains = {shard.partition: list(shard.segments) for shard in client.describe_topic("to-seal").shards}
        assert len(chains[0]) == 2, chains  # partition 0 had records: sealed now
        listed = cli("segments", "list", "to-seal", "--meta", meta)
        assert listed.returncode == 0 and "sealed" in listed.stdout, listed.stderr


def test_local_retention_settings_and_tiered_segments_show_in_describe_and_segments(meta: str) -> None:
    from robustmq.tier._store import ObjectStore, segment_key

    # An hour: the server's retention pass (every 30 s) must not make the segment remote meanwhile.
    created = cli("topic", "create", "tiers", "--local-retention-ms", "3600000", "--meta", meta)
    assert created.returncode == 0, created.stderr
    described = cli("topic", "describe", "tiers", "--meta", meta)
    assert "local_retention_ms=3600000 local_retention_bytes=-1" in described.stdout, described.stdout
    config = json.loads(cli("topic", "describe", "tiers", "--json", "--meta", meta).stdout)["config"]
    assert (config["local_retention_ms"], config["local_retention_bytes"]) == (3600000, -1)
    with robustmq.connect(meta) as client:
        tier_url = client.meta.cluster_config().tier_url
        assert tier_url.startswith("file://") and tier_url.endswith("/tier")  # the server's default
        with client.producer() as producer:
            producer.send("tiers", b"a").result(30)
        assert cli("segments", "seal", "tiers", "0", "--meta", meta).returncode == 0
        shard = client.meta.get_shard("tiers_0")
        sealed = shard.segments[0]
        url = ObjectStore.from_url(tier_url).url_of(
            segment_key("tiers", 0, 0, 0, incarnation=shard.incarnation)
        )
        # The newest record's time is now: a max_timestamp_ms of 1 (1970) made the segment older
        # than the hour, and a retention pass between this and the listing made it remote.
        client.meta.mark_tiered("tiers_0", shard.incarnation, 0, url, 10, int(time.time() * 1000))
    listed = json.loads(cli("segments", "tiers", "--json", "--meta", meta).stdout)
    assert [(row["state"], row["object_url"], row["sealed_seq"]) for row in listed] == [
        ("tiered", url, sealed.sealed_seq),
        ("active", None, None),
    ]


def test_topic_alter_changes_settings_the_node_applies_without_a_restart(meta: str) -> None:
    from robustmq.errors import RecordBatchTooLarge

    with robustmq.connect(meta) as client:
        client.create_topic("alterable", 1)
        described = cli("topic", "describe", "alterable", "--meta", meta)
        assert "segment_bytes_max=134217728" in described.stdout and "retention_ms=-1" in described.stdout
        # This producer's client learned the old max_batch_bytes (16 MiB): the node must refuse
        # for itself once it has the new one.
        with client.producer() as producer:
            producer.send("alterable", b"x").result(30)
            altered = cli(
                "topic", "alter", "alterable", "--set", "segment-bytes=65536",
                "--set", "retention_ms=3600000", "--meta", meta,
            )  # fmt: skip
            assert altered.returncode == 0, altered.stderr
            assert altered.stdout.strip() == (
                "altered topic alterable: retention_ms=3600000 (was -1), "
                "segment_bytes_max=65536 (was 134217728)"
            ), altered.stdout
            described = cli("topic", "describe", "alterable", "--meta", meta).stdout
            assert "segment_bytes_max=65536" in described and "retention_ms=3600000" in described, described

            def sealed_by_size() -> bool:  # 16 KiB a send: the new 64 KiB limit rolls within a few
                producer.send("alterable", b"v" * 16_384).result(30)
                return len(client.describe_topic("alterable").shards[0].segments) > 1

            wait_until(sealed_by_size, 30)
            same = cli("topic", "alter", "alterable", "--set", "retention_ms=3600000", "--meta", meta)
            assert same.returncode == 0 and "nothing changed" in same.stdout, same.stdout
            assert (
                cli("topic", "alter", "alterable", "--set", "max_batch_bytes=1024", "--meta", meta).returncode
                == 0
            )

            def refused_by_the_node() -> bool:
                try:
                    producer.send("alterable", b"w" * 4096).result(30)
                except RecordBatchTooLarge:
                    return True
                return False

            wait_until(refused_by_the_node, 30)


def test_server_with_an_unusable_tier_url_exits_2_with_one_line(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/not-mounted/tier"
    done = cli("server", "--data-dir", str(tmp_path / "data"), "--meta-port", "0", "--node-port", "0",
               "--tier-url", url)  # fmt: skip
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0] and "Traceback" not in done.stderr, done.stderr
