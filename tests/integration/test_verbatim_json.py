"""Host-owned JSON comes back as it was sent.

Metadata is stored as the JSON text cortex serialised from the caller's value
and decoded on read, so numbers keep their exact value and type, and every
read-modify-write of an accepted value is accepted again.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope

pytestmark = pytest.mark.anyio

AWKWARD: dict[str, Any] = {
    "big float": 1e16,
    "huge float": 1e300,
    "negative zero": -0.0,
    "tiny": 5e-324,
    "int": 10**30,
    "path": "C:\\u0000dir",
    "nested": {"list": [1.0, 2, -0.0, "x", None, True]},
}


def same(a: Any, b: Any) -> bool:
    """Equal values with the same JSON text: 1.0 is not 1, -0.0 is not 0.0."""
    return json.dumps(a) == json.dumps(b)


async def test_session_metadata_round_trips_verbatim(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        created = await store.create_session("bot", metadata=AWKWARD)
        fetched = await store.get_session(created.id)
        (listed,) = await store.list_sessions()
        walked = [s async for s in store.iter_sessions()]
    for session in (created, fetched, listed, walked[0]):
        assert same(session.metadata, AWKWARD)
        assert isinstance(session.metadata["big float"], float)


async def test_message_metadata_round_trips_verbatim(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        (appended,) = await store.append_messages(
            session.id, [NewMessage("user", metadata=AWKWARD)]
        )
        (listed,) = await store.list_messages(session.id)
    assert same(appended.metadata, AWKWARD)
    assert same(listed.metadata, AWKWARD)


async def test_denormals_do_not_grow(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    value = {"d": [5e-324] * 9000}
    sent = len(json.dumps(value, separators=(",", ":")))
    with use_scope(tenant):
        session = await store.create_session("bot", metadata=value)
        await store.append_messages(session.id, [NewMessage("user", metadata=value)])
        assert same((await store.get_session(session.id)).metadata, value)
    # The text of every column of the stored rows: jsonb would hold each 5e-324
    # as its 326-digit decimal expansion (2.9 MB).
    for table in ("sessions", "messages"):
        stored = await owner_conn.fetchval(
            f"SELECT sum(octet_length(row_to_json(t)::text)) FROM {table} t WHERE tenant_id = $1",
            tenant,
        )
        assert stored < 2 * sent, table


@pytest.mark.parametrize(
    "meta",
    [
        {"d": [5e-324] * 9000},
        {"n": [1e300] * 200},
        {"z": [-0.0] * 10000},
        {"x": "y" * (64 * 1024 - 20)},
    ],
    ids=["denormals", "huge floats", "negative zeros", "at the limit"],
)
async def test_read_modify_write_of_an_accepted_value_succeeds(
    store: cortex.Store, tenant: str, meta: dict[str, Any]
) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", metadata=meta)
        again = await store.update_session(await store.get_session(session.id))
        assert same(again.metadata, meta)
        listed = (await store.list_sessions())[0]
        assert same((await store.update_session(listed)).metadata, meta)


async def test_backslash_u0000_text_is_not_a_nul(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session(
            "bot", title="C:\\u0000dir", metadata={"p": "C:\\u0000dir", "C:\\u0000": 1}
        )
        assert (await store.get_session(session.id)).metadata == {
            "p": "C:\\u0000dir",
            "C:\\u0000": 1,
        }
        with pytest.raises(cortex.InvalidInput):
            await store.create_session("bot", metadata={"p": "C:\x00dir"})
        with pytest.raises(cortex.InvalidInput):
            await store.create_session("bot", metadata={"C:\x00": 1})


# Keys in an order jsonb does not keep (it sorts shorter keys first), and a
# number it respells.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"zeta": {"type": "number"}, "a": {"type": "string"}},
    "required": ["zeta"],
    "additionalProperties": False,
}
PAYLOAD: dict[str, Any] = {"zeta": 1e16, "amount": 140, "a": [{"yy": 1, "x": 2}]}
ANSWER: dict[str, Any] = {"zeta": 1e16, "a": "ok"}


async def _ask_and_answer(store: cortex.Store) -> tuple[str, cortex.Message]:
    session = await store.create_session("bot")
    ask = [
        cortex.RequestedInput(interrupt_id=n, response_schema=SCHEMA, payload=PAYLOAD)
        for n in ("q1", "q2", "q3")
    ]
    await store.append_message(session.id, NewMessage("assistant", "ok?", requested_inputs=ask))
    answered = await store.resume(session.id, "q1", ANSWER)
    both = [cortex.FunctionResponse(id=n, response=ANSWER) for n in ("q2", "x")]
    await store.append_message(session.id, NewMessage("tool", function_responses=both))
    return session.id, answered


async def test_questions_and_answers_come_back_as_written(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        sid, answered = await _ask_and_answer(store)
        detail = await store.inspect_session(sid)
        asked, first, second = await store.list_messages(sid)
        _, history = await store.get_session_with_messages(sid)
    assert same(answered.function_responses[0].response, ANSWER)
    (pending,) = detail.pending
    assert same(pending.response_schema, SCHEMA)
    assert same(pending.payload, PAYLOAD)
    for message in (asked, history[0]):
        for question in message.requested_inputs:
            assert same(question.response_schema, SCHEMA)
            assert same(question.payload, PAYLOAD)
    for message in (first, second, history[1], history[2]):
        for answer in message.function_responses:
            assert same(answer.response, ANSWER)
    # Rows written before revision 20261205000020 have no text: their jsonb is read.
    await owner_conn.execute(
        "UPDATE messages SET requested_input_json = NULL, function_response_json = NULL,"
        " more_requested_inputs_json = NULL, more_function_responses_json = NULL"
        " WHERE tenant_id = $1",
        tenant,
    )
    await owner_conn.execute(
        "UPDATE pending_inputs SET response_schema_json = NULL, payload_json = NULL"
        " WHERE tenant_id = $1",
        tenant,
    )
    with use_scope(tenant):
        detail = await store.inspect_session(sid)
        old = await store.list_messages(sid)
    assert detail.pending[0].response_schema == SCHEMA  # the same value, in jsonb's order
    assert list(detail.pending[0].response_schema) == [
        "type",
        "required",
        "properties",
        "additionalProperties",
    ]
    assert [q.payload for q in old[0].requested_inputs] == [{**PAYLOAD, "zeta": 10**16}] * 3
    assert [a.response for a in old[2].function_responses] == [{**ANSWER, "zeta": 10**16}] * 2
