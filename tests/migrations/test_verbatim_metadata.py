"""Revision 20261201000009: metadata as verbatim JSON text beside the legacy jsonb.

Rows written before it are read from jsonb; rows written after it from the
text; its downgrade keeps what was written after it (back in jsonb).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from alembic.script import ScriptDirectory

import cortex
from cortex import NewMessage, use_scope
from cortex.ids import format_id
from cortex.migrate import alembic_config, downgrade, upgrade
from tests.migrations.legacy import execute, fetch

REVISION = "20261201000009"


def before_revision() -> str:
    down = ScriptDirectory.from_config(alembic_config()).get_revision(REVISION).down_revision
    assert isinstance(down, str)
    return down


def read(url: str, session_id: str) -> tuple[Any, list[Any]]:
    async def go() -> tuple[Any, list[Any]]:
        async with cortex.connect(url) as store:
            with use_scope("acme/u"):
                session = await store.get_session(session_id)
                messages = await store.list_messages(session_id)
        return session.metadata, [m.metadata for m in messages]

    return asyncio.run(go())


def test_legacy_rows_are_read_and_new_rows_survive_a_downgrade(blank_db: str) -> None:
    upgrade(blank_db, before_revision())
    legacy = fetch(
        blank_db,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, metadata)"
        " VALUES ('acme', gen_random_uuid(), 'bot', 'acme/u', 2, 'acme/u', '{\"n\": 1e16}')"
        " RETURNING id",
    )[0]["id"]
    execute(
        blank_db,
        "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, metadata, created_at)"
        f" VALUES ('acme', gen_random_uuid(), '{legacy}', 1, 'user', 'hi', '{{\"m\": 1}}', now())",
        f"UPDATE sessions SET message_count = 1 WHERE id = '{legacy}'",
    )
    upgrade(blank_db)
    legacy_id = format_id("ses", legacy)
    # jsonb normalised 1e16 long ago; what it kept is what is read.
    assert read(blank_db, legacy_id) == ({"n": 10**16}, [{"m": 1}])

    async def write() -> str:
        async with cortex.connect(blank_db) as store:
            with use_scope("acme/u"):
                session = await store.create_session("bot", metadata={"x": 1e16, "z": -0.0})
                await store.append_messages(session.id, [NewMessage("user", metadata={"y": 2.5})])
                await store.update_session(await store.get_session(legacy_id))
                return session.id

    new_id = asyncio.run(write())
    meta, messages = read(blank_db, new_id)
    assert json.dumps(meta) == json.dumps({"x": 1e16, "z": -0.0})
    assert messages == [{"y": 2.5}]

    downgrade(blank_db, before_revision())
    rows = {
        str(r["id"]): json.loads(r["metadata"])
        for r in fetch(blank_db, "SELECT id, metadata::text AS metadata FROM sessions")
    }
    assert rows[str(legacy)] == {"n": 10**16}
    assert [v for k, v in rows.items() if k != str(legacy)] == [{"x": 10**16, "z": 0.0}]
    kept = sorted(r["m"] for r in fetch(blank_db, "SELECT metadata::text AS m FROM messages"))
    assert kept == ['{"m": 1}', '{"y": 2.5}']
    upgrade(blank_db)
    assert json.loads(json.dumps(read(blank_db, new_id)[0])) == {"x": 10**16, "z": 0.0}
