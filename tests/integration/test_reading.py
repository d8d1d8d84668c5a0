"""Reading a conversation back: the newest N in order, paging backwards, session with history."""

from __future__ import annotations

import anyio
import pytest

import cortex
from cortex import NewMessage, use_scope


async def _conversation(store: cortex.Store, n: int) -> str:
    session = await store.create_session("bot")
    await store.append_messages(session.id, [NewMessage("user", f"m{i}") for i in range(1, n + 1)])
    return session.id


async def test_newest_n_in_order_and_paging_backwards(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 7)
        newest = await store.recent_messages(sid, limit=3)
        assert [m.content for m in newest] == ["m5", "m6", "m7"]
        older = await store.recent_messages(sid, limit=3, before_seq=newest[0].seq)
        assert [m.seq for m in older] == [2, 3, 4]
        oldest = await store.recent_messages(sid, limit=3, before_seq=older[0].seq)
        assert [m.seq for m in oldest] == [1]
        assert await store.recent_messages(sid, before_seq=1) == []
        everything = await store.recent_messages(sid)  # default limit covers all 7
        assert [m.seq for m in everything] == list(range(1, 8))


async def test_walking_back_sees_every_message_once(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 25)
        seen: list[int] = []
        before: int | None = None
        while page := await store.recent_messages(sid, limit=4, before_seq=before):
            seen = [m.seq for m in page] + seen
            before = page[0].seq
    assert seen == list(range(1, 26))


async def test_empty_session_and_invisible_session(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    with use_scope(tenant):
        empty = await store.create_session("bot")
        assert await store.recent_messages(empty.id) == []
        session, history = await store.get_session_with_messages(empty.id)
        assert session.id == empty.id
        assert history == []
        sid = await _conversation(store, 2)
    with use_scope(other_tenant):
        with pytest.raises(cortex.NotFound):
            await store.recent_messages(sid)
        with pytest.raises(cortex.NotFound):
            await store.get_session_with_messages(sid)


_BAD: list[dict[str, object]] = [
    {"limit": 0},
    {"limit": 1001},
    {"limit": True},
    {"before_seq": 0},
    {"before_seq": -1},
    {"before_seq": 2**31},
    {"before_seq": "5"},
]


async def test_bad_arguments_are_invalid_input(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 1)
        for bad in _BAD:
            with pytest.raises(cortex.InvalidInput):
                await store.recent_messages(sid, **bad)  # type: ignore[arg-type]  # deliberately wrong
            if "limit" in bad:
                with pytest.raises(cortex.InvalidInput):
                    await store.get_session_with_messages(sid, **bad)  # type: ignore[arg-type]  # deliberately wrong


async def test_session_with_messages_is_one_consistent_read(
    store: cortex.Store, tenant: str
) -> None:
    """The counter and the messages come from one snapshot, even under concurrent appends."""
    with use_scope(tenant):
        sid = await _conversation(store, 3)
        session, history = await store.get_session_with_messages(sid, limit=2)
        assert session.message_count == 3
        assert [m.content for m in history] == ["m2", "m3"]
        assert session.last_message == "m3"

        mismatches = 0

        async def writer() -> None:
            for i in range(30):
                await store.append_message(sid, NewMessage("user", f"w{i}"))

        async def reader() -> None:
            nonlocal mismatches
            for _ in range(30):
                s, h = await store.get_session_with_messages(sid, limit=1)
                mismatches += h[-1].seq != s.message_count

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            tg.start_soon(reader)
    assert mismatches == 0
