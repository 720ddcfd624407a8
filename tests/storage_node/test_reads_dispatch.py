"""Every read request body the node routes is handled by the incarnation and high-watermark
checks without failing on the request's own shape (a review found ``producer_snapshot``
refused with a ValueError: its ``incarnation`` has no presence, unlike the readers')."""

from __future__ import annotations

import pytest

from robustmq._proto import robustmq_pb2 as pb
from robustmq.storage_node.node._reads import _OWN_INCARNATION_CHECK, _READS, _named_incarnation


@pytest.mark.parametrize("body", [body for body in _READS if body not in _OWN_INCARNATION_CHECK])
def test_the_incarnation_a_read_names_is_found_for_every_body(body: str) -> None:
    message = pb.NodeRequest()
    getattr(message, body).SetInParent()
    assert _named_incarnation(message, body, 0) == -1  # nothing named: not checked
    if body == "list_offsets":
        message.list_offsets.shards.append("t_0")
        message.list_offsets.incarnations.append(7)
    else:
        getattr(message, body).incarnation = 7
    assert _named_incarnation(message, body, 0) == 7


def test_every_routed_read_either_names_its_incarnation_or_checks_its_own() -> None:
    for body in _READS:
        ask = getattr(pb.NodeRequest(), body)
        field = ask.DESCRIPTOR.fields_by_name.get("incarnation" if body != "list_offsets" else "incarnations")
        assert field is not None, f"{body} names no incarnation"
        if body not in _OWN_INCARNATION_CHECK and body != "list_offsets":
            assert field.has_presence, f"{body}.incarnation has no presence: unset would read as 0"
