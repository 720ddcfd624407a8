"""Kafka consumer groups: the classic group coordinator and committed offsets.

APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups (the classic protocol;
KIP-848's ConsumerGroupHeartbeat is not served, clients default to classic).

Where state lives. A Kafka group *is* an OffsetManager group: OffsetCommit
stores ``partition -> next offset to read`` with the Meta Service's
CommitOffsets (durable, replicated with the Meta Service), OffsetFetch reads
FetchOffsets, so ``robustmq groups`` and the Spark source's
``startingOffsets=group`` see what Kafka consumers committed, and the other
way round. Membership (members, generation, leader, assignments) lives in the
memory of the group's coordinator gateway only (``_peers`` chooses it among the
live gateways). A gateway that restarts, or a group that moves to another
gateway, loses only the rebalance in flight: the members' next Heartbeat,
SyncGroup or OffsetCommit is answered ``UNKNOWN_MEMBER_ID``, they rejoin
and read on from the committed offsets.

The state machine is Kafka's (``GroupCoordinator``): ``Empty`` ->
``PreparingRebalance`` (every known member must JoinGroup again within the
largest rebalance timeout; those that do not are removed) ->
``CompletingRebalance`` (generation + 1; the leader gets every member's
metadata and sends the assignment in SyncGroup) -> ``Stable``. A new member, a
changed subscription, the leader rejoining, a LeaveGroup or a member silent for
its session timeout starts a rebalance; Heartbeat answers
``REBALANCE_IN_PROGRESS`` meanwhile. The first rebalance of an empty group
waits ``initial_rebalance_delay_s`` (Kafka's
``group.initial.rebalance.delay.ms``; here 0.3 s by default) after each new
member, within the rebalance timeout, so members started together form one
generation. JoinGroup v4+ without a member id is answered
``MEMBER_ID_REQUIRED`` with a fresh id (KIP-394). ``group.instance.id``
(static membership) is accepted and reported, not used to keep a member
across restarts.

Commit fencing (what keeps a position from being read twice): a commit that
names a generation (>= 0) is accepted only from a current member at the
group's generation, while the group is ``Stable`` or ``PreparingRebalance``
(a member commits what it read before it rejoins); a member of an older
generation gets ``ILLEGAL_GENERATION``, an unknown one ``UNKNOWN_MEMBER_ID``.
A commit without a generation (``assign()`` consumers) is accepted only while
the group has no members.

Bounds: ``max_groups`` groups with members in memory (more:
``COORDINATOR_NOT_AVAILABLE``), ``max_members`` per group (more:
``GROUP_MAX_SIZE_REACHED``), ``max_pending`` member ids handed out and not yet
used per group; an empty group is forgotten (its offsets stay in the Meta
Service). Every wait is bounded by a rebalance or session timeout, which are
themselves bounded (``min_session_s``..``max_session_s``, else
``INVALID_SESSION_TIMEOUT``).

Thread-safety: everything runs on the gateway's event loop; only the Meta
Service calls go to the thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from robustmq.errors import InvalidRequest, RobustMQError, TopicNotFound

from ._errors import kafka_error
from ._protocol import (
    NO_THROTTLE,
    Api,
    ApiTable,
    ErrorCode,
    Handler,
    RequestHeader,
    error_response,
    make,
    response_module,
)

__all__ = ["Coordinator", "GroupSettings", "register"]

log = logging.getLogger("robustmq.kafka_gateway")

FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP = 10, 11, 14, 12, 13
OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS = 8, 9, 16, 15


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSettings:
    initial_rebalance_delay_s: float = 0.3
    min_session_s: float = 1.0
    max_session_s: float = 1800.0
    max_groups: int = 10_000
    max_members: int = 1_000
    max_pending: int = 1_000
    reap_interval_s: float = 0.25


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_s: float
    rebalance_s: float
    protocols: tuple[tuple[str, bytes], ...]
    last_seen: float
    assignment: bytes = b""
    join: asyncio.Future[JoinResult] | None = None
    sync: asyncio.Future[tuple[ErrorCode, bytes]] | None = None

    def joining(self) -> bool:
        return self.join is not None and not self.join.done()


@dataclass(slots=True)
class Group:
    group_id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # member id handed out -> when
    deadline: float = 0.0  # the rebalance's end: members not joined by then are removed
    delay_until: float = 0.0  # the initial rebalance delay
    timer: asyncio.TimerHandle | None = None


def _now() -> float:
    return time.monotonic()


class Coordinator:
    """The groups this gateway coordinates (in memory; offsets in the Meta Service)."""

    def __init__(self, settings: GroupSettings | None = None) -> None:
        self.settings = settings or GroupSettings()
        self.groups: dict[str, Group] = {}
        self._reaper: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for group in self.groups.values():
            if group.timer is not None:
                group.timer.cancel()
            for member in group.members.values():
                _resolve_join(member, JoinResult(ErrorCode.coordinator_not_available))
                _resolve_sync(member, ErrorCode.coordinator_not_available)
        self.groups.clear()

    # -- join ------------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        *,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_s: float,
        rebalance_s: float,
        protocol_type: str,
        protocols: tuple[tuple[str, bytes], ...],
        require_known_id: bool,
    ) -> JoinResult:
        settings = self.settings
        if not settings.min_session_s <= session_s <= settings.max_session_s:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=member_id)
        if not protocol_type or not protocols:
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        group = self.groups.get(group_id)
        if group is None:
            if len(self.groups) >= settings.max_groups:
                return JoinResult(ErrorCode.coordinator_not_available, member_id=member_id)
            group = self.groups[group_id] = Group(group_id)
        if group.members and (
            protocol_type != group.protocol_type
            or not self._common_protocols(group, protocols, excluding=member_id)
        ):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        now = _now()
        member = group.members.get(member_id) if member_id else None
        if member is None:
            if member_id and member_id not in group.pending:
                self._forget_if_empty(group)
                return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
            if len(group.members) >= settings.max_members:
                self._forget_if_empty(group)
                return JoinResult(ErrorCode.group_max_size_reached, member_id=member_id)
            if not member_id:
                member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
                if require_known_id:  # KIP-394: the client joins again with this id
                    self._expire_pending(group, now)
                    if len(group.pending) >= settings.max_pending:
                        return JoinResult(ErrorCode.group_max_size_reached)
                    group.pending[member_id] = now + rebalance_s + session_s
                    return JoinResult(ErrorCode.member_id_required, member_id=member_id)
            group.pending.pop(member_id, None)
            member = Member(
                member_id, instance_id, client_id, client_host, session_s, rebalance_s, protocols, now
            )
            group.members[member_id] = member
            if group.leader is None:
                group.leader = member_id
            group.protocol_type = protocol_type
            changed = True
        else:
            changed = member.protocols != protocols or member_id == group.leader
            member.protocols, member.session_s, member.rebalance_s = protocols, session_s, rebalance_s
            member.last_seen = now
            if group.state == State.STABLE and not changed:  # nothing to rebalance: the current generation
                return self._join_result(group, member)
        _resolve_join(member, JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join = future
        if group.state != State.PREPARING:
            self._prepare(group, f"member {member_id} joined" if changed else "a member rejoined")
        elif changed and group.delay_until > now:  # the first rebalance waits for more members
            group.delay_until = min(now + settings.initial_rebalance_delay_s, group.deadline)
        self._try_complete(group)
        return await future

    def _common_protocols(
        self, group: Group, protocols: tuple[tuple[str, bytes], ...], *, excluding: str = ""
    ) -> set[str]:
        names = {name for name, _ in protocols}
        for member in group.members.values():
            if member.member_id != excluding:
                names &= {name for name, _ in member.protocols}
        return names

    def _prepare(self, group: Group, reason: str) -> None:
        now = _now()
        for member in group.members.values():
            _resolve_sync(member, ErrorCode.rebalance_in_progress)
        first = group.state == State.EMPTY
        group.state = State.PREPARING
        group.deadline = now + max((m.rebalance_s for m in group.members.values()), default=0.0)
        group.delay_until = now + self.settings.initial_rebalance_delay_s if first else now
        group.delay_until = min(group.delay_until, group.deadline)
        log.info("group %s rebalances (generation %d): %s", group.group_id, group.generation, reason)

    def _try_complete(self, group: Group) -> None:
        if group.state != State.PREPARING:
            return
        now = _now()
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        every = all(member.joining() for member in group.members.values())
        if not ((every and now >= group.delay_until) or now >= group.deadline):
            wake = group.delay_until if every else group.deadline
            group.timer = asyncio.get_running_loop().call_later(
                max(0.0, wake - now) + 0.001, self._try_complete, group
            )
            return
        for member_id in [m.member_id for m in group.members.values() if not m.joining()]:
            self._remove(group, member_id, "did not rejoin in time")
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.leader = State.EMPTY, None, None
            self._forget_if_empty(group)
            return
        group.protocol = self._choose_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = State.COMPLETING
        log.info(
            "group %s generation %d: %d members, leader %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.leader,
        )
        everyone = tuple(
            (m.member_id, m.instance_id, dict(m.protocols)[group.protocol]) for m in group.members.values()
        )
        for member in group.members.values():
            member.last_seen = now
            member.assignment = b""
            _resolve_join(member, self._join_result(group, member, everyone))

    def _choose_protocol(self, group: Group) -> str:
        candidates = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        votes: dict[str, int] = {}
        for member in group.members.values():
            preferred = next(name for name, _ in member.protocols if name in candidates)
            votes[preferred] = votes.get(preferred, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def _join_result(
        self, group: Group, member: Member, everyone: tuple[tuple[str, str | None, bytes], ...] = ()
    ) -> JoinResult:
        return JoinResult(
            ErrorCode.none,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol=group.protocol,
            leader=group.leader or "",
            member_id=member.member_id,
            members=everyone if member.member_id == group.leader else (),
        )

    # -- sync, heartbeat, leave -------------------------------------------------------------------

    def _member(self, group_id: str, member_id: str, generation: int) -> tuple[Group | None, ErrorCode]:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return group, ErrorCode.unknown_member_id
        if generation != group.generation:
            return group, ErrorCode.illegal_generation
        return group, ErrorCode.none

    async def sync(
        self, group_id: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> tuple[ErrorCode, bytes]:
        group, error = self._member(group_id, member_id, generation)
        if error != ErrorCode.none or group is None:
            return error, b""
        member = group.members[member_id]
        member.last_seen = _now()
        if group.state == State.PREPARING:
            return ErrorCode.rebalance_in_progress, b""
        if group.state == State.STABLE:
            return ErrorCode.none, member.assignment
        if member_id == group.leader:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            group.state = State.STABLE
            for each in group.members.values():
                _resolve_sync(each, ErrorCode.none, each.assignment)
            return ErrorCode.none, member.assignment
        _resolve_sync(member, ErrorCode.rebalance_in_progress)
        future: asyncio.Future[tuple[ErrorCode, bytes]] = asyncio.get_running_loop().create_future()
        member.sync = future
        return await future

    def heartbeat(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        group, error = self._member(group_id, member_id, generation)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        group.members[member_id].last_seen = _now()
        if error != ErrorCode.none:
            return error
        if group.state == State.PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if not member_id and instance_id:
            member_id = next(
                (m.member_id for m in group.members.values() if m.instance_id == instance_id), ""
            )
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        self._remove(group, member_id, "left the group")
        self._after_removal(group, f"member {member_id} left")
        return ErrorCode.none

    def _remove(self, group: Group, member_id: str, why: str) -> None:
        member = group.members.pop(member_id)
        _resolve_join(member, JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        _resolve_sync(member, ErrorCode.unknown_member_id)
        log.info("group %s: member %s %s", group.group_id, member_id, why)
        if group.leader == member_id:
            group.leader = next(iter(group.members), None)

    def _after_removal(self, group: Group, reason: str) -> None:
        if group.state == State.PREPARING:
            self._try_complete(group)
        elif not group.members:
            group.generation += 1
            group.state, group.protocol, group.leader = State.EMPTY, None, None
            self._forget_if_empty(group)
        else:
            self._prepare(group, reason)
            self._try_complete(group)

    def _expire_pending(self, group: Group, now: float) -> None:
        for member_id in [m for m, until in group.pending.items() if until < now]:
            del group.pending[member_id]

    def _forget_if_empty(self, group: Group) -> None:
        self._expire_pending(group, _now())
        if not group.members and not group.pending and group.state == State.EMPTY:
            if group.timer is not None:
                group.timer.cancel()
            self.groups.pop(group.group_id, None)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                self.reap()
            except Exception:  # never let one bad group stop the expiry of every other
                log.exception("group expiry failed")

    def reap(self) -> None:
        """Remove members silent past their session timeout (a member in a JoinGroup is not silent)."""
        now = _now()
        for group in list(self.groups.values()):
            expired = [
                m.member_id
                for m in group.members.values()
                if not m.joining() and now - m.last_seen > m.session_s
            ]
            for member_id in expired:
                self._remove(group, member_id, "missed its session timeout")
            if expired:
                self._after_removal(group, f"{len(expired)} member(s) timed out")
            else:
                self._forget_if_empty(group)

    # -- commits -----------------------------------------------------------------------------------

    def may_commit(self, group_id: str, member_id: str, generation: int) -> ErrorCode:
        group = self.groups.get(group_id)
        if generation < 0:
            if group is not None and group.members:
                return ErrorCode.unknown_member_id
            return ErrorCode.none
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id if group is not None else ErrorCode.illegal_generation
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state == State.COMPLETING:
            return ErrorCode.rebalance_in_progress
        group.members[member_id].last_seen = _now()
        return ErrorCode.none


def _resolve_join(member: Member, result: JoinResult) -> None:
    if member.join is not None and not member.join.done():
        member.join.set_result(result)
    member.join = None


def _resolve_sync(member: Member, error: ErrorCode, assignment: bytes = b"") -> None:
    if member.sync is not None and not member.sync.done():
        member.sync.set_result((error, assignment))
    member.sync = None


# -- the handlers --------------------------------------------------------------------------------


def _seconds(value: Any) -> float:
    return float(value.total_seconds()) if hasattr(value, "total_seconds") else float(value) / 1000.0


def _not_coordinator(connection: Any, group_id: str) -> bool:
    return not connection.gateway.peers.is_coordinator(group_id)


def _valid_group(group_id: str | None) -> bool:
    return bool(group_id) and len(group_id or "") <= 255 and (group_id or "").isprintable()


async def _find_coordinator(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(FIND_COORDINATOR, header.api_version)
    key_type = int(getattr(request, "key_type", 0))

    def answer(key: str) -> dict[str, Any]:
        if key_type != 0:
            return {
                "error_code": ErrorCode.invalid_request,
                "error_message": "transactions are not supported",
                "node_id": -1,
                "host": "",
                "port": -1,
            }
        if not _valid_group(key):
            return {
                "error_code": ErrorCode.invalid_group_id,
                "error_message": "invalid group id",
                "node_id": -1,
                "host": "",
                "port": -1,
            }
        broker = gateway.peers.coordinator(key)
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": broker.node_id,
            "host": broker.host,
            "port": broker.port,
        }

    if header.api_version >= 4:
        coordinators = tuple(
            make(module.Coordinator, key=key, **answer(key)) for key in request.coordinator_keys
        )
        return make(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=coordinators)
    return make(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, **answer(request.key))


async def _join_group(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(JOIN_GROUP, header.api_version)

    def respond(result: JoinResult) -> Any:
        members = tuple(
            make(module.JoinGroupResponseMember, member_id=m, group_instance_id=i, metadata=meta)
            for m, i, meta in result.members
        )
        return make(
            module.JoinGroupResponse,
            throttle_time=NO_THROTTLE,
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol
            if result.protocol is not None
            else ("" if header.api_version < 7 else None),
            leader=result.leader,
            member_id=result.member_id,
            members=members,
            skip_assignment=False,
        )

    if not _valid_group(request.group_id):
        return respond(JoinResult(ErrorCode.invalid_group_id, member_id=request.member_id))
    if _not_coordinator(connection, request.group_id):
        return respond(JoinResult(ErrorCode.not_coordinator, member_id=request.member_id))
    session_s = _seconds(request.session_timeout)
    rebalance = getattr(request, "rebalance_timeout", None)
    result = await gateway.coordinator.join(
        request.group_id,
        member_id=request.member_id,
        instance_id=getattr(request, "group_instance_id", None),
        client_id=header.client_id or "",
        client_host=connection.peer,
        session_s=session_s,
        rebalance_s=_seconds(rebalance) if rebalance is not None else session_s,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        require_known_id=header.api_version >= 4,
    )
    return respond(result)


async def _sync_group(connection: Any, header: RequestHeader, request: Any) -> Any:
    module = response_module(SYNC_GROUP, header.api_version)
    coordinator = connection.gateway.coordinator
    if _not_coordinator(connection, request.group_id):
        error, assignment = ErrorCode.not_coordinator, b""
    else:
        assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
        error, assignment = await coordinator.sync(
            request.group_id, request.member_id, int(request.generation_id), assignments
        )
    group = coordinator.groups.get(request.group_id)
    return make(
        module.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=error,
        protocol_type=group.protocol_type if group is not None else None,
        protocol_name=group.protocol if group is not None else None,
        assignment=assignment,
    )


async def _heartbeat(connection: Any, header: RequestHeader, request: Any) -> Any:
    module = response_module(HEARTBEAT, header.api_version)
    if _not_coordinator(connection, request.group_id):
        error = ErrorCode.not_coordinator
    else:
        error = connection.gateway.coordinator.heartbeat(
            request.group_id, request.member_id, int(request.generation_id)
        )
    return make(module.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


async def _leave_group(connection: Any, header: RequestHeader, request: Any) -> Any:
    module = response_module(LEAVE_GROUP, header.api_version)
    coordinator = connection.gateway.coordinator
    if header.api_version < 3:
        leaving: Sequence[tuple[str, str | None]] = [(request.member_id, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    if _not_coordinator(connection, request.group_id):
        return make(
            module.LeaveGroupResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.not_coordinator,
            members=(),
        )
    results = [(m, i, coordinator.leave(request.group_id, m, i)) for m, i in leaving]
    top = results[0][2] if header.api_version < 3 and results else ErrorCode.none
    members = (
        tuple(
            make(module.MemberResponse, member_id=m, group_instance_id=i, error_code=e) for m, i, e in results
        )
        if header.api_version >= 3
        else ()
    )
    return make(module.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=top, members=members)


async def _offset_commit(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(OFFSET_COMMIT, header.api_version)
    generation = int(request.generation_id_or_member_epoch)

    def topic_answer(name: str, partitions: Sequence[tuple[int, ErrorCode]]) -> Any:
        return make(
            module.OffsetCommitResponseTopic,
            name=name,
            partitions=tuple(
                make(module.OffsetCommitResponsePartition, partition_index=p, error_code=e)
                for p, e in partitions
            ),
        )

    if not _valid_group(request.group_id):
        error = ErrorCode.invalid_group_id
    elif _not_coordinator(connection, request.group_id):
        error = ErrorCode.not_coordinator
    else:
        error = gateway.coordinator.may_commit(request.group_id, request.member_id, generation)
    topics = []
    for topic in request.topics:
        indexes = [int(p.partition_index) for p in topic.partitions]
        if error != ErrorCode.none:
            topics.append(topic_answer(topic.name, [(p, error) for p in indexes]))
            continue
        offsets = {int(p.partition_index): int(p.committed_offset) for p in topic.partitions}
        bad = {p for p, offset in offsets.items() if offset < 0}
        good = {p: offset for p, offset in offsets.items() if p not in bad}
        code = ErrorCode.none
        if good:
            try:
                await gateway.call(connection.client.meta.commit_offsets, request.group_id, topic.name, good)
            except TopicNotFound:
                code = ErrorCode.unknown_topic_or_partition
            except InvalidRequest as failure:
                code = (
                    ErrorCode.unknown_topic_or_partition
                    if failure.fields.get("partition") is not None
                    else ErrorCode.invalid_request
                )
            except RobustMQError as failure:
                code = kafka_error(failure)
        topics.append(
            topic_answer(topic.name, [(p, ErrorCode.invalid_request if p in bad else code) for p in indexes])
        )
    return make(module.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


async def _offset_fetch(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    meta = connection.client.meta
    module = response_module(OFFSET_FETCH, header.api_version)
    group_id = request.group_id

    def partition(index: int, offset: int, error: ErrorCode = ErrorCode.none) -> Any:
        return make(
            module.OffsetFetchResponsePartition,
            partition_index=index,
            committed_offset=offset,
            committed_leader_epoch=-1,
            metadata="",
            error_code=error,
        )

    def answer(topics: Sequence[Any], error: ErrorCode = ErrorCode.none) -> Any:
        return make(
            module.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=tuple(topics), error_code=error
        )

    if not _valid_group(group_id):
        return answer((), ErrorCode.invalid_group_id)
    results = []
    try:
        if request.topics is None:  # every topic the group committed to
            lags = await gateway.call(meta.group_lag, group_id)
            by_topic: dict[str, list[Any]] = {}
            for lag in lags:
                if lag.committed >= 0:
                    by_topic.setdefault(lag.topic, []).append(
                        partition(int(lag.partition), int(lag.committed))
                    )
            results = [
                make(module.OffsetFetchResponseTopic, name=name, partitions=tuple(parts))
                for name, parts in sorted(by_topic.items())
            ]
        else:
            for topic in request.topics:
                try:
                    committed = await gateway.call(meta.fetch_offsets, group_id, topic.name)
                except TopicNotFound:
                    committed = {}
                parts = tuple(
                    partition(int(p), int(committed.get(int(p), -1))) for p in topic.partition_indexes
                )
                results.append(make(module.OffsetFetchResponseTopic, name=topic.name, partitions=parts))
    except RobustMQError as failure:
        code = kafka_error(failure)
        if header.api_version >= 2:
            return answer((), code)
        results = [
            make(
                module.OffsetFetchResponseTopic,
                name=topic.name,
                partitions=tuple(partition(int(p), -1, code) for p in topic.partition_indexes),
            )
            for topic in request.topics or ()
        ]
    return answer(results)


async def _list_groups(connection: Any, header: RequestHeader, request: Any) -> Any:
    """The groups this gateway coordinates: those with members, and the Meta Service's that hash here."""
    gateway = connection.gateway
    module = response_module(LIST_GROUPS, header.api_version)
    listed: dict[str, tuple[str, str]] = {}
    error = ErrorCode.none
    try:
        names, _next = await gateway.call(connection.client.meta.list_groups_page, "", 10_000)
        for name in names:
            if gateway.peers.is_coordinator(name):
                listed[name] = ("", State.EMPTY.value)
    except RobustMQError as failure:
        error = kafka_error(failure)
    for group in gateway.coordinator.groups.values():
        listed[group.group_id] = (group.protocol_type or "", group.state.value)
    if connection.principal is not None and listed:  # only the groups it may describe (as Kafka)
        try:
            names = sorted(listed)
            allowed = await gateway.call(connection.client.meta.authorize, "describe", "group", names)
            listed = {name: listed[name] for name, yes in zip(names, allowed, strict=True) if yes}
        except RobustMQError as failure:
            listed, error = {}, kafka_error(failure)
    wanted = set(getattr(request, "states_filter", ()) or ())
    groups = tuple(
        make(module.ListedGroup, group_id=name, protocol_type=kind, group_state=state)
        for name, (kind, state) in sorted(listed.items())
        if not wanted or state in wanted
    )
    return make(module.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error, groups=groups)


async def _describe_groups(connection: Any, header: RequestHeader, request: Any) -> Any:
    gateway = connection.gateway
    module = response_module(DESCRIBE_GROUPS, header.api_version)
    described = []
    try:
        allowed = await _allowed(connection, "describe", list(request.groups))
    except RobustMQError as failure:
        allowed, refusal = [False] * len(request.groups), kafka_error(failure)
    else:
        refusal = ErrorCode.group_authorization_failed
    for group_id, may in zip(request.groups, allowed, strict=True):
        if not may or _not_coordinator(connection, group_id):
            described.append(
                make(
                    module.DescribedGroup,
                    error_code=ErrorCode.not_coordinator if may else refusal,
                    group_id=group_id,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                    authorized_operations=-2147483648,
                )
            )
            continue
        group = gateway.coordinator.groups.get(group_id)
        members = ()
        if group is not None:
            members = tuple(
                make(
                    module.DescribedGroupMember,
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=dict(m.protocols).get(group.protocol or "", b"")
                    if group.protocol
                    else b"",
                    member_assignment=m.assignment,
                )
                for m in group.members.values()
            )
        described.append(
            make(
                module.DescribedGroup,
                error_code=ErrorCode.none,
                group_id=group_id,
                group_state=group.state.value if group is not None else State.EMPTY.value,
                protocol_type=(group.protocol_type or "") if group is not None else "",
                protocol_data=(group.protocol or "") if group is not None else "",
                members=members,
                authorized_operations=-2147483648,
            )
        )
    return make(module.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(described))


async def _allowed(connection: Any, operation: str, groups: Sequence[str]) -> list[bool]:
    """Whether the connection's principal may do ``operation`` on each group (all True unsecured).

    The gateway serves group membership itself, so it asks the Meta Service's decision
    (``Authorize``, as that principal); offsets are checked by the Meta Service on their RPCs."""
    principal = connection.principal
    if principal is None or not groups:
        return [True] * len(groups)
    return [
        await connection.gateway.call(principal.authorized, operation, "group", group) for group in groups
    ]


def _needs_read(api_key: int, handler: Handler) -> Handler:
    """``handler`` behind Kafka's check of these APIs: read on the group, else an answer whose
    error is GROUP_AUTHORIZATION_FAILED."""

    async def checked(connection: Any, header: RequestHeader, request: Any) -> Any:
        try:
            (allowed,) = await _allowed(connection, "read", [request.group_id])
        except RobustMQError as failure:
            return error_response(api_key, header.api_version, kafka_error(failure))
        if not allowed:
            return error_response(api_key, header.api_version, ErrorCode.group_authorization_failed)
        return await handler(connection, header, request)

    return checked


def register(table: ApiTable) -> None:
    table.add(Api(FIND_COORDINATOR, 0, 4, _find_coordinator))
    table.add(Api(JOIN_GROUP, 0, 7, _needs_read(JOIN_GROUP, _join_group)))
    table.add(Api(SYNC_GROUP, 0, 5, _needs_read(SYNC_GROUP, _sync_group)))
    table.add(Api(HEARTBEAT, 0, 4, _needs_read(HEARTBEAT, _heartbeat)))
    table.add(Api(LEAVE_GROUP, 0, 4, _needs_read(LEAVE_GROUP, _leave_group)))
    table.add(Api(OFFSET_COMMIT, 2, 8, _offset_commit))
    table.add(Api(OFFSET_FETCH, 1, 7, _offset_fetch))
    table.add(Api(LIST_GROUPS, 0, 4, _list_groups))
    table.add(Api(DESCRIBE_GROUPS, 0, 5, _describe_groups))
