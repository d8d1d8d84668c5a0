from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import (
    Conflict,
    FunctionResponse,
    InvalidInput,
    NewMessage,
    NotFound,
    RequestedInput,
    use_scope,
)
from cortex.ids import format_id, new_uuid
from cortex.models import PREVIEW_LENGTH
from tests.conftest import Database

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20]


async def test_append_and_read(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        first = await store.append_messages(
            s.id,
            [
                NewMessage("user", "question", author="ann", metadata={"lang": "en"}),
                NewMessage(
                    "assistant",
                    "need input",
                    requested_input=RequestedInput(
                        interrupt_id="i1",
                        message="Approve?",
                        response_schema={
                            "type": "object",
                            "properties": {"ok": {"type": "boolean"}},
                        },
                        payload={"amount": 10},
                    ),
                ),
            ],
        )
        assert [m.seq for m in first] == [1, 2]
        one = await store.append_message(
            s.id,
            NewMessage(
                "tool",
                "",
                function_response=FunctionResponse(id="i1", name="approve", response={"ok": True}),
            ),
        )
        assert one.seq == 3
        got = await store.get_session(s.id)
        assert got.message_count == 3
        assert got.last_message == ""
        assert got.updated_at >= s.updated_at
        listed = await store.list_messages(s.id)
    assert [m.id for m in listed] == [m.id for m in [*first, one]]
    assert listed[0].author == "ann"
    assert listed[0].metadata == {"lang": "en"}
    assert listed[1].requested_input is not None
    assert listed[1].requested_input.payload == {"amount": 10}
    assert listed[1].requested_input.response_schema is not None
    assert listed[2].function_response is not None
    assert listed[2].function_response.response == {"ok": True}
    assert all(m.session_id == s.id and m.id.startswith("msg_") for m in listed)


async def test_preview_and_paging(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        for i in range(1, 8):
            await store.append_message(s.id, NewMessage("user", f"m{i}" + "x" * 1000))
        got = await store.get_session(s.id)
        assert got.last_message == ("m7" + "x" * 1000)[:PREVIEW_LENGTH]
        page1 = await store.list_messages(s.id, limit=3)
        page2 = await store.list_messages(s.id, after_seq=page1[-1].seq, limit=3)
        page3 = await store.list_messages(s.id, after_seq=page2[-1].seq, limit=3)
        assert [m.seq for m in page1 + page2 + page3] == list(range(1, 8))
        assert await store.list_messages(s.id, after_seq=7) == []


async def test_updated_at_moves_and_reorders_listing(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        old = await store.create_session("bot")
        new = await store.create_session("bot")
        assert [x.id for x in await store.list_sessions()] == [new.id, old.id]
        await store.append_message(old.id, NewMessage("user", "bump"))
        assert [x.id for x in await store.list_sessions()] == [old.id, new.id]


async def test_not_visible_session(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/a"):
        s = await store.create_session("bot")
    with use_scope(f"{tenant}/b"):
        with pytest.raises(NotFound):
            await store.append_message(s.id, NewMessage("user", "x"))
        with pytest.raises(NotFound):
            await store.list_messages(s.id)
    with use_scope(tenant), pytest.raises(NotFound):
        await store.list_messages(format_id("ses", new_uuid()))


async def test_all_or_nothing_and_limits(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        with pytest.raises(InvalidInput):
            await store.append_messages(s.id, [])
        with pytest.raises(InvalidInput):
            await store.append_messages(s.id, [NewMessage("user", "ok")] * 1001)
        with pytest.raises(InvalidInput):
            await store.append_messages(
                s.id,
                [NewMessage("user", "ok"), NewMessage.model_construct(role="user", content="\x00")],
            )
        with pytest.raises(InvalidInput):
            await store.append_messages(s.id, ["not a message"])  # type: ignore[list-item]  # proving the refusal
        with pytest.raises(InvalidInput):
            await store.list_messages(s.id, limit=-1)
        with pytest.raises(InvalidInput):
            await store.list_messages(s.id, limit=1001)
        with pytest.raises(InvalidInput):
            await store.list_messages(s.id, after_seq=-1)
        assert (await store.get_session(s.id)).message_count == 0
    assert (
        await owner_conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant) == 0
    )


async def test_big_batch_in_one_statement(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        stored = await store.append_messages(
            s.id, [NewMessage("user", str(i)) for i in range(1000)]
        )
    assert [m.seq for m in stored] == list(range(1, 1001))
    assert [m.content for m in stored] == [str(i) for i in range(1000)]
    count = await owner_conn.fetchval(
        "SELECT message_count FROM sessions WHERE tenant_id = $1", tenant
    )
    assert count == 1000


# --- a keyed append replayed: its state deltas are part of the key ---------------


@asynccontextmanager
async def _appender(
    store: cortex.Store, database: Database, routed: bool
) -> AsyncIterator[cortex.Store]:
    """The store, or on plain PostgreSQL one sending the statements it sends on Citus."""
    if not routed:
        yield store
        return
    if store.distributed:
        pytest.skip("the store sends the router forms already")
    async with cortex.connect(database.app_url) as router:
        router._distributed = True
        yield router


def _keyed(n: int) -> list[NewMessage]:
    return [NewMessage("user", f"m{i}", id=format_id("msg", new_uuid())) for i in range(n)]


async def _state(store: cortex.Store, session_id: str, tenant: str) -> tuple[int, Any, Any]:
    got = await store.get_session(session_id)
    return got.message_count, got.data, await store.get_scope_data(tenant)


@pytest.mark.anyio
@pytest.mark.parametrize("routed", [False, True], ids=["store", "router forms"])
@pytest.mark.parametrize("size", [1, 3])
async def test_a_replay_with_the_same_deltas_returns_the_append_and_writes_nothing(
    store: cortex.Store, database: Database, tenant: str, size: int, routed: bool
) -> None:
    async with _appender(store, database, routed) as appender:
        await _replay_with_the_same_deltas(appender, tenant, size)


async def _replay_with_the_same_deltas(appender: cortex.Store, tenant: str, size: int) -> None:
    with use_scope(f"{tenant}/team"):
        session = await appender.create_session("bot")
        batch = _keyed(size)
        first = await appender.append_messages(
            session.id, batch, data={"a": 1, "b": [1]}, scope_data={tenant: {"s": 1}}
        )
        # Later appends move the state on; the replay must not move it back.
        await appender.append_messages(
            session.id, [NewMessage("user", "later")], data={"a": 2}, scope_data={tenant: {"s": 2}}
        )
        before = await _state(appender, session.id, tenant)
        # The same deltas, their keys given in another order.
        again = await appender.append_messages(
            session.id, batch, data={"b": [1], "a": 1}, scope_data={tenant: {"s": 1}}
        )
        assert again == first
        assert (
            await _state(appender, session.id, tenant)
            == before
            == (
                size + 1,
                {"s": 2, "a": 2, "b": [1]},
                {"s": 2},
            )
        )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("original", "replayed"),
    [
        ({"data": {"a": 1}}, {"data": {"a": 2}}),
        ({"data": {"a": 1}}, {}),
        ({}, {"data": {"a": 1}}),
        ({"scope_data": "s1"}, {"scope_data": "s2"}),
        ({"scope_data": "s1"}, {}),
        ({}, {"scope_data": "s1"}),
        ({"data": {"a": 1}, "scope_data": "s1"}, {"data": {"a": 1}, "scope_data": "team"}),
    ],
)
@pytest.mark.parametrize("routed", [False, True], ids=["store", "router forms"])
@pytest.mark.parametrize("size", [1, 3])
async def test_a_replay_with_other_deltas_is_a_conflict_and_writes_nothing(
    store: cortex.Store,
    database: Database,
    tenant: str,
    size: int,
    routed: bool,
    original: dict[str, Any],
    replayed: dict[str, Any],
) -> None:
    def deltas(call: dict[str, Any]) -> dict[str, Any]:
        out = dict(call)
        if out.get("scope_data") == "team":
            out["scope_data"] = {f"{tenant}/team": {"s": 1}}
        elif "scope_data" in out:
            out["scope_data"] = {tenant: {"s": out["scope_data"]}}
        return out

    async with _appender(store, database, routed) as appender:
        with use_scope(f"{tenant}/team"):
            session = await appender.create_session("bot")
            batch = _keyed(size)
            await appender.append_messages(session.id, batch, **deltas(original))
            before = await _state(appender, session.id, tenant)
            with pytest.raises(Conflict, match="state"):
                await appender.append_messages(session.id, batch, **deltas(replayed))
            assert await _state(appender, session.id, tenant) == before
