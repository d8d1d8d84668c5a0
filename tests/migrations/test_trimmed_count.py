"""Revision 20261205000023: ``sessions.trimmed_count``, and a downgrade that renumbers from 1.

A release before it numbers an append from ``message_count``, so the
downgrade gives each trimmed session's messages (and pending inputs) back
the positions 1, 2, … that release expects, for an owner held to row-level
security too, and says so before it does.
"""

from __future__ import annotations

import uuid

import pytest

from cortex.errors import SchemaMismatch
from cortex.migrate import DataLossRefused, downgrade, upgrade
from tests.migrations.legacy import current, execute, fetch, plain_owner_database

REVISION = "20261205000023"
BEFORE = "20261205000022"


def _trimmed_session(url: str) -> str:
    """A session whose seqs 1-3 retention removed: 4, 5, 6 kept, a question pending at 5."""
    sid = str(uuid.uuid4())
    execute(
        url,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, message_count,"
        f" trimmed_count, pending_count) VALUES ('acme', '{sid}', 'bot', 'acme/u1', 2, 3, 3, 1)",
        *(
            "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, created_at)"
            f" VALUES ('acme', '{uuid.uuid4()}', '{sid}', {seq}, 'user', 'm{seq}', now())"
            for seq in (4, 5, 6)
        ),
        "INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, raised_at)"
        f" VALUES ('acme', '{sid}', 5, 'q', now())",
    )
    return sid


def _positions(url: str, sid: str) -> tuple[list[tuple[int, str]], list[int]]:
    messages = fetch(
        url, f"SELECT seq, content FROM messages WHERE session_id = '{sid}' ORDER BY seq"
    )
    pending = fetch(url, f"SELECT raised_seq FROM pending_inputs WHERE session_id = '{sid}'")
    return [(r["seq"], r["content"]) for r in messages], [r["raised_seq"] for r in pending]


def test_the_column_is_checked_and_the_downgrade_renumbers_from_one(blank_db: str) -> None:
    upgrade(blank_db, REVISION)
    sid = _trimmed_session(blank_db)
    with pytest.raises(Exception, match="ck_sessions_trimmed_count"):
        execute(blank_db, f"UPDATE sessions SET trimmed_count = -1 WHERE id = '{sid}'")
    with pytest.raises(DataLossRefused, match="renumbered from seq 1"):
        downgrade(blank_db, BEFORE)
    assert current(blank_db) == [REVISION]
    downgrade(blank_db, BEFORE, allow_data_loss=True)
    assert current(blank_db) == [BEFORE]
    assert _positions(blank_db, sid) == ([(1, "m4"), (2, "m5"), (3, "m6")], [2])
    upgrade(blank_db, REVISION)
    found = fetch(blank_db, f"SELECT trimmed_count FROM sessions WHERE id = '{sid}'")
    assert [r["trimmed_count"] for r in found] == [0]


def test_an_owner_held_to_row_level_security_renumbers_every_tenant(server_url: str) -> None:
    with plain_owner_database(server_url) as (owner, superuser):
        upgrade(owner, REVISION)
        sid = _trimmed_session(superuser)
        downgrade(owner, BEFORE, allow_data_loss=True)
        assert _positions(superuser, sid) == ([(1, "m4"), (2, "m5"), (3, "m6")], [2])
        forced = fetch(
            superuser,
            "SELECT count(*) AS n FROM pg_class WHERE relforcerowsecurity"
            " AND relname IN ('sessions', 'messages', 'pending_inputs')",
        )
        assert [r["n"] for r in forced] == [3]


def test_a_trimmed_count_column_of_another_type_is_refused(blank_db: str) -> None:
    upgrade(blank_db, BEFORE)
    execute(blank_db, "ALTER TABLE sessions ADD COLUMN trimmed_count bigint")
    with pytest.raises(SchemaMismatch, match=r"sessions\.trimmed_count exists with type bigint"):
        upgrade(blank_db, REVISION)
    assert current(blank_db) == [BEFORE]
