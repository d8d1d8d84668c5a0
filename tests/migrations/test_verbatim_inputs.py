"""Revision 20261205000020: questions and answers as verbatim JSON text beside their jsonb.

A question the previous release wrote is read from its jsonb; one written
after the revision from its text, in the order written; the downgrade keeps
every value (in jsonb's order again), and a column of the revision's name
and another type is refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from alembic.script import ScriptDirectory

import cortex
from cortex import NewMessage, RequestedInput, use_scope
from cortex.errors import SchemaMismatch
from cortex.ids import format_id
from cortex.migrate import alembic_config, downgrade, upgrade
from tests.migrations.legacy import current, execute, fetch

REVISION = "20261205000020"
# Keys jsonb would reorder: it sorts shorter keys first.
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"zz": {}, "a": {}}, "required": ["a"]}
JSONB_ORDER = ["type", "required", "properties"]


def before_revision() -> str:
    down = ScriptDirectory.from_config(alembic_config()).get_revision(REVISION).down_revision
    assert isinstance(down, str)
    return down


def _old_release_question(url: str) -> str:
    """A session asking one question, as the previous release writes it (jsonb only)."""
    sid = fetch(
        url,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, metadata_json)"
        " VALUES ('acme', gen_random_uuid(), 'bot', 'acme/u', 2, 'acme/u', '{}') RETURNING id",
    )[0]["id"]
    question = (
        '{"interrupt_id": "old", "message": "ok?", "response_schema": {"type": "object",'
        ' "properties": {"zz": {}, "a": {}}, "required": ["a"]}, "payload": null}'
    )
    execute(
        url,
        "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, requested_input,"
        f" metadata_json, created_at) VALUES ('acme', gen_random_uuid(), '{sid}', 1, 'assistant',"
        f" 'ok?', '{question}', '{{}}', now())",
        "INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message,"
        f" raised_at, response_schema) VALUES ('acme', '{sid}', 1, 'old', 'ok?', now(),"
        f" '{question}'::jsonb -> 'response_schema')",
        f"UPDATE sessions SET message_count = 1, last_message = 'ok?', pending_count = 1"
        f" WHERE id = '{sid}'",
    )
    return format_id("ses", sid)


def _schemas(url: str, session_id: str) -> tuple[list[str], list[str]]:
    """The key order of the pending input's schema, and of the asking message's."""

    async def go() -> tuple[list[str], list[str]]:
        async with cortex.connect(url) as store:
            with use_scope("acme/u"):
                detail = await store.inspect_session(session_id)
                (asked, *_) = await store.list_messages(session_id)
        pending = detail.pending[0].response_schema
        schema = asked.requested_inputs[0].response_schema
        assert pending == schema == SCHEMA
        return list(pending), list(schema)

    return asyncio.run(go())


def test_old_questions_read_from_jsonb_new_ones_as_written_both_ways(blank_db: str) -> None:
    upgrade(blank_db, before_revision())
    old = _old_release_question(blank_db)
    upgrade(blank_db)
    assert _schemas(blank_db, old) == (JSONB_ORDER, JSONB_ORDER)

    async def ask() -> str:
        async with cortex.connect(blank_db) as store:
            with use_scope("acme/u"):
                session = await store.create_session("bot")
                question = RequestedInput(interrupt_id="new", response_schema=SCHEMA)
                await store.append_message(
                    session.id, NewMessage("assistant", requested_input=question)
                )
                return session.id

    new = asyncio.run(ask())
    assert _schemas(blank_db, new) == (list(SCHEMA), list(SCHEMA))
    texts = fetch(
        blank_db,
        "SELECT requested_input_json::text AS m, (SELECT response_schema_json::text"
        " FROM pending_inputs WHERE interrupt_id = 'new') AS p"
        " FROM messages WHERE requested_input_json IS NOT NULL",
    )
    assert [(r["m"].startswith('{"interrupt_id":"new"'), r["p"]) for r in texts] == [
        (True, '{"type":"object","properties":{"zz":{},"a":{}},"required":["a"]}')
    ]

    # Down: the texts go, every value stays (in jsonb's order); up again reads it so.
    downgrade(blank_db, before_revision())
    assert current(blank_db) == [before_revision()]
    left = fetch(
        blank_db,
        "SELECT count(*) AS n FROM pg_attribute WHERE attname LIKE '%\\_json' AND NOT attisdropped"
        " AND attrelid IN ('messages'::regclass, 'pending_inputs'::regclass)"
        " AND attname NOT IN ('metadata_json', 'payload_json')",
    )
    assert left[0]["n"] == 0
    upgrade(blank_db)
    assert _schemas(blank_db, new) == (JSONB_ORDER, JSONB_ORDER)


@pytest.mark.parametrize(
    ("table", "column"),
    [("messages", "more_function_responses_json"), ("pending_inputs", "payload_json")],
)
def test_a_column_of_another_type_is_refused(blank_db: str, table: str, column: str) -> None:
    upgrade(blank_db, before_revision())
    execute(blank_db, f"ALTER TABLE {table} ADD COLUMN {column} text")
    with pytest.raises(SchemaMismatch, match=f"{table}.{column} is text"):
        upgrade(blank_db)
    assert current(blank_db) == [before_revision()]
