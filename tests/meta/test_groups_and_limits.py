"""Meta Service limits and group administration through the real gRPC API.

A message past gRPC's size limit is a typed error at once (retrying cannot
help); ``ListGroups`` answers in bounded pages; a group can be deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from robustmq._meta_client import MetaClient
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq.errors import InvalidRequest, MessageTooLarge
from tests.meta.test_service import Meta, register


@pytest.fixture
def meta(tmp_path: Path) -> Iterator[Meta]:
    made = Meta(tmp_path)
    yield made
    made.close()


def test_a_request_past_the_servers_limit_is_a_typed_error_not_a_retried_busy(meta: Meta) -> None:
    client = meta.client
    register(client, "n1")
    client.create_topic("t")
    attempts = 0
    original = client._stub.CommitOffsets

    def counted(request: pb.CommitOffsetsRequest, timeout: float) -> pb.Empty:
        nonlocal attempts
        attempts += 1
        return original(request, timeout=timeout)

    client._stub.CommitOffsets = counted  # count attempts; the call still goes to the server
    with pytest.raises(MessageTooLarge) as caught:
        client.commit_offsets("g", "t", {partition: 1 for partition in range(600_000)})
    assert attempts == 1
    assert caught.value.limit_bytes == 1024 * 1024
    assert caught.value.size_bytes > caught.value.limit_bytes
    assert "1,048,576" in caught.value.message
    assert not caught.value.retriable and isinstance(caught.value, InvalidRequest)
    assert client.fetch_offsets("g", "t") == {}  # nothing changed


def test_an_answer_past_the_clients_limit_is_a_typed_error(meta: Meta) -> None:
    register(meta.client, "n1")
    for number in range(20):
        meta.client.create_topic(f"topic-{number:02d}")
    channel = grpc.insecure_channel(meta.server.address, options=[("grpc.max_receive_message_length", 512)])
    try:
        small = MetaClient("ignored:1", channel=channel, timeout_s=5.0)
        with pytest.raises(MessageTooLarge) as caught:
            small.list_topics()
        assert caught.value.limit_bytes == 512 and caught.value.size_bytes > 512
    finally:
        channel.close()


def test_list_groups_answers_in_bounded_pages(meta: Meta) -> None:
    client = meta.client
    register(client, "n1")
    client.create_topic("a", partitions=2)
    client.create_topic("b")
    names = [f"group-{number}" for number in range(25)]
    for name in names:
        client.commit_offsets(name, "a", {0: 1, 1: 2})
        client.commit_offsets(name, "b", {0: 3})

    stub = pb_grpc.MetaServiceStub(grpc.insecure_channel(meta.server.address))
    pages, token = [], ""
    while True:
        answer = stub.ListGroups(pb.ListGroupsRequest(page_token=token, limit=10), timeout=5)
        assert len(answer.groups) <= 10
        pages.append(list(answer.groups))
        token = answer.next_page_token
        if not token:
            break
    assert [len(page) for page in pages] == [10, 10, 5]
    assert sorted(name for page in pages for name in page) == sorted(names)
    # The limit is bounded whatever is asked; the client follows the pages.
    assert len(stub.ListGroups(pb.ListGroupsRequest(limit=1 << 30), timeout=5).groups) == 25
    assert client.list_groups() == sorted(names)
    assert client.list_groups(page_size=4) == sorted(names)


def test_delete_group_removes_its_offsets_on_every_topic(meta: Meta) -> None:
    client = meta.client
    register(client, "n1")
    client.create_topic("a", partitions=2)
    client.create_topic("b")
    client.commit_offsets("gone", "a", {0: 5, 1: 6})
    client.commit_offsets("gone", "b", {0: 7})
    client.commit_offsets("kept", "a", {0: 9})

    assert client.delete_group("gone") == 3
    assert client.fetch_offsets("gone", "a") == {} and client.fetch_offsets("gone", "b") == {}
    assert list(client.group_lag("gone").partitions) == []
    assert client.list_groups() == ["kept"]
    assert client.fetch_offsets("kept", "a") == {0: 9}
    assert client.delete_group("gone") == 0  # nothing left: idempotent
    with pytest.raises(InvalidRequest):
        client.delete_group("")
    meta.restart()
    assert client.list_groups() == ["kept"]
