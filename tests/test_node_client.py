"""The node-to-node request helper on its own: typed errors when a node does not answer."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from robustmq._node_client import NodeCaller
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import InvalidRequest, RequestTimeout, Unavailable
from tests.e2e._procs import free_port


def test_a_node_that_does_not_answer_is_a_request_timeout_and_one_not_listening_unavailable() -> None:
    context: zmq.Context[Any] = zmq.Context.instance()
    silent = context.socket(zmq.ROUTER)  # takes requests, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    caller = NodeCaller(timeout_s=0.3)
    try:
        ask = pb.ChecksumRequest(shard="t_0", start_offset=0, end_offset=1)
        with pytest.raises(RequestTimeout):
            caller.call(f"tcp://127.0.0.1:{port}", "checksum", ask)
        with pytest.raises(Unavailable) as refused:
            caller.call(f"tcp://127.0.0.1:{free_port()}", "checksum", ask)
        assert refused.value.fields["address"].startswith("tcp://127.0.0.1:")
        with pytest.raises(InvalidRequest):
            caller.call(f"tcp://127.0.0.1:{port}", "no_such_request", ask)
    finally:
        caller.close()
        silent.close(linger=0)
