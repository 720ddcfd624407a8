"""The client's transport to storage nodes, on its own."""

from __future__ import annotations

from robustmq._transport import NodeTransport


def test_transports_made_right_after_others_closed_each_get_their_own_inbox() -> None:
    """A transport's inproc inbox is released by ZeroMQ after ``close`` returns, and a new
    object can get the old one's ``id``: the inbox name must not come from it."""
    for _ in range(300):
        NodeTransport(timeout_s=1).close()
