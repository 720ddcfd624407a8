"""``robustmq topic-to-delta`` as a user runs it: a real process, real signals, its help and errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from robustmq._records import build_records
from robustmq.streaming_jobs.topic_to_delta import _failure_message, options_table, parser
from tests.e2e._procs import ROOT, free_port

DOCS = ROOT / "docs" / "spark.md"
ROBUSTMQ = [sys.executable, "-m", "robustmq.cli"]


def _run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ROBUSTMQ, "topic-to-delta", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def test_a_missing_topic_or_meta_service_is_one_line_before_spark_starts(
    cluster, client, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    table, checkpoint = tmp_path / "table", tmp_path / "ck"
    groups = set(client.list_groups())
    paths = ["--table", str(table), "--checkpoint", str(checkpoint)]
    missing = _run("--meta", cluster.meta_address, "--topic", "nosuch", *paths)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.splitlines() == [
        f"robustmq topic-to-delta: --topic nosuch: no such topic at the Meta Service {cluster.meta_address} "
        "(robustmq topic list shows the topics)"
    ], missing.stderr
    # Skipping lost records does not skip the check on a first run: there is no checkpoint to go on from.
    skipping = _run(
        "--meta", cluster.meta_address, "--topic", "nosuch", "--fail-on-data-loss", "false", *paths
    )
    assert skipping.returncode == 2 and skipping.stderr == missing.stderr, skipping.stderr
    down = f"127.0.0.1:{free_port()}"
    unreachable = _run("--meta", down, "--topic", "orders", *paths)
    assert unreachable.returncode == 1, unreachable.stderr
    lines = unreachable.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"robustmq topic-to-delta: --meta {down}: cannot reach the Meta Service"
    ), unreachable.stderr
    assert not table.exists() and not checkpoint.exists(), "a refused start left a table or checkpoint"
    assert set(client.list_groups()) == groups, "a refused start made a consumer group"


@pytest.mark.parametrize(
    "module", ["robustmq.streaming_jobs.topic_to_delta", "streaming_jobs.topic_to_delta"]
)
def test_help_lists_every_option_with_its_default(module: str) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr  # no runpy warning either
    text = shown.stdout
    assert "``" not in text and ":mod:" not in text and "_delta" not in text, text
    # A shell continuation in an example keeps its line break (a docstring's backslash-newline did not).
    assert not re.search(r"\S {3,}--", text.split("options:")[0]), text
    chosen = {a.dest for g in parser()._mutually_exclusive_groups if g.required for a in g._group_actions}
    for action in parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.option_strings[0] in text, f"--help omits {action.option_strings[0]}"
        if not action.required and action.dest not in chosen:
            assert "default" in str(action.help), f"{action.option_strings[0]}: --help gives no default"


def test_the_docs_list_the_options_as_help_does() -> None:
    match = re.search(
        r"<!-- generated: topic-to-delta-options -->\n(.*?)\n<!-- end: topic-to-delta-options -->",
        DOCS.read_text(),
        re.DOTALL,
    )
    assert match, "docs/spark.md has no topic-to-delta-options block"
    assert match.group(1) == options_table(), f"docs/spark.md should list:\n{options_table()}"


def test_failures_name_the_command_line_flag_not_the_source_option() -> None:
    failure = (
        "[STREAM_FAILED] Query terminated with exception: ... robustmq.errors.RobustMQError: topic t was "
        "deleted; nothing it saw is lost; set failOnDataLoss=false to go on (docs/spark.md, 'Data loss')\n"
        " SQLSTATE: 38000"
    )
    message = _failure_message(failure)
    assert "run with --fail-on-data-loss false to go on" in message and "failOnDataLoss" not in message


@pytest.mark.spark
@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_the_query_in_one_line(
    cluster, client, tmp_path: Path, stop, code: int
) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C goes to the terminal's whole process group (the JVM and Python workers too); a
    supervisor sends SIGTERM to the job's process."""
    topic = f"i{uuid.uuid4().hex[:8]}"
    client.create_topic(topic, 1)
    with client.producer() as producer:
        producer.send_batch(topic, build_records([b"x%d" % i for i in range(100)])).result(60)
    args = ["--meta", cluster.meta_address, "--topic", topic, "--table", str(tmp_path / "table")]
    args += ["--checkpoint", str(tmp_path / "ck"), "--trigger-seconds", "0.5"]
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as stderr:
        job = subprocess.Popen(
            [*ROBUSTMQ, "topic-to-delta", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group, as a shell gives a foreground job
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    ready = threading.Event()

    def pump() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            if line.strip() == "ready":
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(180), stderr_path.read_text()[-3000:]
        deadline = time.monotonic() + 120  # the first micro-batch is in the table
        while not (tmp_path / "table" / "_delta_log" / "00000000000000000001.json").exists():
            assert time.monotonic() < deadline and job.poll() is None, stderr_path.read_text()[-3000:]
            time.sleep(0.2)
        if stop == signal.SIGINT:
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGTERM)
        returncode = job.wait(timeout=90)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    text = stderr_path.read_text()
    assert returncode == code, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-5000:]
    name = "interrupted" if stop == signal.SIGINT else "terminated"
    assert text.count(f"robustmq topic-to-delta: {name}; stopping the query") == 1, text[-3000:]
    deadline = time.monotonic() + 30  # the JVM and Spark's Python workers end with the job
    while True:
        try:
            os.killpg(job.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            raise AssertionError("processes of the job outlived it")
        time.sleep(0.2)
