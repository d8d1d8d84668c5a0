"""iter_sessions yields every session that matched, exactly once, while others append."""

from __future__ import annotations

import gc
import random
from collections import Counter

import anyio
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from tests.figures import record

SESSIONS = 921


async def test_walk_under_concurrent_appends_yields_each_session_once(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        ids = [
            s.id
            for s in await anyio_gather(
                [lambda: store.create_session("bot") for _ in range(SESSIONS)]
            )
        ]
    seen: Counter[str] = Counter()
    appended = 0
    done = anyio.Event()

    async def appender() -> None:
        nonlocal appended
        with use_scope(tenant):
            while not done.is_set():
                await store.append_messages(random.choice(ids), [NewMessage("user", "moving")])
                appended += 1

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(appender)
        with use_scope(tenant):
            async for session in store.iter_sessions(ListFilter(limit=25)):
                seen[session.id] += 1
                await anyio.sleep(0.0005)
        done.set()
    record("iteration under appends: sessions walked", len(seen))
    record("iteration under appends: concurrent appends", appended)
    assert appended > 0
    assert not [i for i, n in seen.items() if n > 1], "yielded twice"
    assert set(ids) - set(seen) == set(), f"{len(set(ids) - set(seen))} never yielded"


async def test_walk_is_a_snapshot_and_closing_it_returns_the_connection(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        first = await store.create_session("bot")
        await store.create_session("bot")
        walk = store.iter_sessions(ListFilter(limit=1))
        got = [await anext(walk)]
        late = await store.create_session("bot")  # created after the walk began
        await store.delete_session(first.id)  # deleted after the walk began
        got += [s async for s in walk]
        assert late.id not in {s.id for s in got}
        assert len(got) == 2
        walk = store.iter_sessions(ListFilter(limit=1))
        await anext(walk)
        await walk.aclose()  # closing early ends the snapshot transaction
    pool = store.engine.pool
    assert pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_an_abandoned_walk_returns_its_connection_when_collected(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        await store.create_session("bot")
        await store.create_session("bot")
        walk = store.iter_sessions(ListFilter(limit=1))
        await anext(walk)
    pool = store.engine.pool
    assert pool.checkedout() == 1  # type: ignore[attr-defined]
    del walk
    gc.collect()
    # asyncio closes a collected async generator on the loop (sys.set_asyncgen_hooks).
    for _ in range(100):
        if pool.checkedout() == 0:  # type: ignore[attr-defined]
            break
        await anyio.sleep(0.01)
    assert pool.checkedout() == 0  # type: ignore[attr-defined]


async def anyio_gather(calls: list[object]) -> list[cortex.Session]:
    results: list[cortex.Session] = []

    async def one(call: object) -> None:
        results.append(await call())  # type: ignore[operator]

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call)
    return results


pytestmark = [pytest.mark.filterwarnings("error"), pytest.mark.reliability]
