"""The client side of the Meta Service's gRPC boundary.

:class:`MetaClient` has one method per RPC of ``MetaService`` with Python
arguments; it returns the protobuf messages (dicts for offsets, lists for
listings). Every call has a deadline: the client's ``timeout_s`` is the whole
budget of a call, retries included.

Errors: every ``grpc.RpcError`` is translated in one function,
:func:`translate_rpc_error`. The server sends a typed error as an ``ErrorInfo``
in the trailing metadata key ``robustmq-error-bin``; it becomes the same
:mod:`robustmq.errors` class with the same fields. Without one, ``UNAVAILABLE``
is :class:`~robustmq.errors.Unavailable`, ``DEADLINE_EXCEEDED``
:class:`~robustmq.errors.RequestTimeout`, ``RESOURCE_EXHAUSTED`` for a message
past gRPC's size limit (on either side) :class:`~robustmq.errors.MessageTooLarge`
(not retriable: the same message is as large the next time), any other
``RESOURCE_EXHAUSTED`` (the server's bound on RPCs in flight)
:class:`~robustmq.errors.Busy`, and anything else a
:class:`~robustmq.errors.RobustMQError` with the status in its fields.

Several addresses (``"h1:7070,h2:7070"`` or a list; :mod:`robustmq._meta_addresses`)
are the instances of one highly available Meta Service. Calls go to the current
one; a ``NotLeader`` answer (a follower's: it ran nothing) moves to the leader it
names, or the next address when it names none, and the call is sent again
whatever its retry rule (so is one answered ``Unavailable`` with reason
``taking_over``: a just-elected leader loading its state, which ran nothing); a
failed transport (refused, reset, no answer in time) moves later calls to the next
address, and the call itself follows its retry rule there. Moving to an address not
tried since the last pause is immediate; the back-off comes once every address was
tried, and while an election is on (an instance answered ``NotLeader`` or
``taking_over``) it is at most :data:`_ELECTION_PAUSE_S` (0.1 s), so a new leader is
found within that. A call sent at most once
(``remove_node``...) is sent only on a connected channel when there are several
addresses, so an instance that is down costs at most a second
(:data:`_CONNECT_S`) and never a doubt about whether the call ran. One session
token serves every instance (each holds the Meta Service identity, whose key
signs the tokens).

Retries (with exponential back-off, within the call's deadline):

- reads and heartbeats retry on ``Unavailable`` and ``Busy``;
- writes the server makes idempotent (``register_node``, ``seal_segment``,
  ``commit_offsets``, ``update_isr``, ``report_replica``, ``drain_node``,
  ``mark_tiered``)
  retry only when the failure came from the transport, not from the service
  (a service ``Unavailable``, e.g. too few live nodes, is an answer, not a
  lost request);
- ``create_topic`` retries like those, and a ``TopicAlreadyExists`` after a
  retry counts as success only if the existing topic has the requested config;
- ``remove_node`` is sent once (only a ``Busy`` from the server's admission
  bound, which means the request was never run, is retried);
- ``delete_topic`` looks the topic's incarnation up and names it, which makes it
  idempotent (the service deletes only that incarnation, and waits for its
  deletion), so it retries like the writes above; a ``DeletionPending`` answer
  (the deletion is recorded, a node has not confirmed it yet) is asked again
  the same way. A name with no topic is sent once.

Listings that can grow without bound (``list_topics``, ``list_groups``) are read
in pages of a bounded size; the client follows the pages (a server whose page
token does not move on is an error, not an endless loop).

Security (docs/security.md): with ``credentials``, the channel is TLS (the
Meta Service must present a certificate the cluster CA signed) and every call
carries a session token (:class:`~robustmq.security._client_auth.MetaSession`:
login at the first call, renewal at half-life). A call refused because the
token expired or was revoked logs in again once. A plaintext client that
reaches a TLS port is told so (``AuthenticationFailed``, ``reason``
``tls_required``) instead of retrying a handshake that cannot succeed.

Thread-safe: the gRPC channels and stubs (one per address, opened at first use)
may be shared by threads; the current address changes under a lock.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import grpc

from robustmq._meta_addresses import MetaAddresses, parse_meta_addresses, require_meta_address
from robustmq._proto import robustmq_pb2 as pb
from robustmq._proto import robustmq_pb2_grpc as pb_grpc
from robustmq._topics import shard_name
from robustmq._wire import DEFAULT_TOPIC_CONFIG, error_from_info, has_presence, topic_config
from robustmq.errors import (
    AuthenticationFailed,
    Busy,
    DeletionPending,
    InvalidConfig,
    MessageTooLarge,
    NotLeader,
    RequestTimeout,
    RobustMQError,
    ShardNotFound,
    TopicAlreadyExists,
    TopicNotFound,
    Unavailable,
)
from robustmq.security._client_auth import Credentials, MetaSession

__all__ = [
    "ERROR_METADATA_KEY",
    "PLACEMENT_WAIT_S",
    "MetaClient",
    "parse_meta_addresses",
    "require_meta_address",
    "translate_rpc_error",
]

ERROR_METADATA_KEY = "robustmq-error-bin"
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 1.0
# The longest pause while an election is on (an instance answered NotLeader or "taking over"):
# followers answer at once, without etcd, and the new leader serves a moment after it is
# elected, so asking again this often finds it this soon, at the price of cheap refusals.
_ELECTION_PAUSE_S = 0.1
PLACEMENT_WAIT_S = 10.0  # how long create_topic asks again while the service cannot place it yet
_PLACEMENT_RETRY_S = 0.25
_ATTEMPT_MIN_S = 0.05  # an attempt with less time left than this is not started
_CONNECT_S = 1.0  # how long a call sent at most once waits for a connection before another address
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CHANNEL_OPTIONS = [
    # Reconnect quickly after a Meta Service restart instead of gRPC's default
    # back-off of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
]

# gRPC's words for a message past its size limit; "SERVER:"/"CLIENT:" says whose.
_TOO_LARGE = re.compile(r"(?:(SERVER|CLIENT): )?(Received|Sent) message larger than max \((\d+) vs\. (\d+)\)")

_Retry = Literal["read", "idempotent", "once"]


def _error_info_of(exc: grpc.RpcError) -> pb.ErrorInfo | None:
    trailing = getattr(exc, "trailing_metadata", None)
    metadata = trailing() if callable(trailing) else None
    for key, value in metadata or ():
        if key == ERROR_METADATA_KEY:
            try:
                return pb.ErrorInfo.FromString(value)
            except Exception:  # a garbled trailer: fall back to the status
                return None
    return None


def translate_rpc_error(exc: grpc.RpcError, address: str) -> RobustMQError:
    """The :mod:`robustmq.errors` form of a failed call; the one place gRPC errors are read."""
    info = _error_info_of(exc)
    if info is not None:
        return error_from_info(info)
    code_of = getattr(exc, "code", None)
    details_of = getattr(exc, "details", None)
    status = code_of() if callable(code_of) else grpc.StatusCode.UNKNOWN
    details = (details_of() if callable(details_of) else None) or str(exc)
    status_name = getattr(status, "name", str(status))
    if status == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(
            f"meta service at {address} is unavailable: {details}",
            address=address,
            status=status_name,
        )
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeout(
            f"meta service at {address} did not answer in time", address=address, status=status_name
        )
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        too_large = _TOO_LARGE.search(details)
        if too_large is not None:
            return _message_too_large(too_large, address)
        return Busy(f"meta service at {address} is busy: {details}", address=address, status=status_name)
    return RobustMQError(
        f"meta service call failed with {status_name}: {details}",
        address=address,
        status=status_name,
    )


def _message_too_large(match: re.Match[str], address: str) -> MessageTooLarge:
    side, verb, size, limit = match.groups()
    if verb == "Sent":
        what = "the request is larger than this client may send"
    elif side == "CLIENT":
        what = "the answer is larger than this client accepts"
    else:
        what = "the request is larger than the meta service accepts"
    return MessageTooLarge(
        f"{what} ({int(size):,} bytes, limit {int(limit):,} bytes; meta service at {address}): "
        f"ask for less at a time",
        size_bytes=int(size),
        limit_bytes=int(limit),
        address=address,
    )


def _check_setting(name: str, value: Any) -> None:
    """Refuse a topic setting of the wrong type, or an explicit 0.

    proto3 sends 0 as "unset" (the default), so an explicit 0 must be refused
    here (except for the ``optional`` fields, ``local_retention_*``, where 0 is
    a value). ``partitions`` and ``replication_factor`` get the service's own
    wording for any value below 1, so every spelling of the mistake reads the
    same. Unknown names are left to :func:`robustmq._wire.topic_config`.
    """
    default = DEFAULT_TOPIC_CONFIG.get(name)
    if default is None or value is None:
        return
    if isinstance(default, str) != isinstance(value, str) or isinstance(value, bool | float):
        kind = "a string" if isinstance(default, str) else "an integer"
        raise InvalidConfig(f"{name} must be {kind}, got {value!r}", field=name, value=repr(value)[:80])
    if name in ("partitions", "replication_factor") and value < 1:
        raise InvalidConfig(f"{name} must be at least 1, got {value}", field=name, value=value)
    if value == 0 and not has_presence(name):
        raise InvalidConfig(f"{name} cannot be 0 (leave it out for the default)", field=name, value=value)


_Item = TypeVar("_Item")
_MAX_PAGES = 100_000  # a listing of more pages than this is a server that does not end it


def _follow_pages(page_of: Callable[[str, int], tuple[list[_Item], str]], page_size: int) -> list[_Item]:
    """Every item of a paged listing: ``page_of(token, limit)`` until its token is "".

    A token that repeats (a server that does not move on) is an ``Unavailable``
    naming it, so a listing always ends.
    """
    items, token = page_of("", page_size)
    for _ in range(_MAX_PAGES):
        if not token:
            return items
        page, following = page_of(token, page_size)
        if following and following == token:
            break
        items.extend(page)
        token = following
    raise Unavailable(
        f"the Meta Service's listing does not end (page token {token[:80]!r} repeats): it is "
        f"misbehaving; try again or another Meta Service",
        page_token=token[:80],
    )


def _resolved(config: pb.TopicConfig) -> pb.TopicConfig:
    """``config`` as the service stores it: ``min_insync_replicas`` 0 is a majority of the replicas."""
    resolved = pb.TopicConfig()
    resolved.CopyFrom(config)
    if not resolved.min_insync_replicas:
        resolved.min_insync_replicas = resolved.replication_factor // 2 + 1
    return resolved


def _should_retry(error: RobustMQError, from_service: bool, retry: _Retry) -> bool:
    if retry == "read":
        return isinstance(error, Unavailable | Busy)
    if from_service:
        return False
    if retry == "idempotent":
        return isinstance(error, Unavailable | Busy)
    return isinstance(error, Busy)


class MetaClient:
    """A client of the Meta Service.

    Parameters
    ----------
    address
        ``host:port`` of the Meta Service, or several (``"h1:7070,h2:7070"`` or a list):
        the instances of a highly available one; calls follow its leader.
    timeout_s
        The deadline of each call, retries included.
    channel
        A gRPC channel to use instead of opening one (the test seam); the
        caller keeps ownership of it.
    credentials
        How to prove who this client is to a secured cluster (TLS to the cluster
        CA, a password or a client certificate); None: plaintext, no identity.
    curve_key
        The CURVE public key (32 bytes) session tokens are bound to (default: the
        process's, :func:`~robustmq.security._client_auth.process_curve_keypair`).
    session
        A session to use instead of logging in with ``credentials`` (which then only name the
        CA): a :class:`~robustmq.security._client_auth.TokenSession` of a token obtained for
        someone else (the Kafka gateway's clients of the principals that authenticated).

    Examples
    --------
    >>> with MetaClient("127.0.0.1:7070") as meta:          # doctest: +SKIP
    ...     meta.create_topic("orders", partitions=4)
    ...     meta.get_shard("orders_0").leader_address
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        channel: grpc.Channel | None = None,
        credentials: Credentials | None = None,
        curve_key: Callable[[], bytes] | None = None,
        session: MetaSession | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise InvalidConfig(f"timeout_s must be positive, got {timeout_s!r}", timeout_s=timeout_s)
        if channel is None:
            self.addresses = MetaAddresses(parse_meta_addresses(address))
        else:  # the test seam: one channel, whatever it is called
            self.addresses = MetaAddresses([address if isinstance(address, str) else ",".join(address)])
        self.timeout_s = timeout_s
        tls = credentials.tls() if credentials is not None else None
        self.session: MetaSession | None = None
        if tls is not None and credentials is not None and (credentials.user or tls.cert):
            self.session = (
                MetaSession(credentials, tls)
                if curve_key is None
                else MetaSession(credentials, tls, curve_key=curve_key)
            )
        if session is not None:  # a token obtained elsewhere (TokenSession); credentials give the CA
            self.session = session
        # One token serves every instance: they all hold the Meta Service identity, whose key signs it.
        self._tls_ca = None if tls is None else tls.ca
        self._tls = tls is not None
        self._tls_checked: set[str] = set()
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pb_grpc.MetaServiceStub] = {}
        self._given_channel = channel
        self._stub_at(self.addresses.current)  # the first channel opens now, as a single address's did

    @property
    def address(self) -> str:
        """The address calls go to now (the leader, as far as this client knows)."""
        return self.addresses.current

    @property
    def _stub(self) -> pb_grpc.MetaServiceStub:
        return self._stub_at(self.addresses.current)

    def _stub_at(self, address: str) -> pb_grpc.MetaServiceStub:
        """The stub of ``address``'s channel, opened at its first use (at most one per known address)."""
        stub = self._stubs.get(address)
        if stub is not None:
            return stub
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                if self._given_channel is not None:
                    channel = self._given_channel
                elif self._tls_ca is None and not self._tls:
                    channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                else:
                    channel = grpc.secure_channel(
                        address,
                        grpc.ssl_channel_credentials(root_certificates=self._tls_ca),
                        options=_CHANNEL_OPTIONS,
                    )
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.MetaServiceStub(channel)
            return stub

    def _where(self) -> str:
        known = self.addresses.known()
        return known[0] if len(known) == 1 else f"any of {', '.join(known)}"

    # -- plumbing ----------------------------------------------------------

    def _call(
        self,
        rpc: str | Callable[..., Any],
        request: Any,
        retry: _Retry,
        *,
        deadline: float | None = None,
        on_send: Callable[[], None] | None = None,
    ) -> Any:
        """One call, retried as ``retry`` says, until ``deadline`` (monotonic; default: in ``timeout_s``).

        ``rpc`` is the RPC's name (sent to whichever address is current at each attempt) or
        a callable (a test's: always the same). A ``NotLeader`` answer moves to the leader and
        is asked again whatever ``retry`` says (a follower runs nothing); a failed transport
        moves to the next address. A move to an address not tried since the last pause is
        made at once; a pause (back-off) comes once every address was tried.
        ``on_send`` runs before each attempt that sends the request.
        """
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        backoff_s = _BACKOFF_FIRST_S
        logged_in_again = False
        electing = False  # an instance answered NotLeader or taking_over: pauses stay short
        tried: set[str] = set()
        last: RobustMQError | None = None  # the last failed attempt's error
        while True:
            address = self.addresses.current
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                if last is not None:  # a pause overran the time left: what the service last said
                    raise self._final(last)
                raise RequestTimeout(
                    f"meta service at {self._where()} did not answer within {self.timeout_s}s",
                    address=address,
                )
            tried.add(address)
            stub = self._stub_at(address)
            call = getattr(stub, rpc) if isinstance(rpc, str) else rpc
            try:
                if retry == "once" and not self._connected(address, remaining_s):
                    # Never sent: another address may take it (a "once" call is not sent twice).
                    self.addresses.unreachable(address, time.monotonic())
                    error: RobustMQError = Unavailable(
                        f"meta service at {address} is unreachable (no connection within {_CONNECT_S}s)",
                        address=address,
                    )
                    last = error
                    if self._pause_or_raise(error, tried, deadline, backoff_s, None, electing):
                        backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                        tried.clear()
                    continue
                if on_send is not None:
                    on_send()
                if self.session is None:
                    answer = call(request, timeout=remaining_s)
                else:
                    metadata = self.session.metadata(stub, remaining_s)
                    answer = call(request, timeout=deadline - time.monotonic(), metadata=metadata)
                self.addresses.answered(address)
                return answer
            except grpc.RpcError as exc:
                error = translate_rpc_error(exc, address)
                from_service = _error_info_of(exc) is not None
                if isinstance(error, Unavailable) and not from_service:
                    self._check_plaintext_at_tls_port(exc, address)
                if (
                    self.session is not None
                    and isinstance(error, AuthenticationFailed)
                    and error.fields.get("reason") in ("token_expired", "revoked")
                    and not logged_in_again
                ):
                    self.session.forget()  # log in again once: a renewed password, a token past its life
                    logged_in_again = True
                    continue
                not_leader = from_service and isinstance(error, NotLeader)
                # A leader still loading its state ran nothing either: asked again like NotLeader.
                loading = from_service and error.fields.get("reason") == "taking_over"
                electing = electing or not_leader or loading
                if not_leader:
                    leader = error.fields.get("leader", "")
                    self.addresses.not_leader(
                        address, leader if isinstance(leader, str) else "", time.monotonic()
                    )
                elif not from_service and isinstance(error, Unavailable | RequestTimeout):
                    # Refused, reset, or no answer at all (a paused process): the next call
                    # goes to the next address (a live follower sends it on to the leader).
                    self.addresses.unreachable(address, time.monotonic())
                if not (not_leader or loading or _should_retry(error, from_service, retry)):
                    raise self._final(error) from exc
                last = error
                if self._pause_or_raise(error, tried, deadline, backoff_s, exc, electing):
                    backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
                    tried.clear()

    def _pause_or_raise(
        self,
        error: RobustMQError,
        tried: set[str],
        deadline: float,
        backoff_s: float,
        exc: BaseException | None,
        electing: bool,
    ) -> bool:
        """Before the next attempt: at once if the next address was not tried since the last pause,
        else sleep ``backoff_s`` (at most :data:`_ELECTION_PAUSE_S` once this call met an election:
        the old leader's address failing meanwhile does not lengthen it; True: paused). Raises
        ``error`` if the deadline leaves no attempt."""
        pause_s = 0.0 if self.addresses.current not in tried else backoff_s
        if electing:
            pause_s = min(pause_s, _ELECTION_PAUSE_S)
        if time.monotonic() + max(pause_s, _ATTEMPT_MIN_S) >= deadline:
            raise self._final(error) from exc
        if pause_s:
            time.sleep(pause_s)
        return pause_s > 0

    def _final(self, error: RobustMQError) -> RobustMQError:
        """``error`` as raised when no attempt is left: a transport failure names every address tried."""
        known = self.addresses.known()
        if len(known) == 1 or type(error) is not Unavailable or "address" not in error.fields:
            return error
        return Unavailable(
            f"no Meta Service answered at {', '.join(known)} (the last, {error.fields['address']}: "
            f"{error.message})",
            **error.fields,
            addresses=",".join(known),
        )

    def _connected(self, address: str, remaining_s: float) -> bool:
        """Whether ``address``'s channel connects (a call sent at most once is sent only then).

        With one address nothing is checked (there is nowhere else to send it). Otherwise a
        channel that does not become ready within :data:`_CONNECT_S` (or the time left) has
        sent nothing, so the call may go to another address.
        """
        if len(self.addresses) == 1 or self._given_channel is not None:
            return True
        self._stub_at(address)
        channel = self._channels[address]
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.0, min(_CONNECT_S, remaining_s)))
        except grpc.FutureTimeoutError:
            return False
        return True

    def _check_plaintext_at_tls_port(self, exc: grpc.RpcError, address: str) -> None:
        """Raise ``AuthenticationFailed`` if this plaintext client reached a TLS port (checked once
        per address).

        gRPC reports only "unavailable" then; a TLS handshake that succeeds at the same
        address says why (nothing is sent past the handshake; no certificate is checked:
        this only tells the user what to configure).
        """
        if self._tls or address in self._tls_checked:
            return
        self._tls_checked.add(address)
        host, _, port = address.removeprefix("dns:///").rpartition(":")
        if not port.isdigit() or host.startswith("unix"):
            return
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with (
                socket.create_connection((host.strip("[]"), int(port)), timeout=1.0) as probe,
                context.wrap_socket(probe, server_hostname=None),
            ):
                speaks_tls = True
        except (OSError, ssl.SSLError):
            speaks_tls = False
        if speaks_tls:
            raise AuthenticationFailed(
                f"the Meta Service at {address} speaks TLS (the cluster is secured): give the "
                f"cluster CA and your credentials (--tls-ca and --user or --tls-cert; ROBUSTMQ_TLS_CA)",
                reason="tls_required",
                address=address,
            ) from exc

    def session_token(self) -> bytes:
        """This client's session token (serialized), logging in or renewing it first when due; b""
        with security off. What requests to storage nodes carry (cheap: a call only when due)."""
        if self.session is None:
            return b""
        token = self.session.current()
        if not token:
            self._call("ListNodes", pb.Empty(), "read")  # any call logs in or renews first
            token = self.session.token()
        return token

    def get_security_info(self) -> pb.SecurityInfo:
        """Whether the cluster is secured, and the public key that verifies its session tokens."""
        return self._call("GetSecurityInfo", pb.Empty(), "read")

    def issue_token(
        self, curve_key: bytes, producer_id: int | None = None, producer_token: bytes = b""
    ) -> pb.SessionToken:
        """A fresh session token for this client's principal, bound to ``curve_key``; with
        ``producer_id``, one that may produce with it (``producer_token``: the earlier token
        that carried it, which proves the id was assigned to this principal)."""
        request = pb.IssueTokenRequest(
            curve_key=curve_key, producer_id=producer_id, producer_token=producer_token
        )
        return self._call("IssueToken", request, "read")

    # -- users (docs/security.md) -------------------------------------------

    def create_user(self, user: str, password: str, *, replace: bool = False, iterations: int = 4096) -> None:
        """Add a password user (or change its password with ``replace``); the password stays here:
        only its SCRAM salt, iterations, StoredKey and ServerKey are sent (for SCRAM-SHA-256, and
        for SCRAM-SHA-512 with the same salt, which Kafka clients may use through the gateway)."""
        from robustmq.security._scram import MECHANISM, SHA512, derive_keys

        stored = derive_keys(password, iterations=iterations)
        sha512 = derive_keys(password, stored.salt, iterations, SHA512)
        request = pb.CreateUserRequest(
            user=user,
            mechanism=MECHANISM,
            salt=stored.salt,
            iterations=stored.iterations,
            stored_key=stored.stored_key,
            server_key=stored.server_key,
            stored_key_sha512=sha512.stored_key,
            server_key_sha512=sha512.server_key,
            replace=replace,
        )
        self._call("CreateUser", request, "idempotent" if replace else "once")

    def delete_user(self, user: str) -> None:
        """Remove a user; its sessions are refused from their next call."""
        self._call("DeleteUser", pb.DeleteUserRequest(user=user), "once")

    def list_users(self) -> list[pb.UserInfo]:
        return list(self._call("ListUsers", pb.Empty(), "read").users)

    def authorize(self, operation: str, resource_type: str, names: Sequence[str]) -> list[bool]:
        """Whether this client's own principal may do ``operation`` on each named resource (the
        Meta Service's decision from its ACLs; all True with security off)."""
        request = pb.AuthorizeRequest(operation=operation, resource_type=resource_type, resource_names=names)
        return list(self._call("Authorize", request, "read").allowed)

    def scram_start(self, client_first: str, mechanism: str) -> pb.ScramStartResponse:
        """The first step of a password login for someone else (a Kafka gateway relays its client's
        SCRAM messages): the answer's ``server_first`` goes back to that client."""
        request = pb.ScramStartRequest(client_first=client_first, mechanism=mechanism)
        return self._call("ScramStart", request, "once")

    def scram_finish(self, exchange_id: str, client_final: str, curve_key: bytes) -> pb.ScramFinishResponse:
        """The second step: the token (bound to ``curve_key``) if the client's proof is right."""
        request = pb.ScramFinishRequest(
            exchange_id=exchange_id, client_final=client_final, curve_key=curve_key
        )
        return self._call("ScramFinish", request, "once")

    def revoke_certificate(
        self, *, pem: str = "", sha256: bytes = b"", reason: str = ""
    ) -> tuple[pb.Revocation, bool]:
        """Revoke a certificate, named by its PEM or its SHA-256 fingerprint: its logins and every
        session token issued for it are refused from now on (docs/security.md, "Revocation").
        The revocation, and whether it was revoked already (then nothing changed)."""
        request = pb.RevokeCertificateRequest(certificate_pem=pem, sha256=sha256, reason=reason)
        answer = self._call("RevokeCertificate", request, "idempotent")
        return answer.revocation, answer.already

    def list_revocations(self) -> list[pb.Revocation]:
        """Every revoked certificate, oldest first."""
        return list(self._call("ListRevocations", pb.Empty(), "read").revocations)

    def close(self) -> None:
        """Close the channel if this client opened it."""
        if self._given_channel is None:
            with self._lock:
                channels = list(self._channels.values())
                self._channels.clear()
                self._stubs.clear()
            for channel in channels:
                channel.close()

    def __enter__(self) -> MetaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topics ------------------------------------------------------------

    def create_topic(self, name: str, **settings: Any) -> pb.Topic:
        """Create a topic; ``settings`` are :data:`robustmq._wire.DEFAULT_TOPIC_CONFIG` names.

        Raises
        ------
        InvalidConfig
            An unknown setting, or an explicit 0 (which the wire cannot tell from
            "unset"), with ``field`` naming it; the service checks every other limit.
        TopicAlreadyExists, Unavailable
            The name is taken; too few live storage nodes. A refusal the
            service marks ``settling`` (a Meta Service that started seconds ago,
            whose nodes may not have registered or beaten yet; a node that still
            owes the deletion of a same-name topic's shard) is asked again for up
            to :data:`PLACEMENT_WAIT_S` from the first such answer before it is raised.
        """
        for key, value in sorted(settings.items()):
            _check_setting(key, value)
        try:
            config = topic_config(**settings)
        except ValueError as exc:  # protobuf's range check (int32, int64)
            raise InvalidConfig(f"a topic setting is out of range: {exc}") from None
        request = pb.CreateTopicRequest(name=name, config=config)
        attempts = 0

        def sending() -> None:
            nonlocal attempts
            attempts += 1

        placement_deadline: float | None = None  # from the first "settling" answer
        try:
            while True:
                try:
                    return self._call("CreateTopic", request, "idempotent", on_send=sending)
                except Unavailable as error:
                    # The service's own "not placeable yet": it clears within a heartbeat or two.
                    if error.fields.get("settling") is not True:
                        raise
                    if placement_deadline is None:
                        placement_deadline = time.monotonic() + min(PLACEMENT_WAIT_S, self.timeout_s)
                    if time.monotonic() + _PLACEMENT_RETRY_S >= placement_deadline:
                        raise
                    time.sleep(_PLACEMENT_RETRY_S)
        except TopicAlreadyExists:
            # After a lost answer, the topic may be our own earlier attempt's:
            # that is success only if it is exactly what was asked for.
            if attempts > 1:
                existing = self.describe_topic(name, tail=1).topic
                if existing.config == _resolved(config):
                    return existing
            raise

    def alter_topic(self, name: str, **settings: Any) -> pb.Topic:
        """Change some settings of an existing topic; the topic as stored.

        ``settings`` are :data:`robustmq._wire.DEFAULT_TOPIC_CONFIG` names, checked here as
        by :meth:`create_topic` (no explicit 0) and by the service as at creation; the
        service refuses ``partitions``, ``replication_factor``, ``engine`` and
        ``cleanup_policy`` (``InvalidConfig`` naming the field). Repeating a call is harmless.
        """
        for key, value in sorted(settings.items()):
            if value is None:
                raise InvalidConfig(f"{key} needs a value", field=key)
            _check_setting(key, value)
        unknown = sorted(set(settings) - set(DEFAULT_TOPIC_CONFIG))
        if unknown:
            raise InvalidConfig(f"unknown topic settings {unknown}", field=unknown[0], settings=unknown)
        try:
            config = pb.TopicConfig(**settings)
        except ValueError as exc:  # protobuf's range check (int32, int64)
            raise InvalidConfig(f"a topic setting is out of range: {exc}") from None
        request = pb.AlterTopicRequest(name=name, config=config, set=sorted(settings))
        return self._call("AlterTopic", request, "idempotent")

    def list_topics_page(self, page_token: str = "", limit: int = 0) -> tuple[list[pb.Topic], str]:
        """One page of topics and the next page's token ("" after the last page)."""
        request = pb.ListTopicsRequest(page_token=page_token, limit=limit)
        response = self._call("ListTopics", request, "read")
        return list(response.topics), response.next_page_token

    def list_topics(self, *, page_size: int = 1_000) -> list[pb.Topic]:
        """Every topic, sorted by name, following the pages."""
        return sorted(_follow_pages(self.list_topics_page, page_size), key=lambda topic: topic.name)

    def describe_topic(self, name: str, *, tail: int = 0) -> pb.TopicDescription:
        """The topic and each shard's whole chain, or with ``tail`` only each chain's last
        ``tail`` segments (a small answer whatever the chains' lengths: what routing writes
        needs). Each shard's ``log_start_offset`` and ``first_epoch`` name its chain's first
        segment either way."""
        return self._call("DescribeTopic", pb.TopicRequest(name=name, tail=tail), "read")

    def delete_topic(
        self, name: str, *, incarnation: int | None = None, wait: bool = True
    ) -> pb.DeleteTopicResponse:
        """Delete a topic; answered once no node can still take its writes (docs/replication.md,
        "Leases"), with the incarnation deleted.

        Every request names the incarnation it deletes: ``incarnation``, else the
        topic's current one, looked up first. The service deletes the topic only if
        that is still its incarnation, and otherwise waits for that incarnation's
        deletion, so a request is safe to send again: a transport failure and a
        ``DeletionPending`` from the service (a node that held the topic has not
        confirmed dropping it yet) are asked again until ``timeout_s``; then it is
        raised: the deletion is recorded and completes in the background. A caller that
        repeats a delete whose answer it lost should name the ``incarnation`` it meant
        (``create_topic``'s answer, ``describe_topic``): by name alone, the repeat
        deletes a topic another client created again meanwhile. A name with no topic
        names no incarnation: the service waits for the name's deletions still under
        way, else answers ``TopicNotFound``.
        ``wait=False`` answers as soon as the deletion is recorded (``complete`` and
        ``waiting_for`` say where it stands).
        """
        deadline = time.monotonic() + self.timeout_s
        request = pb.DeleteTopicRequest(name=name, incarnation=incarnation, record_only=not wait)
        if incarnation is None:
            with contextlib.suppress(TopicNotFound, ShardNotFound):  # none now: deletions may be under way
                request.incarnation = self.get_shard(shard_name(name, 0)).incarnation
        backoff_s = _BACKOFF_FIRST_S
        while True:
            mode: _Retry = "idempotent" if request.HasField("incarnation") else "once"
            try:
                return self._call("DeleteTopic", request, mode, deadline=deadline)
            except DeletionPending as pending:
                incarnation = pending.fields.get("incarnation")
                if not isinstance(incarnation, int) or time.monotonic() + backoff_s >= deadline:
                    raise
                request = pb.DeleteTopicRequest(name=name, incarnation=incarnation, record_only=not wait)
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)

    def get_shard(self, shard: str, *, tail: int = 0, offset: int | None = None) -> pb.ShardInfo:
        """The shard's whole chain, or only its last ``tail`` segments and/or the segments from
        the one holding ``offset`` (a small answer whatever the chain's length: what a client
        routing a write or a read needs). ``log_start_offset`` and ``first_epoch`` name the
        chain's first segment either way."""
        request = pb.ShardRequest(shard=shard, tail=tail)
        if offset is not None:
            request.offset = offset
        return self._call("GetShard", request, "read")

    def seal_segment(
        self,
        shard: str,
        epoch: int,
        end_offset: int,
        node_id: str,
        incarnation: int | None = None,
        *,
        isr: Iterable[str] = (),
        crc32c: int | None = None,
        size_bytes: int = 0,
    ) -> pb.SealSegmentResponse:
        """Seal ``epoch`` of ``shard`` at ``end_offset`` (exclusive); ``.sealed`` and ``.next``.

        With ``incarnation``, the service refuses (``ShardNotFound``) unless it is the topic's
        current one. ``isr`` are the replicas verified to hold the whole segment (the leader
        included; empty: the leader alone), ``crc32c`` and ``size_bytes`` its frames' checksum
        and length: the sealed segment records them.
        """
        request = pb.SealSegmentRequest(
            shard=shard,
            epoch=epoch,
            end_offset=end_offset,
            node_id=node_id,
            incarnation=incarnation,
            isr=list(isr),
            crc32c=crc32c,
            size_bytes=size_bytes,
        )
        return self._call("SealSegment", request, "idempotent")

    # -- replicas ----------------------------------------------------------

    def update_isr(
        self,
        shard: str,
        incarnation: int,
        epoch: int,
        node_id: str,
        isr: Iterable[str],
        expected: Iterable[str] = (),
        *,
        expected_version: int | None = None,
        node_session: int = 0,
    ) -> pb.Segment:
        """Record the ISR of the active segment ``epoch``, which ``node_id`` leads; the segment as stored.

        ``StaleEpoch`` unless ``node_id`` leads ``epoch`` and it is active; ``ShardNotFound``
        for another incarnation; ``InvalidRequest`` unless ``isr`` holds the leader and only
        replicas. Idempotent (the same ISR again changes nothing). A compare-and-set on the
        segment's ``isr_version`` (``expected_version``; older callers name the ISR itself,
        ``expected``): a segment at another version changes nothing and is answered as
        recorded. ``node_session``: the caller's ``NodeInfo.session`` (an earlier process's is
        refused ``StaleEpoch``).
        """
        request = pb.UpdateIsrRequest(
            shard=shard,
            incarnation=incarnation,
            epoch=epoch,
            node_id=node_id,
            isr=list(isr),
            expected_isr=list(expected),
            expected_isr_version=expected_version,
            node_session=node_session,
        )
        return self._call("UpdateIsr", request, "idempotent")

    def report_replica(
        self, shard: str, incarnation: int, epoch: int, node_id: str, crc32c: int, size_bytes: int
    ) -> pb.Segment:
        """Tell the service ``node_id`` holds sealed ``epoch`` whole; it joins the segment's ``isr``
        if length and CRC match the recorded ones (``InvalidRequest`` naming both otherwise).
        Idempotent; the segment as stored."""
        request = pb.ReportReplicaRequest(
            shard=shard,
            incarnation=incarnation,
            epoch=epoch,
            node_id=node_id,
            crc32c=crc32c,
            size_bytes=size_bytes,
        )
        return self._call("ReportReplica", request, "idempotent")

    def list_assignments(self, node_id: str) -> pb.AssignmentsResponse:
        """The shards ``node_id`` must follow or copy, and the assignments version they answer."""
        return self._call("ListAssignments", pb.NodeIdRequest(node_id=node_id), "read")

    # -- nodes -------------------------------------------------------------

    def register_node(self, node_id: str, address: str, curve_key: bytes = b"") -> pb.NodeInfo:
        """Register this process of a node; with security on, ``curve_key`` is its CURVE public key and
        the answer's ``token`` the node's session token."""
        request = pb.RegisterNodeRequest(node_id=node_id, address=address, curve_key=curve_key)
        return self._call("RegisterNode", request, "idempotent")

    def heartbeat(
        self,
        node_id: str,
        address: str,
        progress: Iterable[tuple[str, int, int]] = (),
        shard_count: int = 0,
        deleted: Iterable[tuple[str, int]] = (),
        reserved: Mapping[str, int] | None = None,
        incarnations: Mapping[str, int] | None = None,
        stored_bytes: int = 0,
        timeout_s: float | None = None,
    ) -> pb.HeartbeatResponse:
        """Report liveness and ``(shard, high_watermark, log_start_offset)`` per changed shard.

        ``deleted`` acknowledges the ``(shard, incarnation)`` deletions the node has
        carried out; the answer's ``deletions`` are the ones still pending.
        ``reserved`` gives a reserved offset for some of the reported shards;
        ``incarnations`` the topic incarnation a report is about (the service
        ignores a report of another incarnation than the topic's current one).
        ``stored_bytes`` is what the node stores. The answer's ``assignments_version``
        changes when the node must call :meth:`list_assignments` again; its ``lease_ms`` is the
        node's write lease. ``timeout_s`` (default: the client's) bounds this call.
        """
        reserved = reserved or {}
        incarnations = incarnations or {}
        request = pb.HeartbeatRequest(
            node_id=node_id,
            address=address,
            progress=[
                pb.ShardProgress(
                    shard=shard,
                    high_watermark=hw,
                    log_start_offset=log_start,
                    reserved_offset=reserved.get(shard, 0),
                    incarnation=incarnations.get(shard),
                )
                for shard, hw, log_start in progress
            ],
            shard_count=shard_count,
            deleted=[pb.ShardDeletion(shard=shard, incarnation=inc) for shard, inc in deleted],
            stored_bytes=stored_bytes,
        )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._call("Heartbeat", request, "read", deadline=deadline)

    def list_nodes(self) -> list[pb.NodeInfo]:
        return list(self._call("ListNodes", pb.Empty(), "read").nodes)

    def drain_node(self, node_id: str, undrain: bool = False) -> pb.NodeInfo:
        """Mark a node draining (no new placement; its led active segments are sealed so
        leadership moves off it), or place on it again with ``undrain``. Idempotent."""
        request = pb.DrainNodeRequest(node_id=node_id, undrain=undrain)
        return self._call("DrainNode", request, "idempotent")

    def remove_node(self, node_id: str, *, force: bool = False) -> pb.RemoveNodeResponse:
        """Remove a node's registration for good (refused while alive or leading, unless ``force``)."""
        request = pb.RemoveNodeRequest(node_id=node_id, force=force)
        return self._call("RemoveNode", request, "once")

    # -- group offsets -----------------------------------------------------

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Store ``partition -> next offset to read`` for ``group``."""
        request = pb.CommitOffsetsRequest(group=group, topic=topic, offsets=dict(offsets))
        self._call("CommitOffsets", request, "idempotent")

    def fetch_offsets(self, group: str, topic: str) -> dict[int, int]:
        request = pb.GroupTopicRequest(group=group, topic=topic)
        response = self._call("FetchOffsets", request, "read")
        return dict(sorted(response.offsets.items()))

    def group_lag(self, group: str, topic: str = "") -> pb.GroupLagResponse:
        """Committed offset, high watermark and lag per partition (all topics if ``topic`` is "")."""
        request = pb.GroupTopicRequest(group=group, topic=topic)
        return self._call("GroupLag", request, "read")

    def list_groups_page(self, page_token: str = "", limit: int = 0) -> tuple[list[str], str]:
        """One page of group names and the next page's token ("" after the last page)."""
        request = pb.ListGroupsRequest(page_token=page_token, limit=limit)
        response = self._call("ListGroups", request, "read")
        return list(response.groups), response.next_page_token

    def list_groups(self, *, page_size: int = 1_000) -> list[str]:
        """Every group with committed offsets, sorted, following the pages."""
        return sorted(_follow_pages(self.list_groups_page, page_size))

    def delete_group(self, group: str) -> int:
        """Remove every offset ``group`` committed; how many there were (0: none, nothing done)."""
        request = pb.DeleteGroupRequest(group=group)
        return int(self._call("DeleteGroup", request, "idempotent").offsets_removed)

    # -- tiering (docs/tiering.md) -----------------------------------------

    def cluster_config(self) -> pb.ClusterConfig:
        """Cluster-wide settings: ``tier_url`` ("" when nothing is tiered)."""
        return self._call("GetClusterConfig", pb.Empty(), "read")

    def list_sealed(
        self, after_seq: int, limit: int = 0, untiered_only: bool = False
    ) -> pb.ListSealedResponse:
        """One page of sealed segments with ``sealed_seq > after_seq``, in ``sealed_seq`` order.

        ``limit`` 0 is the service's default page (1,000; at most 10,000); ``last_seq`` is the
        highest ``sealed_seq`` assigned so far. Segments that left the chain are not listed.
        """
        request = pb.ListSealedRequest(after_seq=after_seq, limit=limit, untiered_only=untiered_only)
        return self._call("ListSealed", request, "read")

    def mark_tiered(
        self,
        shard: str,
        incarnation: int,
        epoch: int,
        object_url: str,
        object_bytes: int,
        max_timestamp_ms: int,
    ) -> pb.Segment:
        """Record that sealed ``epoch`` of ``shard`` is in the object store; the segment as stored.

        Idempotent: the same request again answers the same segment. Refused with
        ``InvalidRequest`` whose ``reason`` field says why (``no tier url``, ``wrong url``,
        ``active``, ``unknown epoch``, ``removed``, ``another object``; docs/tiering.md), or
        ``ShardNotFound`` / ``TopicNotFound`` (a deleted topic, another incarnation).
        """
        request = pb.MarkTieredRequest(
            shard=shard,
            incarnation=incarnation,
            epoch=epoch,
            object_url=object_url,
            object_bytes=object_bytes,
            max_timestamp_ms=max_timestamp_ms,
        )
        return self._call("MarkTiered", request, "idempotent")

    # -- security (docs/security.md): ACLs and producer ids --------------------------------

    def init_producer_id(
        self, curve_key: bytes = b"", transactional_id: str = ""
    ) -> pb.InitProducerIdResponse:
        """A producer id the Meta Service never handed out before (and, with security on, a
        token that may produce with it, bound to ``curve_key``). With a ``transactional_id``
        (Kafka's ``transactional.id``), the same id every time for the same caller and
        transactional id: a writer replayed in another process keeps its idempotence."""
        request = pb.InitProducerIdRequest(curve_key=curve_key, transactional_id=transactional_id)
        # Not idempotent without a transactional id (each call hands out an id), but a repeat only
        # wastes one: retried.
        return self._call("InitProducerId", request, "idempotent")

    def create_acl(self, binding: pb.AclBinding) -> None:
        """Add an ACL (docs/security.md); an existing one is left as it is."""
        self._call("CreateAcl", binding, "idempotent")

    def delete_acl(self, binding: pb.AclBinding) -> int:
        """Remove the ACL ``binding`` names exactly; 1, or 0 if there was none."""
        return int(self._call("DeleteAcl", binding, "idempotent").deleted)

    def list_acls(
        self, principal: str = "", resource_type: str = "", resource_name: str = ""
    ) -> pb.ListAclsResponse:
        """The ACLs a filter selects ("" matches anything) and the current ``acl_version``."""
        request = pb.ListAclsRequest(
            principal=principal, resource_type=resource_type, resource_name=resource_name
        )
        return self._call("ListAcls", request, "read")

    def set_quota(self, entry: pb.QuotaEntry) -> None:
        """Store a principal's quota entry (docs/operators.md, "Quotas"), replacing its former one:
        a rate the entry leaves unset falls back to the ``*`` entry's, then to the node's."""
        self._call("SetQuota", entry, "idempotent")

    def delete_quota(self, principal: str) -> bool:
        """Remove ``principal``'s quota entry; whether there was one."""
        answer = self._call("DeleteQuota", pb.DeleteQuotaRequest(principal=principal), "idempotent")
        return bool(answer.deleted)

    def list_quotas(self) -> pb.ListQuotasResponse:
        """Every quota entry, and the ``acl_version`` they are as of."""
        return self._call("ListQuotas", pb.Empty(), "read")
