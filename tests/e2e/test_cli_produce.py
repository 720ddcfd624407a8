"""``robustmq produce`` as a user runs it: real pipes, real signals, a real server.

What a new user tried: ``timeout``/systemd/``docker stop`` (SIGTERM) and a
dropped ssh session (SIGHUP) must not lose the lines already read; Ctrl-C with
stdin still open must exit 130, not abort at interpreter shutdown; the
documented ``--key-separator TAB`` must work; lines the command cannot send as
given are refused naming the line, never stored differently or dropped.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

import robustmq
from tests.e2e._cli import cli, cli_server, pipe_is_drained, popen_cli, stderr_lines
from tests.e2e._procs import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cli_server(tmp_path_factory.mktemp("produce")) as address:
        yield address


def values(meta: str, topic: str, partition: int = 0) -> list[bytes | None]:
    with robustmq.connect(meta) as client:
        return client.read(topic, partition, 0, 100_000).column("value").to_pylist()


def keys(meta: str, topic: str) -> list[bytes | None]:
    with robustmq.connect(meta) as client:
        return client.read(topic, 0, 0, 100_000).column("key").to_pylist()


def create(meta: str, topic: str, partitions: int = 1, **settings: int) -> None:
    with robustmq.connect(meta) as client:
        client.create_topic(topic, partitions, **settings)


@pytest.mark.parametrize(
    ("signum", "topic"),
    [(signal.SIGTERM, "sigterm"), (signal.SIGHUP, "sighup"), (signal.SIGINT, "sigint-open-stdin")],
)
def test_a_signal_sends_the_lines_read_so_far_and_exits_128_plus_the_signal(
    meta: str, signum: int, topic: str
) -> None:
    """SIGTERM/SIGHUP lost every held line; SIGINT with stdin open aborted (SIGABRT) at shutdown."""
    create(meta, topic)
    # A 10-minute linger: nothing is sent before the signal, the lines are only held.
    producer = popen_cli("produce", topic, "--linger-ms", "600000", "--meta", meta)
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"".join(b"m%d\n" % i for i in range(1000)))
        producer.stdin.flush()  # and the pipe stays open: no end of input
        wait_until(lambda: pipe_is_drained(producer), timeout_s=30)
        producer.send_signal(signum)
        producer.wait(60)
        assert producer.stderr is not None
        stderr = producer.stderr.read().decode(errors="replace")
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(30)
    assert producer.returncode == 128 + signum, stderr
    lines = stderr_lines(stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert signal.Signals(signum).name in lines[0] and "1,000 records" in lines[0], lines
    assert values(meta, topic) == [b"m%d" % i for i in range(1000)]


def test_a_partial_last_line_at_a_signal_is_reported_not_silently_dropped(meta: str) -> None:
    create(meta, "partial")
    producer = popen_cli("produce", "partial", "--linger-ms", "600000", "--meta", meta)
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"whole\nhalf a li")
        producer.stdin.flush()
        wait_until(lambda: pipe_is_drained(producer), timeout_s=30)
        producer.send_signal(signal.SIGTERM)
        producer.wait(60)
        assert producer.stderr is not None
        stderr = producer.stderr.read().decode()
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(30)
    assert producer.returncode == 143, stderr
    assert "1 record " in stderr and "unfinished last line (9 bytes" in stderr, stderr
    assert values(meta, "partial") == [b"whole"]


@pytest.mark.parametrize(
    ("name", "topic"), [("TAB", "sep-name"), ("tab", "sep-lower"), ("\\t", "sep-escape"), ("\t", "sep-tab")]
)
def test_the_documented_separator_names_work(meta: str, name: str, topic: str) -> None:
    create(meta, topic)
    done = cli("produce", topic, "--key-separator", name, "--meta", meta, stdin="k1\tv1\nk2\tv\t2\n")
    assert done.returncode == 0, done.stderr
    assert keys(meta, topic) == [b"k1", b"k2"]
    assert values(meta, topic) == [b"v1", b"v\t2"]


def test_a_line_without_the_separator_is_refused_naming_it(meta: str) -> None:
    create(meta, "sep-missing")
    done = cli(
        "produce", "sep-missing", "--key-separator", "COMMA", "--meta", meta, stdin="a,1\nno-key\nb,2\n"
    )
    lines = stderr_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "line 2" in lines[0] and "separator" in lines[0], lines
    assert keys(meta, "sep-missing") == [b"a"]  # the lines before it are sent; nothing after


def test_empty_lines_are_empty_records_and_blank_json_lines_are_counted(meta: str) -> None:
    create(meta, "empties")
    done = cli("produce", "empties", "--meta", meta, stdin="a\n\nb\r\n\n")
    assert done.returncode == 0, done.stderr
    assert values(meta, "empties") == [b"a", b"", b"b", b""]
    assert "produced 4 records to empties" in done.stdout

    create(meta, "blank-json")
    done = cli("produce", "blank-json", "--format", "json", "--meta", meta, stdin='{"value": "x"}\n\n   \n')
    assert done.returncode == 0, done.stderr
    assert values(meta, "blank-json") == [b"x"]
    assert "produced 1 record to blank-json (skipped 2 blank lines)" in done.stdout


def test_a_json_line_with_a_partition_out_of_range_is_refused_naming_the_line(meta: str) -> None:
    create(meta, "json-partitions", 2)
    lines = '{"value": "a", "partition": 1}\n{"value": "b", "partition": 2}\n'
    done = cli("produce", "json-partitions", "--format", "json", "--meta", meta, stdin=lines)
    errors = stderr_lines(done.stderr)
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "line 2" in errors[0] and "partition 2" in errors[0], errors
    assert values(meta, "json-partitions", 1) == [b"a"]


def test_a_line_above_the_batch_limit_is_refused_at_once_naming_the_limit(meta: str) -> None:
    create(meta, "small-batches", max_batch_bytes=64 * 1024)
    done = cli(
        "produce", "small-batches", "--meta", meta, stdin=b"ok\n" + b"x" * 100_000 + b"\n", timeout_s=60
    )
    errors = stderr_lines(done.stderr)
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "line 2" in errors[0] and "max_batch_bytes" in errors[0] and "65,536" in errors[0], errors
    assert values(meta, "small-batches") == [b"ok"]
