from __future__ import annotations

import asyncpg
import pytest

import cortex
from cortex import (
    FunctionResponse,
    InvalidInput,
    NewMessage,
    NotFound,
    RequestedInput,
    use_scope,
)
from cortex.ids import format_id, new_uuid
from cortex.models import PREVIEW_LENGTH


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
            await store.list_messages(s.id, limit=0)
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
