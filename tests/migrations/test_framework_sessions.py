"""Revision 20261201000011: keys, payloads and state documents, expand only.

Rows written before it read as sessions without key or state and messages
without payload; the previous release's writes (plain INSERTs that name none
of the new columns) still work on the new schema; the downgrade drops what
the revision added and keeps every older row.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from alembic.script import ScriptDirectory

import cortex
from cortex import NewMessage, use_scope
from cortex.ids import format_id
from cortex.migrate import DataLossRefused, alembic_config, downgrade, upgrade
from tests.migrations.legacy import execute, fetch

REVISION = "20261201000011"


def before_revision() -> str:
    down = ScriptDirectory.from_config(alembic_config()).get_revision(REVISION).down_revision
    assert isinstance(down, str)
    return down


def _old_release_insert(url: str) -> uuid.UUID:
    """A session and a message as the previous release writes them (no new columns)."""
    sid = fetch(
        url,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, metadata_json)"
        " VALUES ('acme', gen_random_uuid(), 'bot', 'acme/u', 2, 'acme/u', '{}') RETURNING id",
    )[0]["id"]
    execute(
        url,
        "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, metadata_json,"
        f" created_at) VALUES ('acme', gen_random_uuid(), '{sid}', 1, 'user', 'hi', '{{}}', now())",
        f"UPDATE sessions SET message_count = 1, last_message = 'hi' WHERE id = '{sid}'",
    )
    assert isinstance(sid, uuid.UUID)
    return sid


def test_old_rows_and_old_writers_survive_both_ways(blank_db: str) -> None:
    upgrade(blank_db, before_revision())
    before = _old_release_insert(blank_db)
    upgrade(blank_db)
    during = _old_release_insert(blank_db)  # the previous release, still running

    async def use() -> list[tuple[str | None, dict[str, object], object]]:
        seen = []
        async with cortex.connect(blank_db) as store:
            with use_scope("acme/u"):
                for raw in (before, during):
                    session = await store.get_session(format_id("ses", raw))
                    (message,) = await store.recent_messages(session.id)
                    seen.append((session.key, session.data, message.payload))
                keyed = await store.create_session(
                    "bot", key="k", data={"s": 1}, scope_data={"acme": {"t": 1}}
                )
                await store.append_message(keyed.id, NewMessage("user", payload={"p": 1}))
        return seen

    assert asyncio.run(use()) == [(None, {}, None), (None, {}, None)]
    with pytest.raises(DataLossRefused, match=r"1 session keys.*1 scope state documents"):
        downgrade(blank_db, before_revision())
    downgrade(blank_db, before_revision(), allow_data_loss=True)
    assert fetch(blank_db, "SELECT to_regclass('scope_data') AS t")[0]["t"] is None
    counts = fetch(blank_db, "SELECT count(*) AS n FROM sessions")[0]["n"]
    assert counts == 3
    upgrade(blank_db)  # and forward again
