"""``acks`` is parsed in one place and means the same on the producer, the client and the sink."""

from __future__ import annotations

from typing import Any

import pytest

from robustmq._acks import DEFAULT_ACKS, acks_wire, parse_acks
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidConfig


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("all", "all"),
        ("ALL", "all"),
        (" quorum ", "quorum"),
        ("1", "1"),
        (1, "1"),
        (-1, "all"),
        ("-1", "all"),
    ],
)
def test_every_documented_spelling_gives_its_level(given: Any, expected: str) -> None:
    assert parse_acks(given) == expected


@pytest.mark.parametrize("given", ["2", 2, 0, "0", "leader", "", None, True, 1.0, "majority"])
def test_anything_else_is_invalid_config_naming_the_allowed_values(given: Any) -> None:
    with pytest.raises(InvalidConfig, match='"all", "quorum" or "1"') as raised:
        parse_acks(given)
    assert raised.value.fields["field"] == "acks"


def test_zero_says_why_it_is_not_offered() -> None:
    with pytest.raises(InvalidConfig, match="not offered"):
        parse_acks(0)


def test_the_wire_values_and_the_default() -> None:
    assert [acks_wire(a) for a in ("1", "all", "quorum", -1)] == [
        pb.ACKS_LEADER,
        pb.ACKS_ALL,
        pb.ACKS_QUORUM,
        pb.ACKS_ALL,
    ]
    assert DEFAULT_ACKS == "all"
