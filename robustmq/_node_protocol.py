"""Framing of storage-node messages (shared by the node and the client).

A request is the ZeroMQ multipart message ``[NodeRequest, payload...]`` sent
from a DEALER; the node's ROUTER sees ``[identity, NodeRequest, payload...]``
and answers ``[identity, NodeResponse, payload...]``. Payloads are Arrow IPC
streams (produce, read answers) or whole frames (fetch answers), sent and
received zero-copy.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from robustmq._proto import robustmq_pb2 as pb
from robustmq._wire import error_info

__all__ = ["MAX_HEADER_BYTES", "error_response", "table_payload"]

# A header is a few hundred bytes; anything much larger is hostile or broken.
MAX_HEADER_BYTES = 64 * 1024
# The ReplicaFetch asker of a reader that copies whole sealed segments (the tiering job). A node
# serves it sealed epochs only (never an active one: it is no replica), so it reads committed
# records and moves no high watermark; with security on it needs Read on the topic, not a node.
SEALED_SEGMENT_READER = "robustmq-tier-job"


def error_response(correlation_id: int, error: BaseException) -> pb.NodeResponse:
    return pb.NodeResponse(correlation_id=correlation_id, error=error_info(error))


def table_payload(table: pa.Table) -> Any:
    """One IPC stream holding ``table`` (used for read answers)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()
