"""What the agent-framework adapters stand on: keys, payloads, state, pop and clear.

Every test runs on a real PostgreSQL as the application role (row-level
security applies); concurrency tests commit on separate connections.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope
from cortex._db.transaction import begin_sql
from cortex.ids import MESSAGE_PREFIX, format_id
from cortex.models import FunctionResponse, RequestedInput
from tests.conftest import Database, asyncpg_dsn

pytestmark = pytest.mark.citus

# --- keys ------------------------------------------------------------------------


async def test_key_is_trimmed_and_found_again(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        created = await store.create_session("bot", key="  order-42\n")
        assert created.key == "order-42"
        assert (await store.get_session_by_key("bot", "order-42")).id == created.id
        assert (await store.get_session_by_key("bot", " order-42 ")).id == created.id
        assert (await store.resolve_session("bot", key="order-42\t")).id == created.id
        assert (await store.get_session(created.id)).key == "order-42"


async def test_key_unique_per_agent_and_exact_scope(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        first = await store.create_session("bot", key="k")
        with pytest.raises(cortex.Conflict, match="keyed 'k'"):
            await store.create_session("bot", key=" k ")
        other_agent = await store.create_session("other", key="k")
        case = await store.create_session("bot", key="K")
    with use_scope(f"{tenant}/child"):
        child = await store.create_session("bot", key="k")
        with pytest.raises(cortex.NotFound):  # exact scope: the parent's is not this one
            await store.get_session_by_key("other", "k")
    assert len({first.id, other_agent.id, case.id, child.id}) == 4


async def test_bad_keys_are_refused(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for bad_key in ["", "   ", "a\x00b", "x" * 513]:
            with pytest.raises(cortex.InvalidInput, match="key"):
                await store.create_session("bot", key=bad_key)
            with pytest.raises(cortex.InvalidInput, match="key"):
                await store.resolve_session("bot", key=bad_key)
            with pytest.raises(cortex.InvalidInput, match="key"):
                await store.get_session_by_key("bot", bad_key)
        assert await store.count_sessions() == 0
    with use_scope(tenant):
        longest = await store.create_session("bot", key="x" * 512)
        assert longest.key == "x" * 512


async def test_concurrent_first_resolves_share_one_session(
    store: cortex.Store, tenant: str
) -> None:
    ids: list[str] = []

    async def resolve() -> None:
        with use_scope(tenant):
            ids.append((await store.resolve_session("bot", key="first")).id)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(resolve)
    assert len(set(ids)) == 1
    with use_scope(tenant):
        assert await store.count_sessions() == 1


async def test_resolve_refuses_id_and_key(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", key="k")
        with pytest.raises(cortex.InvalidInput, match="not both"):
            await store.resolve_session("bot", session.id, key="k")


# --- payloads ----------------------------------------------------------------------


async def test_payload_round_trips_exactly(store: cortex.Store, tenant: str) -> None:
    payload: dict[str, Any] = {
        "floats": [1e16, -0.0, 5e-324, 0.1],
        "text": "café \u2028 \\u0000",
        "nested": {"deep": [{"a": None, "b": True}]},
        "big": "x" * 200_000,  # well past metadata's 64 KiB
    }
    with use_scope(tenant):
        session = await store.create_session("bot")
        (appended,) = await store.append_messages(
            session.id, [NewMessage("assistant", "hello", payload=payload)]
        )
        assert appended.payload == payload
        (read,) = await store.recent_messages(session.id)
        assert read.payload == payload
        assert repr(read.payload["floats"]) == repr(payload["floats"])
        assert read.content == "hello"
        assert read.role == "assistant"
        plain = await store.append_message(session.id, NewMessage("user", "no payload"))
        assert plain.payload is None


async def test_a_payload_is_encoded_once_by_the_append(
    store: cortex.Store, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boundary's check of a payload and its storage share one ``json.dumps``.

    The message is built (and its payload checked) before the count starts;
    re-validated at the boundary, it is encoded once more, and the stored
    text is that one. A payload changed in place after it was built is
    stored as it is at the call.
    """
    import json

    payload: dict[str, Any] = {"parts": [{"text": "x" * 50_000}], "n": 1}
    message = NewMessage("assistant", "hi", payload=payload)
    payload["n"] = 2  # behind the model's back: the boundary checks it again
    dumps = json.dumps
    calls: list[int] = []

    def counted(value: Any, **kwargs: Any) -> str:
        calls.append(len(str(value)))
        text: str = dumps(value, **kwargs)
        return text

    with use_scope(tenant):
        session = await store.create_session("bot")
        monkeypatch.setattr(json, "dumps", counted)  # the module cortex._validate encodes with
        stored = await store.append_message(session.id, message)
        monkeypatch.undo()
        (read,) = await store.recent_messages(session.id)
    assert len(calls) == 1
    assert stored.payload == read.payload == {"parts": [{"text": "x" * 50_000}], "n": 2}


async def test_payload_limits(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        with pytest.raises(cortex.InvalidInput, match="payload"):
            NewMessage("user", payload="x" * (16 * 1024 * 1024))
        with pytest.raises(cortex.InvalidInput, match="payload"):
            NewMessage("user", payload={"bad": float("nan")})
        # Four payloads of 15 MiB and 5 contents of 1 MiB exceed the 64 MiB batch.
        big = "y" * (15 * 1024 * 1024)
        batch = [NewMessage("user", payload=big) for _ in range(4)]
        batch += [NewMessage("user", "z" * (1024 * 1024)) for _ in range(5)]
        with pytest.raises(cortex.InvalidInput, match="bytes in one append"):
            await store.append_messages(session.id, batch)
        assert (await store.get_session(session.id)).message_count == 0


async def test_retry_with_other_payload_is_a_conflict(store: cortex.Store, tenant: str) -> None:
    mid = format_id(MESSAGE_PREFIX, uuid.uuid4())
    with use_scope(tenant):
        session = await store.create_session("bot")
        first = await store.append_message(session.id, NewMessage("user", id=mid, payload=[1]))
        again = await store.append_message(session.id, NewMessage("user", id=mid, payload=[1]))
        assert again.seq == first.seq
        with pytest.raises(cortex.Conflict):
            await store.append_message(session.id, NewMessage("user", id=mid, payload=[2]))
        assert (await store.get_session(session.id)).message_count == 1


# --- reading after a timestamp ---------------------------------------------------------


async def test_messages_after_a_timestamp(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        early = await store.append_messages(session.id, [NewMessage("user", "a")])
        late = await store.append_messages(
            session.id, [NewMessage("user", "b"), NewMessage("user", "c")]
        )
        after = await store.list_messages(session.id, since=early[0].created_at)
        assert [m.content for m in after] == ["b", "c"]
        assert await store.list_messages(session.id, since=late[-1].created_at) == []
        before_all = datetime(2000, 1, 1, tzinfo=UTC)
        assert len(await store.list_messages(session.id, since=before_all)) == 3
        with pytest.raises(cortex.InvalidInput, match="since"):
            await store.list_messages(session.id, since=datetime(2000, 1, 1))  # noqa: DTZ001


# --- pop and clear ----------------------------------------------------------------------


async def test_pop_returns_the_last_and_keeps_counters(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        assert await store.pop_message(session.id) is None
        await store.append_messages(
            session.id, [NewMessage("user", "one"), NewMessage("assistant", "two")]
        )
        popped = await store.pop_message(session.id)
        assert popped is not None
        assert (popped.content, popped.seq) == ("two", 2)
        after = await store.get_session(session.id)
        assert (after.message_count, after.last_message) == (1, "one")
        assert after.updated_at >= popped.created_at
        again = await store.append_message(session.id, NewMessage("user", "three"))
        assert again.seq == 2  # gap-free: the popped seq is reused
        assert [m.content for m in await store.recent_messages(session.id)] == ["one", "three"]
        await store.pop_message(session.id)
        await store.pop_message(session.id)
        emptied = await store.get_session(session.id)
        assert (emptied.message_count, emptied.last_message) == (0, "")


async def test_concurrent_pops_take_each_message_once(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        await store.append_messages(session.id, [NewMessage("user", f"m{i}") for i in range(10)])
    popped: list[str | None] = []

    async def pop() -> None:
        with use_scope(tenant):
            message = await store.pop_message(session.id)
            popped.append(None if message is None else message.content)

    async with anyio.create_task_group() as tg:
        for _ in range(14):
            tg.start_soon(pop)
    contents = [c for c in popped if c is not None]
    assert sorted(contents) == sorted(f"m{i}" for i in range(10))
    assert popped.count(None) == 4
    with use_scope(tenant):
        assert (await store.get_session(session.id)).message_count == 0


async def test_pop_keeps_pending_inputs_true(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        ask = NewMessage("assistant", "ok?", requested_input=RequestedInput(interrupt_id="q1"))
        await store.append_message(session.id, ask)
        await store.append_message(
            session.id, NewMessage("user", function_response=FunctionResponse(id="q1"))
        )
        assert (await store.get_session(session.id)).state is cortex.SessionState.IDLE
        await store.pop_message(session.id)  # the answer: the question is open again
        detail = await store.inspect_session(session.id)
        assert detail.state is cortex.SessionState.PAUSED
        assert [p.interrupt_id for p in detail.pending] == ["q1"]
        await store.pop_message(session.id)  # the question itself
        detail = await store.inspect_session(session.id)
        assert (detail.state, detail.pending, detail.session.pending_count) == (
            cortex.SessionState.IDLE,
            [],
            0,
        )


async def test_clear_resets_counters_and_keeps_state(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", data={"k": 1})
        ask = NewMessage("assistant", "?", requested_input=RequestedInput(interrupt_id="q"))
        await store.append_messages(session.id, [NewMessage("user", "a"), ask])
        cleared = await store.clear_messages(session.id)
        assert (cleared.message_count, cleared.pending_count, cleared.last_message) == (0, 0, "")
        assert cleared.state is cortex.SessionState.IDLE
        assert cleared.data == {"k": 1}
        assert await store.recent_messages(session.id) == []
        fresh = await store.append_message(session.id, NewMessage("user", "again"))
        assert fresh.seq == 1
    with use_scope(f"t{uuid.uuid4().hex[:12]}"), pytest.raises(cortex.NotFound):
        await store.clear_messages(session.id)


# --- state ------------------------------------------------------------------------------


async def test_state_merges_outer_first_session_last(store: cortex.Store, tenant: str) -> None:
    app, user = f"{tenant}/app", f"{tenant}/app/u1"
    with use_scope(user):
        session = await store.create_session(
            "bot",
            data={"shared": "session", "s": 1},
            scope_data={
                tenant: {"shared": "tenant", "t": 1},
                app: {"shared": "app", "a": 1},
                user: {"shared": "user", "u": 1},
            },
        )
        assert session.data == {"shared": "session", "s": 1, "t": 1, "a": 1, "u": 1}
    with use_scope(f"{tenant}/app/u2"):
        sibling = await store.create_session("bot")
        assert sibling.data == {"shared": "app", "t": 1, "a": 1}
        assert await store.get_scope_data(app) == {"shared": "app", "a": 1}
        with pytest.raises(cortex.InvalidInput, match="neither above nor beneath"):
            await store.get_scope_data(user)


async def test_delta_replaces_values_and_stores_null(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", data={"profile": {"a": 1, "b": 2}, "f": True})
        await store.append_messages(
            session.id,
            [NewMessage("user", "x")],
            data={"profile": {"a": 3}, "f": None, "n": 1e16},
        )
        got = await store.get_session(session.id)
        assert got.data == {"profile": {"a": 3}, "f": None, "n": 1e16}
        assert isinstance(got.data["n"], float)


async def test_a_refused_delta_writes_nothing(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/a"):
        session = await store.create_session("bot", data={"k": 0})
    with use_scope(tenant):
        with pytest.raises(cortex.InvalidInput, match="not the session's scope"):
            await store.append_messages(
                session.id,
                [NewMessage("user", "x")],
                data={"k": 1},
                scope_data={f"{tenant}/b": {"k": 1}},
            )
        with pytest.raises(cortex.InvalidInput, match="1048576"):
            await store.append_messages(
                session.id,
                [NewMessage("user", "x")],
                data={f"k{i}": "v" * 60_000 for i in range(20)},
            )
        with pytest.raises(cortex.InvalidInput):
            await store.append_messages(
                session.id, [NewMessage("user", "x")], data={"bad": object()}
            )
        after = await store.get_session(session.id)
        assert (after.message_count, after.data) == (0, {"k": 0})
        assert await store.get_scope_data(f"{tenant}/b") == {}


async def test_documents_cannot_grow_past_the_limit(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        for i in range(3):
            await store.append_messages(
                session.id, [NewMessage("user", "x")], data={f"k{i}": "v" * 300_000}
            )
        with pytest.raises(cortex.InvalidInput, match="at most 1048576 bytes"):
            await store.append_messages(
                session.id, [NewMessage("user", "x")], data={"k3": "v" * 300_000}
            )
        for i in range(3):
            await store.append_messages(
                session.id, [NewMessage("user", "y")], scope_data={tenant: {f"s{i}": "w" * 300_000}}
            )
        with pytest.raises(cortex.InvalidInput, match="at most 1048576 bytes"):
            await store.append_messages(
                session.id, [NewMessage("user", "y")], scope_data={tenant: {"s3": "w" * 300_000}}
            )
        assert (await store.get_session(session.id)).message_count == 6


async def test_concurrent_scope_deltas_lose_nothing(store: cortex.Store, tenant: str) -> None:
    app = f"{tenant}/app"
    sessions = []
    for i in range(10):
        with use_scope(f"{app}/u{i}"):
            sessions.append(await store.create_session("bot"))

    async def write(i: int) -> None:
        with use_scope(tenant):
            await store.append_messages(
                sessions[i].id, [NewMessage("user", "x")], scope_data={app: {f"k{i}": i}}
            )

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(write, i)
    with use_scope(tenant):
        assert await store.get_scope_data(app) == {f"k{i}": i for i in range(10)}


async def test_expected_count_lets_exactly_one_writer_through(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
    outcomes: list[str] = []

    async def write(i: int) -> None:
        with use_scope(tenant):
            try:
                await store.append_messages(
                    session.id, [NewMessage("user", f"w{i}")], data={f"w{i}": i}, expected_count=0
                )
                outcomes.append("ok")
            except cortex.Conflict:
                outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(write, i)
    assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]
    with use_scope(tenant):
        after = await store.get_session(session.id)
        assert after.message_count == 1
        assert len(after.data) == 1  # only the winner's delta
        with pytest.raises(cortex.NotFound):
            await store.append_messages(
                "ses_" + "0" * 26, [NewMessage("user", "x")], expected_count=0
            )


def _binding(tenant: str) -> str:
    """The tenant binding cortex sends after BEGIN (cortex._db.transaction.begin_sql), for raw SQL."""
    return begin_sql(cortex.Scope.parse(tenant), custom_plans=False).split(";", 1)[1]


async def test_scope_data_is_walled_by_tenant(
    store: cortex.Store, database: Database, tenant: str
) -> None:
    with use_scope(tenant):
        await store.create_session("bot", scope_data={tenant: {"secret": 1}})
    conn = await asyncpg.connect(asyncpg_dsn(database.app_url))
    try:
        assert await conn.fetchval("SELECT count(*) FROM scope_data") == 0  # no tenant bound
        # Bound the way cortex binds (it reaches Citus workers too), in a transaction.
        async with conn.transaction():
            await conn.execute(_binding("someone-else"))
            assert await conn.fetchval("SELECT count(*) FROM scope_data") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(
                    "INSERT INTO scope_data (tenant_id, scope, data) VALUES ($1, $1, '{}')", tenant
                )
        async with conn.transaction():
            await conn.execute(_binding(tenant))
            assert await conn.fetchval("SELECT count(*) FROM scope_data") == 1
    finally:
        await conn.close()


async def test_update_session_leaves_key_and_state(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", key="k", data={"s": 1})
        changed = session.model_copy(update={"key": "other", "data": {"s": 2}, "title": "t"})
        updated = await store.update_session(changed)
        assert (updated.title, updated.key, updated.data) == ("t", "k", {"s": 1})


async def test_bad_state_is_refused_before_sql(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for bad in ({"": 1}, {"a\x00": 1}, {"k": "v\x00"}, {"k": float("inf")}):
            with pytest.raises(cortex.InvalidInput, match="data"):
                await store.create_session("bot", data=bad)
        with pytest.raises(cortex.InvalidInput, match="scope_data"):
            await store.create_session("bot", scope_data={"not a scope": {"k": 1}})
        with pytest.raises(cortex.InvalidInput, match="scope_data"):
            await store.create_session("bot", scope_data={f"{tenant}/x{i}": {} for i in range(9)})
        with pytest.raises(cortex.InvalidInput, match="not the session's scope"):
            await store.create_session("bot", scope_data={f"{tenant}/beneath": {"k": 1}})
        assert await store.count_sessions() == 0


async def test_concurrent_session_deltas_lose_nothing(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")

    async def write(i: int) -> None:
        with use_scope(tenant):
            await store.append_messages(
                session.id, [NewMessage("user", f"m{i}")], data={f"k{i}": i, "last": i}
            )

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(write, i)
    with use_scope(tenant):
        after = await store.get_session(session.id)
        messages = await store.recent_messages(session.id)
    assert after.message_count == 20
    assert {k: v for k, v in after.data.items() if k != "last"} == {f"k{i}": i for i in range(20)}
    # The last writer under the row lock wrote both the last message and "last".
    assert messages[-1].content == f"m{after.data['last']}"
