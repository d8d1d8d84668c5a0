"""list_sessions_page: keyset pages across calls, bound to their listing, under concurrent writes."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

import cortex
from cortex import InvalidInput, ListFilter, SessionCursor, use_scope


async def _walk(store: cortex.Store, flt: ListFilter) -> list[str]:
    seen: list[str] = []
    cursor: SessionCursor | None = None
    while True:
        page = await store.list_sessions_page(flt, cursor=cursor)
        seen.extend(s.id for s in page.items)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


async def test_pages_follow_list_order_and_end(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for i in range(7):
            await store.create_session("bot", title=f"s{i}")
        listed = [s.id for s in await store.list_sessions(ListFilter(limit=100))]
        first = await store.list_sessions_page(ListFilter(limit=3))
        assert [s.id for s in first.items] == listed[:3]
        assert first.next_cursor is not None
        assert await _walk(store, ListFilter(limit=3)) == listed
        exact = await store.list_sessions_page(ListFilter(limit=7))
        assert exact.next_cursor is None  # no empty page after an exact fit


async def test_concurrent_creates_neither_skip_nor_repeat(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        before = {(await store.create_session("bot")).id for _ in range(60)}
    done = anyio.Event()
    created = 0

    async def creator() -> None:
        nonlocal created
        with use_scope(tenant):
            while not done.is_set():
                await store.create_session("bot")
                created += 1
                await anyio.sleep(0.001)

    seen: Counter[str] = Counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(creator)
        with use_scope(tenant):
            cursor = None
            while True:
                page = await store.list_sessions_page(ListFilter(limit=7), cursor=cursor)
                seen.update(s.id for s in page.items)
                await anyio.sleep(0.01)
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        done.set()
    assert created > 0
    assert [i for i, n in seen.items() if n > 1] == []
    assert before - set(seen) == set()


async def test_a_cursor_continues_its_own_listing_only(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for _ in range(3):
            await store.create_session("bot")
        page = await store.list_sessions_page(ListFilter(limit=1, agent_id="bot"))
        assert page.next_cursor is not None
        with pytest.raises(InvalidInput, match="cursor"):
            await store.list_sessions_page(ListFilter(limit=1), cursor=page.next_cursor)
        # The page size may change between pages.
        rest = await store.list_sessions_page(
            ListFilter(limit=5, agent_id="bot"), cursor=page.next_cursor
        )
        assert len(rest.items) == 2
    with use_scope(f"{tenant}/sub"), pytest.raises(InvalidInput, match="cursor"):
        await store.list_sessions_page(ListFilter(limit=1, agent_id="bot"), cursor=page.next_cursor)


async def test_pages_keep_tenants_apart(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    with use_scope(other_tenant):
        await store.create_session("bot")
    with use_scope(tenant):
        await store.create_session("bot")
        page = await store.list_sessions_page()
    assert [str(s.scope) for s in page.items] == [tenant]
