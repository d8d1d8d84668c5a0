"""Revision 20261201000013: several questions and answers per message.

A question the previous release recorded stays pending across the upgrade;
the previous release's writes (one question per message, naming none of the
new columns) still work on the new schema; the downgrade keeps each
message's first question pending, forgets the others, and recounts.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from alembic.script import ScriptDirectory

import cortex
from cortex import NewMessage, RequestedInput, use_scope
from cortex.ids import format_id
from cortex.migrate import DataLossRefused, alembic_config, downgrade, upgrade
from tests.migrations.legacy import execute, fetch

REVISION = "20261201000013"


def before_revision() -> str:
    down = ScriptDirectory.from_config(alembic_config()).get_revision(REVISION).down_revision
    assert isinstance(down, str)
    return down


def _old_release_question(url: str, interrupt_id: str) -> uuid.UUID:
    """A session whose one message asks one question, as the previous release writes it."""
    sid = fetch(
        url,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, metadata_json)"
        " VALUES ('acme', gen_random_uuid(), 'bot', 'acme/u', 2, 'acme/u', '{}') RETURNING id",
    )[0]["id"]
    question = f'{{"interrupt_id": "{interrupt_id}", "message": "ok?"}}'
    execute(
        url,
        "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, requested_input,"
        f" metadata_json, created_at) VALUES ('acme', gen_random_uuid(), '{sid}', 1, 'assistant',"
        f" 'ok?', '{question}', '{{}}', now())",
        "INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message,"
        f" raised_at) VALUES ('acme', '{sid}', 1, '{interrupt_id}', 'ok?', now())",
        f"UPDATE sessions SET message_count = 1, last_message = 'ok?', pending_count = 1"
        f" WHERE id = '{sid}'",
    )
    assert isinstance(sid, uuid.UUID)
    return sid


def _key_width(url: str) -> int:
    return int(
        fetch(
            url,
            "SELECT count(*) AS n FROM pg_index AS i CROSS JOIN LATERAL unnest(i.indkey) AS k"
            " WHERE i.indexrelid = 'pk_pending_inputs'::regclass",
        )[0]["n"]
    )


def test_questions_survive_both_ways(blank_db: str) -> None:
    upgrade(blank_db, before_revision())
    assert _key_width(blank_db) == 3
    before = _old_release_question(blank_db, "old")
    upgrade(blank_db)
    assert _key_width(blank_db) == 4
    during = _old_release_question(blank_db, "during")  # the previous release, still running

    async def use() -> tuple[list[list[str]], str]:
        async with cortex.connect(blank_db) as store:
            with use_scope("acme/u"):
                seen = [
                    [
                        p.interrupt_id
                        for p in (await store.inspect_session(format_id("ses", raw))).pending
                    ]
                    for raw in (before, during)
                ]
                session = await store.create_session("bot")
                questions = [RequestedInput(interrupt_id=i) for i in ("q1", "q2", "q3")]
                await store.append_message(
                    session.id, NewMessage("assistant", requested_inputs=questions)
                )
                return seen, session.id

    seen, many = asyncio.run(use())
    assert seen == [["old"], ["during"]]
    with pytest.raises(DataLossRefused, match="further questions or answers of 1 messages"):
        downgrade(blank_db, before_revision())
    downgrade(blank_db, before_revision(), allow_data_loss=True)
    assert _key_width(blank_db) == 3
    rows = fetch(
        blank_db,
        "SELECT s.pending_count, array_agg(p.interrupt_id ORDER BY p.interrupt_id) AS ids"
        " FROM sessions AS s JOIN pending_inputs AS p ON p.session_id = s.id"
        " GROUP BY s.id, s.pending_count ORDER BY 2",
    )
    assert [(r["pending_count"], list(r["ids"])) for r in rows] == [
        (1, ["during"]),
        (1, ["old"]),
        (1, ["q1"]),
    ]
    assert many.startswith("ses_")
    upgrade(blank_db)  # and forward again
    assert _key_width(blank_db) == 4
