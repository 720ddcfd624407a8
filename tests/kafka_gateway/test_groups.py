"""The group coordinator's state machine (pure logic on an event loop; no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from robustmq.kafka_gateway._groups import Coordinator, GroupSettings, State

SETTINGS = GroupSettings(initial_rebalance_delay_s=0.05, min_session_s=0.1, reap_interval_s=0.05)


def join(coordinator: Coordinator, member_id: str = "", *, rebalance_s: float = 5.0, **extra: Any) -> Any:
    return coordinator.join(
        "g",
        member_id=member_id,
        instance_id=None,
        client_id="c",
        client_host="h",
        session_s=extra.pop("session_s", 5.0),
        rebalance_s=rebalance_s,
        protocol_type="consumer",
        protocols=extra.pop("protocols", (("range", b"m"),)),
        require_known_id=extra.pop("require_known_id", False),
    )


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_members_started_together_form_one_generation_and_the_leader_assigns() -> None:
    async def test() -> None:
        coordinator = Coordinator(SETTINGS)
        a, b = await asyncio.gather(join(coordinator), join(coordinator))
        assert a.error == b.error == ErrorCode.none and a.generation == b.generation == 1
        leader, follower = (a, b) if a.member_id == a.leader else (b, a)
        assert len(leader.members) == 2 and follower.members == ()
        assignments = {leader.member_id: b"L", follower.member_id: b"F"}
        got = await asyncio.gather(
            coordinator.sync("g", follower.member_id, 1, {}),
            coordinator.sync("g", leader.member_id, 1, assignments),
        )
        assert got == [(ErrorCode.none, b"F"), (ErrorCode.none, b"L")]
        assert coordinator.groups["g"].state == State.STABLE
        assert coordinator.heartbeat("g", follower.member_id, 1) == ErrorCode.none

    run(test)


def test_commits_are_fenced_by_generation_across_a_rebalance() -> None:
    async def test() -> None:
        coordinator = Coordinator(SETTINGS)
        a, b = await asyncio.gather(join(coordinator, rebalance_s=0.5), join(coordinator, rebalance_s=0.5))
        leader, follower = (a, b) if a.member_id == a.leader else (b, a)
        await asyncio.gather(
            coordinator.sync("g", follower.member_id, 1, {}),
            coordinator.sync("g", leader.member_id, 1, {a.member_id: b"a", b.member_id: b"b"}),
        )
        # a newcomer starts a rebalance; until it completes, generation-1 members still commit
        newcomer = asyncio.ensure_future(join(coordinator, rebalance_s=0.5))
        await asyncio.sleep(0.01)
        assert coordinator.heartbeat("g", a.member_id, 1) == ErrorCode.rebalance_in_progress
        assert coordinator.may_commit("g", b.member_id, 1) == ErrorCode.none
        # a rejoins, b never does: b is removed when the rebalance times out
        again = await join(coordinator, a.member_id, rebalance_s=0.5)
        c = await newcomer
        assert again.generation == c.generation == 2
        assert set(coordinator.groups["g"].members) == {a.member_id, c.member_id}
        assert coordinator.may_commit("g", b.member_id, 1) == ErrorCode.unknown_member_id
        assert coordinator.may_commit("g", a.member_id, 1) == ErrorCode.illegal_generation
        assert coordinator.may_commit("g", a.member_id, 2) == ErrorCode.rebalance_in_progress  # awaiting sync
        assert coordinator.may_commit("g", "", -1) == ErrorCode.unknown_member_id  # members exist

    run(test)


def test_a_silent_member_is_removed_after_its_session_timeout() -> None:
    async def test() -> None:
        coordinator = Coordinator(SETTINGS)
        coordinator.start()
        try:
            a = await join(coordinator, session_s=0.2)
            await coordinator.sync("g", a.member_id, 1, {a.member_id: b"x"})
            for _ in range(200):
                await asyncio.sleep(0.02)
                if "g" not in coordinator.groups:
                    break
            assert "g" not in coordinator.groups  # an empty group is forgotten (offsets stay in Meta)
            assert coordinator.may_commit("g", "", -1) == ErrorCode.none
            assert coordinator.heartbeat("g", a.member_id, 1) == ErrorCode.unknown_member_id
        finally:
            await coordinator.stop()

    run(test)


def test_member_id_required_then_join_with_it() -> None:
    async def test() -> None:
        coordinator = Coordinator(SETTINGS)
        first = await join(coordinator, require_known_id=True)
        assert first.error == ErrorCode.member_id_required and first.member_id
        assert (
            await join(coordinator, "made-up", require_known_id=True)
        ).error == ErrorCode.unknown_member_id
        joined = await join(coordinator, first.member_id, require_known_id=True)
        assert joined.error == ErrorCode.none and joined.member_id == first.member_id == joined.leader

    run(test)


def test_bad_session_timeouts_and_protocols_are_refused() -> None:
    async def test() -> None:
        coordinator = Coordinator(SETTINGS)
        assert (await join(coordinator, session_s=0.01)).error == ErrorCode.invalid_session_timeout
        assert (await join(coordinator, protocols=())).error == ErrorCode.inconsistent_group_protocol
        await join(coordinator)
        other = await join(coordinator, protocols=(("roundrobin", b""),))
        assert other.error == ErrorCode.inconsistent_group_protocol

    run(test)
