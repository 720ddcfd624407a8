"""Read bounds (issue 22, item 7): one validation for every read body, through a real node.

A real Meta Service and storage node run in-process on loopback; the reads go
over ZeroMQ as a client sends them, with bounds a client library would not send.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import robustmq
from robustmq._proto import robustmq_pb2 as pb
from robustmq._records import build_records
from robustmq.cli._embedded import EmbeddedCluster
from robustmq.errors import InvalidRequest
from storage_node.node._read_bounds import check_read_bounds


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[robustmq.Client]:
    root: Path = tmp_path_factory.mktemp("read-bounds")
    with (
        EmbeddedCluster(root, meta_port=0, node_port=0) as cluster,
        robustmq.connect(cluster.meta_address, timeout_s=20) as connected,
    ):
        connected.create_topic("bounds", 1)
        connected.produce("bounds", 0, build_records([f"r{i}".encode() for i in range(10)]))
        yield connected


def _ask(client: robustmq.Client, body: str, **fields: Any) -> tuple[pb.NodeResponse, list[Any]]:
    route = client.metadata.write_route("bounds", 0)
    request = pb.NodeRequest()
    getattr(request, body).CopyFrom(getattr(pb, _MESSAGES[body])(shard=route.shard, **fields))
    response, frames = client.transport.request(route.address, request).result(20)
    return response, frames


_MESSAGES = {"fetch": "FetchRequest", "scan": "ScanRequest", "read_by_tag": "ReadByTagRequest"}


@pytest.mark.parametrize(
    ("body", "fields", "field"),
    [
        ("scan", {"start_offset": -10, "end_offset": -5}, "start_offset"),
        ("scan", {"start_offset": 0, "end_offset": -5}, "end_offset"),
        ("scan", {"start_offset": 5, "end_offset": 2}, "end_offset"),
        ("scan", {"start_offset": 0, "end_offset": -1, "max_records": -1}, "max_records"),
        (
            "scan",
            {"start_offset": 0, "end_offset": -1, "min_timestamp_ms": 9, "max_timestamp_ms": 3},
            "min_timestamp_ms",
        ),
        ("read_by_tag", {"tag": "x", "max_records": -1}, "max_records"),
        ("read_by_tag", {"tag": "x", "start_offset": -3}, "start_offset"),
        ("fetch", {"offset": 0, "max_bytes": -1}, "max_bytes"),
        ("fetch", {"offset": 0, "max_records": -1}, "max_records"),
        ("fetch", {"offset": 0, "max_wait_ms": -1}, "max_wait_ms"),
        ("fetch", {"offset": -1}, "offset"),
    ],
)
def test_inconsistent_read_bounds_are_refused_naming_the_field(
    client: robustmq.Client, body: str, fields: dict[str, Any], field: str
) -> None:
    """Before: scan -10..-5 returned all 10 records, scan 5..2 and read_by_tag max_records -1 were
    answered, fetch max_bytes -1 returned data."""
    with pytest.raises(InvalidRequest) as caught:
        _ask(client, body, **fields)
    assert caught.value.code == "INVALID_REQUEST" and not caught.value.retriable
    assert caught.value.fields["field"] == field
    assert caught.value.fields["value"] == fields[field]


def test_consistent_bounds_still_read(client: robustmq.Client) -> None:
    response, _ = _ask(client, "scan", start_offset=2, end_offset=5)
    assert response.read.next_offset == 5
    response, _ = _ask(client, "scan", start_offset=3, end_offset=3)  # empty, not an error
    assert response.read.next_offset == 3
    response, frames = _ask(client, "fetch", offset=0, max_bytes=0, max_records=0)
    assert response.fetch.next_offset == 10 and frames


def test_list_offsets_names_at_most_ten_thousand_shards() -> None:
    """Before, the node answered the first 10,000 and silently left out the rest."""
    request = pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=["t_0"] * 10_001))
    with pytest.raises(InvalidRequest) as caught:
        check_read_bounds(request, "list_offsets")
    assert caught.value.fields["field"] == "shards"
    check_read_bounds(
        pb.NodeRequest(list_offsets=pb.ListOffsetsRequest(shards=["t_0"] * 10_000)), "list_offsets"
    )
