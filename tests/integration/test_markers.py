"""Interrupt markers across scopes and under races with create and delete.

Every write commits for real, on separate connections, as the application role.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Coroutine
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import Conflict, NotFound, SessionState, use_scope
from cortex.ids import format_id, new_uuid
from tests.figures import record

pytestmark = pytest.mark.reliability


def _fresh_id() -> str:
    return format_id("ses", new_uuid())


async def _marker_rows(owner: asyncpg.Connection, tenant: str, sid: str) -> list[asyncpg.Record]:
    from cortex.ids import parse_id

    return await owner.fetch(
        "SELECT scope, reason FROM session_markers WHERE tenant_id = $1 AND session_id = $2",
        tenant,
        parse_id("ses", sid),
    )


async def test_a_sibling_scope_cannot_mark_or_clear_a_session(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{tenant}/user-2"):
        owned = await store.create_session("bot")
        await store.mark_interrupted(owned.id, "owner's drain")
    with use_scope(f"{tenant}/user-1"):
        with pytest.raises(NotFound):
            await store.mark_interrupted(owned.id, "sibling's reason")
        with pytest.raises(NotFound):
            await store.clear_interrupted(owned.id)
    with use_scope(f"{tenant}/user-2"):
        detail = await store.inspect_session(owned.id)
        assert detail.state is SessionState.INTERRUPTED
        assert detail.interrupt_reason == "owner's drain"
    assert [tuple(r) for r in await _marker_rows(owner_conn, tenant, owned.id)] == [
        (f"{tenant}/user-2", "owner's drain")
    ]
    # The scope above sees the session, so it may act on it.
    with use_scope(tenant):
        await store.mark_interrupted(owned.id, "operator")
        assert (await store.inspect_session(owned.id)).interrupt_reason == "operator"
        await store.clear_interrupted(owned.id)
        assert (await store.get_session(owned.id)).state is SessionState.IDLE
    record("isolation attacks: marker writes from a sibling scope", 2)


async def test_a_sibling_scope_cannot_replace_a_parked_marker(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    sid = _fresh_id()
    with use_scope(f"{tenant}/user-1"):
        await store.mark_interrupted(sid, "parked by user-1")
    with use_scope(f"{tenant}/user-2"):
        with pytest.raises(Conflict):
            await store.mark_interrupted(sid, "parked by user-2")
        await store.clear_interrupted(sid)  # sees no marker of its own: a no-op
    assert [tuple(r) for r in await _marker_rows(owner_conn, tenant, sid)] == [
        (f"{tenant}/user-1", "parked by user-1")
    ]
    with use_scope(f"{tenant}/user-1"):
        created = await store.create_session("bot", session_id=sid)
        assert created.state is SessionState.INTERRUPTED
    record("isolation attacks: marker writes from a sibling scope", 2)


async def _after(delay: float, call: Coroutine[Any, Any, object]) -> None:
    await anyio.sleep(delay)
    # NotFound: mark_interrupted lost the race to delete_session; nothing written.
    with contextlib.suppress(NotFound):
        await call


@pytest.mark.slow
async def test_a_marker_racing_delete_never_outlives_its_session(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    # The marker is set from the scope *above* the session: were it to park
    # (the delete committed first), it parks there and can never show on a
    # session re-created below. A marker left at the session's own scope is
    # exactly the orphan this test hunts.
    rounds = 40
    for _ in range(rounds):
        sid = _fresh_id()
        with use_scope(f"{tenant}/u"):
            await store.create_session("bot", session_id=sid)
        with use_scope(tenant):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_after, random.uniform(0, 0.002), store.mark_interrupted(sid, "r"))
                tg.start_soon(_after, random.uniform(0, 0.002), store.delete_session(sid))
        orphans = [r for r in await _marker_rows(owner_conn, tenant, sid) if r["scope"] != tenant]
        assert orphans == []
        with use_scope(f"{tenant}/u"):
            again = await store.create_session("bot", session_id=sid)
            assert again.state is SessionState.IDLE
    record("races: mark_interrupted against delete_session", rounds)


@pytest.mark.slow
async def test_a_marker_racing_create_always_shows(store: cortex.Store, tenant: str) -> None:
    rounds = 60
    for _ in range(rounds):
        sid = _fresh_id()
        with use_scope(f"{tenant}/u"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_after, random.uniform(0, 0.002), store.mark_interrupted(sid, "r"))
                tg.start_soon(
                    _after, random.uniform(0, 0.002), store.create_session("bot", session_id=sid)
                )
            detail = await store.inspect_session(sid)
            assert detail.state is SessionState.INTERRUPTED
            assert detail.interrupt_reason == "r"
    record("races: mark_interrupted against create_session", rounds)
