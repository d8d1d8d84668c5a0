"""Concurrency invariants, each proven with real concurrent transactions.

Every call commits for real on its own pooled connection: a rolled-back outer
transaction would hide a missing lock or tenant binding.
"""

from __future__ import annotations

import random

import anyio
import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from tests.factories import agent

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20, pytest.mark.reliability]


async def _invariants(owner_conn: asyncpg.Connection, tenant: str) -> None:
    """Counters equal rows, seq is 1..n without gaps, at most one default per (agent, scope)."""
    bad_counts = await owner_conn.fetch(
        """
        SELECT s.id, s.message_count, count(m.id) AS rows,
               coalesce(max(m.seq), 0) AS max_seq, count(DISTINCT m.seq) AS distinct_seq
        FROM sessions s LEFT JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id
        WHERE s.tenant_id = $1
        GROUP BY s.id, s.message_count
        HAVING s.message_count <> count(m.id)
            OR coalesce(max(m.seq), 0) <> count(m.id)
            OR count(DISTINCT m.seq) <> count(m.id)
        """,
        tenant,
    )
    assert bad_counts == []
    doubles = await owner_conn.fetch(
        "SELECT agent_id, scope FROM sessions WHERE tenant_id = $1 AND is_default "
        "GROUP BY agent_id, scope HAVING count(*) > 1",
        tenant,
    )
    assert doubles == []


async def test_hot_session_appends_gap_free(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        seqs: list[int] = []

        async def writer(w: int) -> None:
            for i in range(10):
                batch = [NewMessage("user", f"{w}-{i}-{k}") for k in range(random.randint(1, 3))]
                stored = await store.append_messages(s.id, batch)
                seqs.extend(m.seq for m in stored)

        async with anyio.create_task_group() as tg:
            for w in range(16):
                tg.start_soon(writer, w)
        got = await store.get_session(s.id)
    assert sorted(seqs) == list(range(1, len(seqs) + 1))
    assert got.message_count == len(seqs)
    await _invariants(owner_conn, tenant)


async def test_spread_appends_across_sessions(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{tenant}/p"):
        sessions = [await store.create_session("bot") for _ in range(8)]

        async def writer() -> None:
            for _ in range(15):
                await store.append_message(random.choice(sessions).id, NewMessage("user", "x"))

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(writer)
        total = sum(x.message_count for x in await store.list_sessions())
    assert total == 12 * 15
    await _invariants(owner_conn, tenant)


async def test_fifty_concurrent_resolves_one_default(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    bots = [agent() for _ in range(3)]
    got: dict[str, set[str]] = {b: set() for b in bots}

    async def resolver(bot: str) -> None:
        with use_scope(f"{tenant}/u"):
            got[bot].add((await store.resolve_session(bot)).id)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(resolver, bots[i % 3])
    assert all(len(ids) == 1 for ids in got.values())
    n = await owner_conn.fetchval(
        "SELECT count(*) FROM sessions WHERE tenant_id = $1 AND is_default", tenant
    )
    assert n == 3
    await _invariants(owner_conn, tenant)


async def test_set_default_atomic_for_readers(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """While defaults switch back and forth, every reader sees exactly one."""
    bot = agent()
    with use_scope(f"{tenant}/u"):
        candidates = [await store.resolve_session(bot)] + [
            await store.create_session(bot) for _ in range(3)
        ]
        seen: list[int] = []
        done = anyio.Event()

        async def switcher() -> None:
            for _ in range(40):
                await store.set_default_session(random.choice(candidates).id)
            done.set()

        async def reader() -> None:
            while not done.is_set():
                seen.append(await store.count_sessions(ListFilter(default_only=True, agent_id=bot)))

        async def resolver() -> None:
            while not done.is_set():
                assert (await store.resolve_session(bot)).is_default

        async with anyio.create_task_group() as tg:
            tg.start_soon(switcher)
            tg.start_soon(switcher)
            tg.start_soon(reader)
            tg.start_soon(reader)
            tg.start_soon(resolver)
    assert seen
    assert set(seen) == {1}
    await _invariants(owner_conn, tenant)


async def test_resolve_races_set_default_and_delete(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """Resolving while the default is deleted and switched never yields two or an error."""
    bot = agent()
    with use_scope(f"{tenant}/u"):

        async def churn() -> None:
            for _ in range(15):
                current = await store.resolve_session(bot)
                spare = await store.create_session(bot)
                await store.set_default_session(spare.id)
                await store.delete_session(spare.id)
                await store.delete_session(current.id)

        async def resolver() -> None:
            for _ in range(40):
                assert (await store.resolve_session(bot)).is_default

        async with anyio.create_task_group() as tg:
            tg.start_soon(churn)
            for _ in range(4):
                tg.start_soon(resolver)
    await _invariants(owner_conn, tenant)
