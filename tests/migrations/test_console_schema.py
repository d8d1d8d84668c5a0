"""Revision 20261205000025: the role ``cortex_console``, its policies, ``console_actions``.

The role is the cluster's (it outlives a downgrade); its policies and
grants are the database's and go with the downgrade, which counts the audit
rows it would destroy. A plain owner that may not create roles still makes
the policies when the role exists, and a role of that name that can log in
is refused.
"""

from __future__ import annotations

import uuid

import pytest

from cortex.cli import EXIT_USAGE, main
from cortex.errors import SchemaMismatch
from cortex.migrate import upgrade
from tests.migrations.legacy import current, execute, fetch, plain_owner_database

REVISION = "20261205000025"
BEFORE = "20261205000023"
_ENSURE_ROLE = """DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cortex_console') THEN
        CREATE ROLE cortex_console NOLOGIN;
    END IF;
END $$"""
_POLICIES = (
    "SELECT tablename FROM pg_policies WHERE policyname = 'console_scope'"
    " AND roles = '{cortex_console}' AND cmd = 'SELECT' ORDER BY tablename"
)
_TABLES = ["console_actions", "pending_inputs", "session_markers", "sessions"]
_GRANTED = (
    "SELECT count(*) AS n FROM information_schema.column_privileges"
    " WHERE grantee = 'cortex_console' AND table_schema = 'public'"
)


def test_the_downgrade_counts_the_trail_drops_it_and_the_policies(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(blank_db, REVISION)
    assert [r["tablename"] for r in fetch(blank_db, _POLICIES)] == _TABLES
    forced = fetch(
        blank_db,
        "SELECT relrowsecurity AND relforcerowsecurity AS forced FROM pg_class"
        " WHERE relname = 'console_actions'",
    )
    assert forced[0]["forced"]
    execute(
        blank_db,
        "INSERT INTO console_actions (tenant_id, id, scope, subject, action, outcome)"
        f" VALUES ('acme', '{uuid.uuid4()}', 'acme/u1', 'ops', 'abort', 'ok')",
    )
    capsys.readouterr()
    assert main(["--database-url", blank_db, "db", "downgrade", BEFORE]) == EXIT_USAGE
    assert "1 operator actions (console_actions)" in capsys.readouterr().err
    assert current(blank_db) == [REVISION]
    assert main(["--database-url", blank_db, "db", "downgrade", BEFORE, "--allow-data-loss"]) == 0
    assert current(blank_db) == [BEFORE]
    assert fetch(blank_db, _POLICIES) == []
    assert fetch(blank_db, _GRANTED)[0]["n"] == 0
    assert fetch(blank_db, "SELECT to_regclass('console_actions') AS t")[0]["t"] is None
    gone = fetch(blank_db, "SELECT to_regclass('ix_sessions_console_recent') AS i")
    assert gone[0]["i"] is None
    upgrade(blank_db, REVISION)
    assert [r["tablename"] for r in fetch(blank_db, _POLICIES)] == _TABLES
    assert fetch(blank_db, _GRANTED)[0]["n"] > 0


def test_a_plain_owner_makes_the_policies_when_the_role_exists(server_url: str) -> None:
    execute(server_url, _ENSURE_ROLE)
    with plain_owner_database(server_url) as (owner, superuser):
        upgrade(owner, REVISION)
        assert [r["tablename"] for r in fetch(superuser, _POLICIES)] == _TABLES


def test_a_console_role_that_can_log_in_is_refused(blank_db: str, server_url: str) -> None:
    execute(server_url, _ENSURE_ROLE)
    upgrade(blank_db, BEFORE)
    execute(server_url, "ALTER ROLE cortex_console LOGIN")
    try:
        with pytest.raises(SchemaMismatch, match="cortex_console can log in"):
            upgrade(blank_db, REVISION)
    finally:
        execute(server_url, "ALTER ROLE cortex_console NOLOGIN")
    assert current(blank_db) == [BEFORE]
