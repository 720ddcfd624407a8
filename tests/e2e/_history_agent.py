"""The nemesis's hands inside the lab: admin calls through the public client, as a child process.

The nemesis runs in the test's own (root) network namespace, from which the
lab's 10.x addresses are not routed, so what it does through the client
(look up leaders, seal, drain, remove nodes) runs in this child process in
the lab's ``nemesis`` host, which no partition ever cuts off. It talks to the
Meta Service directly (never through the answer-loss proxy).

``python -m tests.e2e._history_agent --meta HOST:PORT`` prints ``ready``, then
answers one JSON command per line (:func:`tests.e2e._procs.serve_json_lines`):

- ``{"op": "describe", "topics": [...]}`` -> ``partitions``: per partition its
  shard, incarnation, the high watermark the leader last reported, and its
  segments ``[epoch, start, end, state, leader, replicas, isr]`` (oldest first);
  topics that do not exist are left out;
- ``{"op": "nodes"}`` -> ``nodes``: ``[node_id, address, alive, draining]``;
- ``{"op": "seal", "topic", "partition"}`` -> ``epoch, end, next_epoch``;
- ``{"op": "drain", "node", "undrain"}`` -> ``draining``;
- ``{"op": "remove", "node", "force"}`` -> ``led``: the shards it still led.

Every call is bounded by the client's ``--timeout-s``; an error is answered,
never fatal. :class:`AgentProcess` is the parent's handle.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq.errors import TopicNotFound
from tests.e2e._procs import JsonLineProcess, serve_json_lines

__all__ = ["AgentProcess", "main"]


def _describe(client: robustmq.Client, topics: list[str]) -> dict[str, Any]:
    partitions = []
    for topic in topics:
        try:
            description = client.describe_topic(topic)
        except TopicNotFound:
            continue
        for shard in description.shards:
            partitions.append(
                {
                    "topic": topic,
                    "partition": shard.partition,
                    "shard": shard.shard,
                    "incarnation": shard.incarnation,
                    "reported_hw": shard.high_watermark,
                    "segments": [
                        [
                            s.epoch,
                            s.start_offset,
                            s.end_offset,
                            pb.SegmentState.Name(s.state),
                            s.leader,
                            list(s.replicas),
                            list(s.isr),
                        ]
                        for s in shard.segments
                    ],
                }
            )
    return {"partitions": partitions}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="admin calls for the history nemesis")
    parser.add_argument("--meta", required=True)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    with robustmq.connect(args.meta, timeout_s=args.timeout_s) as client:

        def handle(command: dict[str, Any]) -> dict[str, Any]:
            op = command["op"]
            if op == "describe":
                return _describe(client, list(command["topics"]))
            if op == "nodes":
                nodes = client.list_nodes()
                return {"nodes": [[n.node_id, n.address, n.alive, n.draining] for n in nodes]}
            if op == "seal":
                answer = client.seal(command["topic"], int(command["partition"]))
                return {
                    "epoch": answer.sealed.epoch,
                    "end": answer.sealed.end_offset,
                    "next_epoch": answer.next.epoch,
                }
            if op == "drain":
                info = client.drain_node(command["node"], undrain=bool(command.get("undrain")))
                return {"draining": info.draining}
            if op == "remove":
                removed = client.remove_node(command["node"], force=bool(command.get("force")))
                return {"led": list(removed.led_shards)}
            raise ValueError(f"unknown op {op!r}")

        serve_json_lines(handle)
    return 0


class AgentProcess(JsonLineProcess):
    """The parent's handle on the agent, run under ``wrapper`` (``ip netns exec NS``)."""

    def __init__(self, meta: str, *, wrapper: Sequence[str], log_path: Path | None = None) -> None:
        argv = [*wrapper, sys.executable, "-m", "tests.e2e._history_agent", "--meta", meta]
        super().__init__(argv, log_path=log_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
