"""``robustmq acl add|list|remove`` against a real Meta Service; bad input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e._procs import ROOT, ServerProcess, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data_dir = tmp_path_factory.mktemp("acl-cli") / "meta"
    process = ServerProcess(["meta", "--data-dir", str(data_dir), "--meta-port", str(port)]).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.stop()


def robustmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ServerProcess([]).args, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_add_list_remove(meta: str) -> None:
    added = robustmq(
        "acl",
        "add",
        "--principal",
        "user:alice",
        "--topic",
        "orders",
        "--operation",
        "read",
        "--operation",
        "write",
        "--meta",
        meta,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines() == [
        "added: allow user:alice read topic orders",
        "added: allow user:alice write topic orders",
    ]
    again = robustmq(
        "acl", "add", "--principal", "user:alice", "--topic", "orders", "--operation", "read", "--meta", meta
    )
    assert again.stdout.strip() == "already there: allow user:alice read topic orders"
    denied = robustmq(
        "acl",
        "add",
        "--principal",
        "*",
        "--topic",
        "secret.",
        "--prefixed",
        "--operation",
        "all",
        "--deny",
        "--meta",
        meta,
    )
    assert denied.returncode == 0, denied.stderr
    listed = json.loads(robustmq("acl", "list", "--json", "--meta", meta).stdout)
    assert listed["acl_version"] == 3
    assert {
        (a["principal"], a["permission"], a["operation"], a["resource_name"], a["pattern"])
        for a in listed["acls"]
    } == {
        ("user:alice", "allow", "read", "orders", "literal"),
        ("user:alice", "allow", "write", "orders", "literal"),
        ("*", "deny", "all", "secret.", "prefixed"),
    }
    table = robustmq("acl", "list", "--principal", "user:alice", "--meta", meta).stdout
    assert "orders" in table and "secret." not in table
    removed = robustmq(
        "acl",
        "remove",
        "--principal",
        "user:alice",
        "--topic",
        "orders",
        "--operation",
        "write",
        "--meta",
        meta,
    )
    assert removed.stdout.strip() == "removed: allow user:alice write topic orders"
    missing = robustmq(
        "acl",
        "remove",
        "--principal",
        "user:alice",
        "--topic",
        "orders",
        "--operation",
        "write",
        "--meta",
        meta,
    )
    assert (missing.returncode, missing.stdout.strip()) == (
        0,
        "no such ACL: allow user:alice write topic orders",
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--principal", "alice", "--topic", "t", "--operation", "read"], "--principal"),
        (["--principal", "user:a", "--topic", "a b", "--operation", "read"], "invalid topic name"),
        (["--principal", "user:a", "--cluster", "--prefixed", "--operation", "alter"], "--prefixed"),
        (["--principal", "user:a", "--operation", "read"], "--topic"),
        (["--principal", "user:a", "--topic", "t", "--operation", "fly"], "--operation"),
        (
            ["--principal", "user:a", "--topic", "t", "--group", "g", "--operation", "read"],
            "not allowed with",
        ),
        (
            ["--principal", "user:a", "--topic", "t", "--operation", "read", "--allow", "--deny"],
            "not allowed with",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(meta: str, args: list[str], says: str) -> None:
    before = json.loads(robustmq("acl", "list", "--json", "--meta", meta).stdout)
    result = robustmq("acl", "add", *args, "--meta", meta)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert says in lines[0] and "Traceback" not in result.stderr
    assert json.loads(robustmq("acl", "list", "--json", "--meta", meta).stdout) == before
