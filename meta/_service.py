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

Requests that do not parse never reach a handler: the server in front
(:mod:`robustmq.meta._rpc_gate`) answers them ``InvalidRequest``, and bounds what callers hold.

``DeleteTopic`` is the one handler that waits: it records the deletion, asks
the nodes it waits for to beat at once (``nudge``: a node ``status`` request
each, not waited for), then waits for the deletion to complete
(:mod:`robustmq.meta._deletions`) until shortly before the caller's deadline
(at most :data:`DELETE_WAIT_MAX_S`), and answers ``DeletionPending`` if it did
not. At most :data:`MAX_DELETES_WAITING` calls wait at once, so deletions never
hold the threads heartbeats need; past that, a call that would wait answers
``DeletionPending`` at once (the client sends it again).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from robustmq._meta_client import ERROR_METADATA_KEY
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq._wire import error_info
from robustmq.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    DeletionPending,
    InvalidRequest,
    QuotaExceeded,
    RequestTimeout,
    RetriableError,
    RobustMQError,
    ShardAlreadyExists,
    ShardNotFound,
    StaleEpoch,
    TopicAlreadyExists,
    TopicNotFound,
)
from robustmq.security import Authorizer, check_rpc
from robustmq.security._acl import ALL_OPERATIONS, RESOURCE_TYPES

from ._auth import ANONYMOUS, NODE_BOUND_RPCS, MetaAuth
from ._controller import MetaController
from ._deletions import MAX_WAITING_NODES, TopicDeletion
from ._revocations import RevocationTable
from ._users import UserTable

__all__ = [
    "DELETE_WAIT_MAX_S",
    "MAX_DELETES_WAITING",
    "MetaServicer",
    "answer_error",
    "bounded_error",
    "status_of",
]

DELETE_WAIT_MAX_S = 30.0  # the longest a DeleteTopic call waits for its deletion to complete
MAX_DELETES_WAITING = 4  # DeleteTopic calls waiting at once (each holds one of the server's threads)
MAX_AUTHORIZE_NAMES = 1_000  # resource names one Authorize call may ask about

logger = logging.getLogger("robustmq.meta")

# Most specific first: the first class in an error's MRO found here decides.
_STATUS: dict[type[RobustMQError], grpc.StatusCode] = {
    AuthenticationFailed: grpc.StatusCode.UNAUTHENTICATED,
    AuthorizationFailed: grpc.StatusCode.PERMISSION_DENIED,
    TopicNotFound: grpc.StatusCode.NOT_FOUND,
    ShardNotFound: grpc.StatusCode.NOT_FOUND,
    TopicAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    ShardAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    QuotaExceeded: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    StaleEpoch: grpc.StatusCode.FAILED_PRECONDITION,
    RequestTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    RetriableError: grpc.StatusCode.UNAVAILABLE,  # Unavailable, Busy, NotLeader, ...
}

_Handler = TypeVar("_Handler", bound=Callable[..., Any])
# The principal of the call a handler runs for (set by _answers_errors around each handler).
_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("robustmq_meta_caller", default=ANONYMOUS)
# The certificates the caller logged in with (X509 logins): tokens issued on its behalf name them.
_CERTIFICATES: contextvars.ContextVar[tuple[bytes, ...]] = contextvars.ContextVar(
    "robustmq_meta_certificates", default=()
)
_MAX_MESSAGE_CHARS = 500
_MAX_FIELD_CHARS = 200


def status_of(error: RobustMQError) -> grpc.StatusCode:
    """The gRPC status an error is answered with (``INTERNAL`` for unmapped classes)."""
    for cls in type(error).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


def bounded_error(error: RobustMQError) -> RobustMQError:
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
    """Find who calls (security on), then turn every exception a handler raises into a
    gRPC status plus trailing ErrorInfo.

    The caller's principal is resolved before the handler runs (no token, a forged,
    expired or revoked one: ``AuthenticationFailed``, nothing runs); requests that name
    a node (:data:`~._auth.NODE_BOUND_RPCS`) must come from that node; the handler
    reads the principal with :meth:`MetaServicer.caller`.
    """
    name = handler.__name__

    @functools.wraps(handler)
    def wrapper(self: MetaServicer, request: Any, context: grpc.ServicerContext) -> Any:
        reset = reset_certificates = None
        try:
            claims = self.auth.caller(name, context)
            principal = ANONYMOUS if claims is None else claims.principal
            if self.auth.enabled:
                if name in NODE_BOUND_RPCS:
                    self.auth.require_node(principal, request.node_id, name)
                check_rpc(self.authorizer(), None if principal == ANONYMOUS else principal, name, request)
            reset = _CALLER.set(principal)
            reset_certificates = _CERTIFICATES.set(() if claims is None else claims.certificates)
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
        finally:
            if reset is not None:
                _CALLER.reset(reset)
            if reset_certificates is not None:
                _CERTIFICATES.reset(reset_certificates)
        answer_error(context, error, status)

    return wrapper  # type: ignore[return-value]


def answer_error(context: Any, error: RobustMQError, status: grpc.StatusCode | None = None) -> None:
    """End the call with ``error``: its gRPC status (``status_of`` unless given) and its
    ``ErrorInfo`` in the trailing metadata. ``context.abort`` raises; this never returns."""
    error = bounded_error(error)
    context.set_trailing_metadata(((ERROR_METADATA_KEY, error_info(error).SerializeToString()),))
    context.abort(status_of(error) if status is None else status, error.message)


def _delete_wait_s(time_remaining_s: float | None) -> float:
    """How long a ``DeleteTopic`` call may wait, given the caller's time left (None: no deadline):
    its answer must reach the caller before it gives up (a quarter of the time left, 50 ms to 2 s:
    with a tenth, at most 0.5 s, a 3 s caller on a loaded machine timed out before the answer came)."""
    if time_remaining_s is None:
        return DELETE_WAIT_MAX_S
    margin_s = min(2.0, max(0.05, time_remaining_s / 4))
    return max(0.0, min(DELETE_WAIT_MAX_S, time_remaining_s - margin_s))


class MetaServicer(pb_grpc.MetaServiceServicer):
    """``MetaService`` over a :class:`MetaController`.

    ``nudge`` is called with the addresses of nodes a deletion waits for: it
    asks them to beat now (the Meta Service's node requests; none in tests).
    """

    def __init__(
        self,
        controller: MetaController,
        *,
        nudge: Callable[[list[str]], None] | None = None,
        auth: MetaAuth | None = None,
    ) -> None:
        self._controller = controller
        self._nudge = nudge
        self._deletes_waiting = threading.BoundedSemaphore(MAX_DELETES_WAITING)
        # Security off unless given: every caller is anonymous (a user table in memory only).
        self.auth = (
            auth if auth is not None else MetaAuth(None, UserTable(_NoStore()), RevocationTable(_NoStore()))
        )
        self._authorizer = Authorizer(super_users=self.auth.super_users)
        self._authorizer_version = -1
        self._authorizer_lock = threading.Lock()

    @staticmethod
    def caller() -> str:
        """The principal of the call being handled (``anonymous`` with security off)."""
        return _CALLER.get()

    @staticmethod
    def caller_certificates() -> tuple[bytes, ...]:
        """SHA-256 of the certificates the caller logged in with (X509 logins; else empty)."""
        return _CERTIFICATES.get()

    def acl_version(self) -> int:
        """Changes with every ACL, user or revocation change (nodes reload their authorizer when it
        does): a sum of counters that only grow."""
        return self._controller.acl_version + self.auth.users.version + self.auth.revocations.version

    def authorizer(self) -> Authorizer:
        """The ACLs and users as they are now (rebuilt after a change, at the next call)."""
        version = self.acl_version()
        if self._authorizer_version != version:
            with self._authorizer_lock:
                if self._authorizer_version != version:
                    acls, _ = self._controller.list_acls("", "", "")
                    users = {f"user:{user.user}": user.credential_version for user in self.auth.users.list()}
                    self._authorizer.update(acls, users, version)
                    self._authorizer_version = version
        return self._authorizer

    def _visible(self, operation: str, resource_type: str, names: list[str]) -> set[str]:
        """The ``names`` the caller may see (every one with security off)."""
        if not self.auth.enabled:
            return set(names)
        return set(self.authorizer().filter_names(self.caller(), operation, resource_type, names))

    @_answers_errors
    def CreateTopic(self, request: pb.CreateTopicRequest, context: Any) -> pb.Topic:
        return self._controller.create_topic(request.name, request.config)

    @_answers_errors
    def AlterTopic(self, request: pb.AlterTopicRequest, context: Any) -> pb.Topic:
        return self._controller.alter_topic(request.name, request.config, list(request.set))

    @_answers_errors
    def ListTopics(self, request: pb.ListTopicsRequest, context: Any) -> pb.ListTopicsResponse:
        topics, following = self._controller.list_topics_page(request.page_token, request.limit)
        visible = self._visible("describe", "topic", [topic.name for topic in topics])
        return pb.ListTopicsResponse(
            topics=[topic for topic in topics if topic.name in visible], next_page_token=following
        )

    @_answers_errors
    def DescribeTopic(self, request: pb.TopicRequest, context: Any) -> pb.TopicDescription:
        return self._controller.describe_topic(request.name, tail=request.tail)

    @_answers_errors
    def DeleteTopic(self, request: pb.DeleteTopicRequest, context: Any) -> pb.DeleteTopicResponse:
        incarnation = request.incarnation if request.HasField("incarnation") else None
        deletion = self._controller.delete_topic(request.name, incarnation)
        waiting, addresses = self._controller.deletion_waits(deletion)
        if waiting and not request.record_only:
            if self._nudge is not None and addresses:
                self._nudge(addresses)
            if self._deletes_waiting.acquire(blocking=False):
                try:
                    budget_s = _delete_wait_s(context.time_remaining())
                    waiting = self._controller.await_deletion(deletion, budget_s)
                finally:
                    self._deletes_waiting.release()
            if waiting:
                raise _pending(deletion, waiting)
        return pb.DeleteTopicResponse(
            incarnation=deletion.incarnation, complete=not waiting, waiting_for=waiting[:MAX_WAITING_NODES]
        )

    @_answers_errors
    def GetShard(self, request: pb.ShardRequest, context: Any) -> pb.ShardInfo:
        offset = request.offset if request.HasField("offset") else None
        return self._controller.get_shard(request.shard, tail=request.tail, offset=offset)

    @_answers_errors
    def RegisterNode(self, request: pb.RegisterNodeRequest, context: Any) -> pb.NodeInfo:
        if self.auth.enabled and len(request.curve_key) != 32:
            raise AuthenticationFailed(
                "this cluster is secured: a node registers its 32-byte CURVE public key",
                reason="bad_curve_key",
            )
        node = self._controller.register_node(request.node_id, request.address, curve_key=request.curve_key)
        token = self.auth.node_token(
            request.node_id, request.curve_key, renew=False, certificates=self.caller_certificates()
        )
        if token is not None:
            node.token.CopyFrom(token)
        return node

    @_answers_errors
    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        answer = self._controller.heartbeat(
            request.node_id,
            request.address,
            request.progress,
            request.shard_count,
            deleted=list(request.deleted),
            stored_bytes=request.stored_bytes,
        )
        if self.auth.enabled:
            answer.acl_version = self.acl_version()
            curve_key = self._controller.curve_key_of(request.node_id)
            token = self.auth.node_token(
                request.node_id, curve_key, renew=True, certificates=self.caller_certificates()
            )
            if token is not None:
                answer.token.CopyFrom(token)
        return answer

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
        visible = self._visible("describe", "group", list(groups))
        return pb.ListGroupsResponse(
            groups=[group for group in groups if group in visible], next_page_token=following
        )

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
            expected_version=(
                request.expected_isr_version if request.HasField("expected_isr_version") else None
            ),
            node_session=request.node_session,
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

    # -- security (docs/security.md): ACLs and producer ids ------------------------------

    @_answers_errors
    def CreateAcl(self, request: pb.AclBinding, context: Any) -> pb.Empty:
        self._controller.create_acl(request)
        return pb.Empty()

    @_answers_errors
    def DeleteAcl(self, request: pb.AclBinding, context: Any) -> pb.DeleteAclResponse:
        return pb.DeleteAclResponse(deleted=self._controller.delete_acl(request))

    @_answers_errors
    def ListAcls(self, request: pb.ListAclsRequest, context: Any) -> pb.ListAclsResponse:
        # Versions first: a change while this answer is built shows as a newer version later,
        # so a node that loads this answer loads again (never keeps a view newer than it is).
        version, credentials = self.acl_version(), self.auth.users.version
        acls, _ = self._controller.list_acls(request.principal, request.resource_type, request.resource_name)
        return pb.ListAclsResponse(
            acls=[acl.to_pb() for acl in acls],
            acl_version=version,
            users=self.auth.users.list(),
            super_users=sorted(self.auth.super_users),
            last_credential_version=credentials,
            revoked_certificates=self.auth.revocations.fingerprints(),
        )

    @_answers_errors
    def Authorize(self, request: pb.AuthorizeRequest, context: Any) -> pb.AuthorizeResponse:
        # The caller's own permissions only (what any principal could learn by trying).
        operation, resource_type = request.operation.lower(), request.resource_type.lower()
        if operation not in ALL_OPERATIONS or resource_type not in RESOURCE_TYPES:
            raise InvalidRequest(
                f"Authorize needs an operation ({', '.join(ALL_OPERATIONS)}) and a resource type "
                f"({', '.join(RESOURCE_TYPES)}), got {operation[:20]!r} on {resource_type[:20]!r}"
            )
        if len(request.resource_names) > MAX_AUTHORIZE_NAMES:
            raise InvalidRequest(f"Authorize takes at most {MAX_AUTHORIZE_NAMES} names at once")
        version = self.acl_version()
        if not self.auth.enabled:
            return pb.AuthorizeResponse(allowed=[True] * len(request.resource_names), acl_version=version)
        authorizer, caller = self.authorizer(), self.caller()
        allowed = [
            authorizer.authorize(caller, operation, resource_type, name) for name in request.resource_names
        ]
        return pb.AuthorizeResponse(allowed=allowed, acl_version=version)

    # -- per-principal quotas of the storage nodes (docs/operators.md, "Quotas") -----------

    @_answers_errors
    def SetQuota(self, request: pb.QuotaEntry, context: Any) -> pb.Empty:
        quota = self._controller.set_client_quota(request)
        logger.info("quota %s set by %s", quota, self.caller())
        return pb.Empty()

    @_answers_errors
    def DeleteQuota(self, request: pb.DeleteQuotaRequest, context: Any) -> pb.DeleteQuotaResponse:
        deleted = self._controller.delete_client_quota(request.principal)
        if deleted:
            logger.info("quota of %s removed by %s", request.principal.strip(), self.caller())
        return pb.DeleteQuotaResponse(deleted=deleted)

    @_answers_errors
    def ListQuotas(self, request: pb.Empty, context: Any) -> pb.ListQuotasResponse:
        version = self.acl_version()  # first: a change meanwhile shows as a newer version later
        quotas = self._controller.list_client_quotas()
        return pb.ListQuotasResponse(quotas=[quota.to_pb() for quota in quotas], acl_version=version)

    @_answers_errors
    def InitProducerId(self, request: pb.InitProducerIdRequest, context: Any) -> pb.InitProducerIdResponse:
        # With security on, the answer carries a token bound to the caller's principal, its CURVE
        # key and this id: a node takes a produce with this id only under that token.
        # A transactional id maps (caller, transactional id) to the same producer id every time.
        # With security on, who got the id is stored with it: another session of that principal
        # (a restarted Kafka gateway) may take it up later (IssueToken).
        producer_id = self._controller.init_producer_id(
            self.caller(), request.transactional_id, record_owner=self.auth.enabled
        )
        answer = pb.InitProducerIdResponse(producer_id=producer_id)
        if self.auth.enabled:
            answer.token.CopyFrom(
                self.auth.issue(
                    self.caller(),
                    request.curve_key,
                    producer_id=producer_id,
                    certificates=self.caller_certificates(),
                )
            )
        return answer

    # -- security (docs/security.md) -------------------------------------------------------

    @_answers_errors
    def ScramStart(self, request: pb.ScramStartRequest, context: Any) -> pb.ScramStartResponse:
        return self.auth.scram_start(request)

    @_answers_errors
    def ScramFinish(self, request: pb.ScramFinishRequest, context: Any) -> pb.ScramFinishResponse:
        return self.auth.scram_finish(request)

    @_answers_errors
    def GetSecurityInfo(self, request: pb.Empty, context: Any) -> pb.SecurityInfo:
        return self.auth.security_info(self.acl_version())

    @_answers_errors
    def IssueToken(self, request: pb.IssueTokenRequest, context: Any) -> pb.SessionToken:
        if not self.auth.enabled:
            return pb.SessionToken()
        producer_id = request.producer_id if request.HasField("producer_id") else None
        claims = self.auth.claims(context)
        owner = None
        if producer_id is not None and producer_id != claims.producer_id:
            owner = self._controller.producer_id_owner(producer_id)
        return self.auth.reissue(
            claims, request.curve_key, producer_id, proof=request.producer_token, owner=owner
        )

    @_answers_errors
    def CreateUser(self, request: pb.CreateUserRequest, context: Any) -> pb.Empty:
        info = self.auth.users.create(request)
        logger.info("user %s %s by %s", info.user, "changed" if request.replace else "created", self.caller())
        return pb.Empty()

    @_answers_errors
    def DeleteUser(self, request: pb.DeleteUserRequest, context: Any) -> pb.Empty:
        self.auth.users.delete(request.user)
        logger.info("user %s removed by %s", request.user[:80], self.caller())
        return pb.Empty()

    @_answers_errors
    def ListUsers(self, request: pb.Empty, context: Any) -> pb.ListUsersResponse:
        return pb.ListUsersResponse(users=self.auth.users.list())

    @_answers_errors
    def RevokeCertificate(
        self, request: pb.RevokeCertificateRequest, context: Any
    ) -> pb.RevokeCertificateResponse:
        if not self.auth.enabled:
            raise InvalidRequest("this Meta Service is not secured: there are no certificates to revoke")
        revocation, already = self.auth.revocations.revoke(request, self.caller())
        if not already:
            logger.warning(
                "certificate of %s (SHA-256 %s, serial %s) revoked by %s%s",
                revocation.principal or "?",
                revocation.sha256.hex(),
                revocation.serial or "?",
                self.caller(),
                f": {revocation.reason}" if revocation.reason else "",
            )
        return pb.RevokeCertificateResponse(revocation=revocation, already=already)

    @_answers_errors
    def ListRevocations(self, request: pb.Empty, context: Any) -> pb.RevocationList:
        return pb.RevocationList(revocations=self.auth.revocations.list())


class _NoStore:
    """The store of a user table that is never written (security off, no table given)."""

    def get(self, key: bytes) -> bytes | None:
        return None

    def scan(self, prefix: bytes, *, start: bytes = b"") -> Any:
        return iter(())

    def scan_reverse(self, prefix: bytes) -> Any:
        return iter(())

    def write(self, puts: dict[bytes, bytes], deletes: Any = ()) -> None:
        raise InvalidRequest("this Meta Service keeps no users")

    def submit(self, puts: dict[bytes, bytes], deletes: Any = ()) -> Any:
        self.write(puts, deletes)

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


def _pending(deletion: TopicDeletion, waiting: list[str]) -> DeletionPending:
    shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
    return DeletionPending(
        f"topic {deletion.topic!r} (incarnation {deletion.incarnation}) is deleted and its deletion "
        f"is recorded, but node(s) {shown} have not yet confirmed dropping it and may still take its "
        f"writes; it completes in the background once they do (or stop being alive); sending the "
        f"delete again waits for it",
        topic=deletion.topic,
        incarnation=deletion.incarnation,
        waiting_for=waiting[:10],
        waiting_count=len(waiting),
    )
