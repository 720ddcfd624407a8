"""The gRPC face of the Meta Service: ``MetaService`` of ``robustmq.proto``.

Each handler unpacks its request, calls :class:`~robustmq.meta._controller.MetaController`
and packs the answer; it holds no logic. Errors cross the boundary in exactly
one place, :func:`_answers_errors`:

- a :class:`~robustmq.errors.RobustMQError` ends the call with a gRPC status
  chosen by its class (see :func:`status_of`) and its ``ErrorInfo`` (code,
  message, JSON fields) serialized in the trailing metadata under
  ``robustmq-error-bin``, so the client raises the same class with the same fields;
- anything else is a bug: it is logged with its traceback and answered
  ``INTERNAL`` (with a generic ``ErrorInfo``); the server keeps serving.

Requests that do not parse never reach a handler: gRPC answers them itself.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from robustmq._meta_client import ERROR_METADATA_KEY
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq._wire import error_info
from robustmq.errors import (
    InvalidRequest,
    RequestTimeout,
    RetriableError,
    RobustMQError,
    ShardAlreadyExists,
    ShardNotFound,
    StaleEpoch,
    TopicAlreadyExists,
    TopicNotFound,
)

from ._controller import MetaController

__all__ = ["MetaServicer", "status_of"]

logger = logging.getLogger("robustmq.meta")

# Most specific first: the first class in an error's MRO found here decides.
_STATUS: dict[type[RobustMQError], grpc.StatusCode] = {
    TopicNotFound: grpc.StatusCode.NOT_FOUND,
    ShardNotFound: grpc.StatusCode.NOT_FOUND,
    TopicAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    ShardAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    StaleEpoch: grpc.StatusCode.FAILED_PRECONDITION,
    RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    RetriableError: grpc.StatusCode.UNAVAILABLE,  # Unavailable, Busy, NotLeader, ...
}

_Handler = TypeVar("_Handler", bound=Callable[..., Any])
_MAX_MESSAGE_CHARS = 500
_MAX_FIELD_CHARS = 200


def status_of(error: RobustMQError) -> grpc.StatusCode:
    """The gRPC status an error is answered with (``INTERNAL`` for unmapped classes)."""
    for cls in type(error).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


def _bounded(error: RobustMQError) -> RobustMQError:
    """``error`` with long text cut, so status and trailer fit gRPC's 8 KiB metadata limit.

    Errors quote what the client sent (a 5,000-character topic name, say); past
    the limit gRPC would drop the answer and the client would see a transport error.
    """
    if len(error.message) <= _MAX_MESSAGE_CHARS and all(
        len(str(value)) <= _MAX_FIELD_CHARS for value in error.fields.values()
    ):
        return error
    fields = {
        name: value if len(str(value)) <= _MAX_FIELD_CHARS else str(value)[:_MAX_FIELD_CHARS]
        for name, value in error.fields.items()
    }
    return type(error)(error.message[:_MAX_MESSAGE_CHARS], **fields)


def _answers_errors(handler: _Handler) -> _Handler:
    """Turn every exception a handler raises into a gRPC status plus trailing ErrorInfo."""

    @functools.wraps(handler)
    def wrapper(self: MetaServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except RobustMQError as exc:
            error = exc
            status = status_of(exc)
        except Exception as exc:
            logger.exception("%s failed unexpectedly", handler.__name__)
            error = RobustMQError(
                f"internal error in {handler.__name__}: {type(exc).__name__}",
                rpc=handler.__name__,
            )
            status = grpc.StatusCode.INTERNAL
        error = _bounded(error)
        context.set_trailing_metadata(((ERROR_METADATA_KEY, error_info(error).SerializeToString()),))
        context.abort(status, error.message)

    return wrapper  # type: ignore[return-value]


class MetaServicer(pb_grpc.MetaServiceServicer):
    """``MetaService`` over a :class:`MetaController`."""

    def __init__(self, controller: MetaController) -> None:
        self._controller = controller

    @_answers_errors
    def CreateTopic(self, request: pb.CreateTopicRequest, context: Any) -> pb.Topic:
        return self._controller.create_topic(request.name, request.config)

    @_answers_errors
    def ListTopics(self, request: pb.Empty, context: Any) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(topics=self._controller.list_topics())

    @_answers_errors
    def DescribeTopic(self, request: pb.TopicRequest, context: Any) -> pb.TopicDescription:
        return self._controller.describe_topic(request.name)

    @_answers_errors
    def DeleteTopic(self, request: pb.TopicRequest, context: Any) -> pb.Empty:
        self._controller.delete_topic(request.name)
        return pb.Empty()

    @_answers_errors
    def GetShard(self, request: pb.ShardRequest, context: Any) -> pb.ShardInfo:
        return self._controller.get_shard(request.shard)

    @_answers_errors
    def RegisterNode(self, request: pb.RegisterNodeRequest, context: Any) -> pb.NodeInfo:
        return self._controller.register_node(request.node_id, request.address)

    @_answers_errors
    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        return self._controller.heartbeat(
            request.node_id,
            request.address,
            list(request.progress),
            request.shard_count,
            deleted=list(request.deleted),
            stored_bytes=request.stored_bytes,
        )

    @_answers_errors
    def ListNodes(self, request: pb.Empty, context: Any) -> pb.ListNodesResponse:
        return pb.ListNodesResponse(nodes=self._controller.list_nodes())

    @_answers_errors
    def SealSegment(self, request: pb.SealSegmentRequest, context: Any) -> pb.SealSegmentResponse:
        incarnation = request.incarnation if request.HasField("incarnation") else None
        sealed, following = self._controller.seal_segment(
            request.shard,
            request.epoch,
            request.end_offset,
            request.node_id,
            incarnation,
            isr=list(request.isr),
            crc32c=request.crc32c if request.HasField("crc32c") else None,
            size_bytes=request.size_bytes,
        )
        return pb.SealSegmentResponse(sealed=sealed, next=following)

    @_answers_errors
    def CommitOffsets(self, request: pb.CommitOffsetsRequest, context: Any) -> pb.Empty:
        self._controller.commit_offsets(request.group, request.topic, dict(request.offsets))
        return pb.Empty()

    @_answers_errors
    def FetchOffsets(self, request: pb.GroupTopicRequest, context: Any) -> pb.FetchOffsetsResponse:
        return pb.FetchOffsetsResponse(offsets=self._controller.fetch_offsets(request.group, request.topic))

    @_answers_errors
    def GroupLag(self, request: pb.GroupTopicRequest, context: Any) -> pb.GroupLagResponse:
        return pb.GroupLagResponse(
            group=request.group,
            partitions=self._controller.group_lag(request.group, request.topic),
        )

    @_answers_errors
    def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsResponse:
        groups, following = self._controller.list_groups(request.page_token, request.limit)
        return pb.ListGroupsResponse(groups=groups, next_page_token=following)

    @_answers_errors
    def DeleteGroup(self, request: pb.DeleteGroupRequest, context: Any) -> pb.DeleteGroupResponse:
        return pb.DeleteGroupResponse(offsets_removed=self._controller.delete_group(request.group))

    @_answers_errors
    def RemoveNode(self, request: pb.RemoveNodeRequest, context: Any) -> pb.RemoveNodeResponse:
        node, led = self._controller.remove_node(request.node_id, request.force)
        return pb.RemoveNodeResponse(node=node, led_shards=led)

    @_answers_errors
    def UpdateIsr(self, request: pb.UpdateIsrRequest, context: Any) -> pb.Segment:
        return self._controller.update_isr(
            request.shard,
            request.incarnation,
            request.epoch,
            request.node_id,
            list(request.isr),
            expected=list(request.expected_isr),
        )

    @_answers_errors
    def ReportReplica(self, request: pb.ReportReplicaRequest, context: Any) -> pb.Segment:
        return self._controller.report_replica(
            request.shard,
            request.incarnation,
            request.epoch,
            request.node_id,
            request.crc32c,
            request.size_bytes,
        )

    @_answers_errors
    def ListAssignments(self, request: pb.NodeIdRequest, context: Any) -> pb.AssignmentsResponse:
        return self._controller.list_assignments(request.node_id)

    @_answers_errors
    def DrainNode(self, request: pb.DrainNodeRequest, context: Any) -> pb.NodeInfo:
        return self._controller.drain_node(request.node_id, request.undrain)

    @_answers_errors
    def GetClusterConfig(self, request: pb.Empty, context: Any) -> pb.ClusterConfig:
        return self._controller.cluster_config()

    @_answers_errors
    def ListSealed(self, request: pb.ListSealedRequest, context: Any) -> pb.ListSealedResponse:
        return self._controller.list_sealed(request.after_seq, request.limit, request.untiered_only)

    @_answers_errors
    def MarkTiered(self, request: pb.MarkTieredRequest, context: Any) -> pb.Segment:
        return self._controller.mark_tiered(
            request.shard,
            request.incarnation,
            request.epoch,
            request.object_url,
            request.object_bytes,
            request.max_timestamp_ms,
        )
