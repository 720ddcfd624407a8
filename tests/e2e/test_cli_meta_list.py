"""``--meta`` and ``ROBUSTMQ_META`` take the Meta Service's addresses as a comma list, as users type them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from robustmq.meta import MetaServer
from tests.e2e._cli import cli
from tests.e2e._procs import free_port


@pytest.fixture
def live(tmp_path: Path) -> Iterator[MetaServer]:
    with MetaServer(tmp_path / "meta", port=0) as server:
        yield server


def test_a_list_whose_first_instance_is_down_reaches_the_live_one(live: MetaServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    listed = cli("topic", "list", "--meta", f"{dead},{live.address}", "--timeout-s", "20")
    assert listed.returncode == 0, listed.stderr


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["topic", "list", "--meta", "127.0.0.1:7070,,127.0.0.1:7071"], {}, "an empty Meta Service address"),
        (["storage-node", "--meta", "127.0.0.1:7070,h2"], {}, "invalid Meta Service address 'h2'"),
        (["topic", "list"], {"ROBUSTMQ_META": "127.0.0.1:7070;h2:7071"}, "ROBUSTMQ_META: invalid"),
        (
            ["topic-to-delta", "--meta", "a:1,,b:2", "--topic", "t", "--table", "t", "--checkpoint", "c"],
            {},
            "an empty Meta Service address",
        ),
    ],
)
def test_a_bad_list_is_one_line_and_exit_2(
    args: list[str], env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the child inherits it
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], done.stderr
