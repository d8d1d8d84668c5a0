"""Revision 20261202000017: the state document's limit moves from a CHECK on every update into the writing statements.

Upgrade and downgrade both ways over a session that holds a document, the
backstop validated, and a downgrade that refuses (naming the constraint) a
document a writer bypassing cortex stored past the old limit meanwhile.
"""

from __future__ import annotations

import pytest
from sqlalchemy.exc import DBAPIError

from cortex.migrate import downgrade as downgrade_to
from cortex.migrate import upgrade
from tests.migrations.legacy import execute, fetch

REVISION = "20261202000017"
BEFORE = "20261201000016"

_CHECKS = """
SELECT conname, convalidated FROM pg_constraint
WHERE conrelid = 'sessions'::regclass AND conname LIKE 'ck_sessions_data%'
"""
_FUNCTION = "SELECT count(*) AS n FROM pg_proc WHERE proname = 'cortex_bounded_data'"
_SESSION = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, data)
VALUES ('acme', gen_random_uuid(), 'bot', 'acme', 1, jsonb_build_object('k', repeat('v', 500000)))
"""


def _checks(url: str) -> dict[str, bool]:
    return {r["conname"]: r["convalidated"] for r in fetch(url, _CHECKS)}


def test_upgrade_and_downgrade_swap_the_constraint_for_the_function(blank_db: str) -> None:
    upgrade(blank_db, BEFORE)
    execute(blank_db, _SESSION)
    assert _checks(blank_db) == {"ck_sessions_data_size": True}
    upgrade(blank_db, REVISION)
    assert _checks(blank_db) == {"ck_sessions_data_stored_size": True}
    assert fetch(blank_db, _FUNCTION)[0]["n"] == 1
    # The function is the old constraint's measure, with its error.
    assert fetch(blank_db, "SELECT cortex_bounded_data('{}') = '{}' AS ok")[0]["ok"]
    with pytest.raises(Exception, match="ck_sessions_data_size"):
        fetch(blank_db, "SELECT cortex_bounded_data(jsonb_build_object('k', repeat('v', 1048576)))")
    downgrade_to(blank_db, BEFORE)
    assert _checks(blank_db) == {"ck_sessions_data_size": True}
    assert fetch(blank_db, _FUNCTION)[0]["n"] == 0
    upgrade(blank_db, REVISION)
    assert _checks(blank_db) == {"ck_sessions_data_stored_size": True}


def test_a_downgrade_refuses_a_document_stored_past_the_old_limit(blank_db: str) -> None:
    upgrade(blank_db, REVISION)
    # A writer that bypasses cortex (or an older release) is held by the backstop only.
    execute(
        blank_db,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, data) VALUES"
        " ('acme', gen_random_uuid(), 'bot', 'acme', 1,"
        " jsonb_build_object('k', repeat('v', 2000000)))",
    )
    with pytest.raises(DBAPIError, match="ck_sessions_data_size"):
        downgrade_to(blank_db, BEFORE)
    execute(blank_db, "UPDATE sessions SET data = '{}'")
    downgrade_to(blank_db, BEFORE)
    assert _checks(blank_db) == {"ck_sessions_data_size": True}
