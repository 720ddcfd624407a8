"""When a node answers what it holds, and taking what is due from an unordered queue."""

from __future__ import annotations

from collections import deque

import pytest

from robustmq.storage_node.replication._deadlines import answer_by, take_due


def test_a_client_that_names_no_timeout_waits_the_node_limit_from_the_start_of_the_wait() -> None:
    assert answer_by(103.0, 10.0, 100.0, 0) == 113.0


def test_the_answer_comes_before_the_client_gives_up_with_room_for_the_way_back() -> None:
    assert answer_by(100.0, 10.0, 100.0, 5_000) == 104.0  # 5 s less a fifth (1 s)
    assert answer_by(100.0, 10.0, 100.0, 30_000) == 110.0  # the node's own limit is earlier
    assert answer_by(100.0, 10.0, 100.0, 1_000) == 100.75  # at least 0.25 s: the worker ticks
    assert answer_by(100.0, 10.0, 100.0, 300) == pytest.approx(100.15)  # never more than half of it
    assert answer_by(105.0, 10.0, 100.0, 20_000) == 115.0  # held later: its own limit from then


def test_due_items_are_taken_wherever_they_are_and_the_rest_keep_their_order() -> None:
    queue = deque([("a", 5.0), ("b", 1.0), ("c", 9.0), ("d", 2.0)])
    assert take_due(queue, 2.0, lambda item: item[1]) == [("b", 1.0), ("d", 2.0)]
    assert list(queue) == [("a", 5.0), ("c", 9.0)]
    assert take_due(queue, 2.0, lambda item: item[1]) == []
    assert list(queue) == [("a", 5.0), ("c", 9.0)]
