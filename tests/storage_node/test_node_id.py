"""A storage node's id: made once per data directory, chosen (``--node-id``) or random, then kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from robustmq.errors import InvalidConfig
from robustmq.storage_node.node._node import _node_id


def test_a_new_directory_takes_the_chosen_id_and_keeps_it(tmp_path: Path) -> None:
    assert _node_id(tmp_path, None, "node-0") == ("node-0", True)
    assert (tmp_path / "node_id").read_text() == "node-0\n"
    assert _node_id(tmp_path, None, "node-0") == ("node-0", False)
    assert _node_id(tmp_path) == ("node-0", False)  # without a choice: the stored one
    with pytest.raises(InvalidConfig, match="holds the data of node 'node-0', not 'node-1'"):
        _node_id(tmp_path, None, "node-1")  # a directory's id stands for its data: never renamed


def test_without_a_choice_the_id_is_random_and_a_certificate_must_agree(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    made, fresh = _node_id(tmp_path / "a")
    assert fresh and made.startswith("node-") and len(made) == len("node-") + 12
    with pytest.raises(InvalidConfig, match="differs from the certificate"):
        _node_id(tmp_path / "b", "node-1", "node-2")
    assert _node_id(tmp_path / "b", "node-1", "node-1") == ("node-1", True)
