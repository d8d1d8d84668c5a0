"""Revision 20261201000016: ``scope_l3``, the depth-3 subtree's listing key.

The upgrade fills the column for every existing session at depth 3 or
deeper (in batches, across tenants, also for an owner held to row-level
security), the previous release's inserts get it from the trigger, a user's
listing then finds the sessions written before the upgrade, and the
downgrade takes it all away again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import asyncpg
import pytest
from alembic.script import ScriptDirectory

import cortex
from cortex import ListFilter, use_scope
from cortex.migrate import alembic_config, grant_sql, upgrade
from cortex.migrate import downgrade as downgrade_to
from tests.migrations.legacy import execute, fetch, plain_owner_database

REVISION = "20261201000016"
BEFORE = "20261201000015"

# Sessions at depths 1 to 4 in two tenants, as the previous release writes
# them (no scope_l3): 2,500 at a user, more than one batch of the fill.
_SEED = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, created_at, updated_at)
SELECT t, gen_random_uuid(), 'bot', scope, array_length(string_to_array(scope, '/'), 1),
       CASE WHEN strpos(scope, '/') > 0 THEN split_part(scope, '/', 1) || '/' || split_part(scope, '/', 2) END,
       now() - g * interval '1 second', now() - g * interval '1 second'
FROM (
    SELECT g, t, CASE g % 5 WHEN 0 THEN t WHEN 1 THEN t || '/team' WHEN 2 THEN t || '/team/u' || (g % 3)
                            ELSE t || '/team/u' || (g % 3) || '/thread' || (g % 7) END AS scope
    FROM generate_series(1, 2500) AS g, unnest(ARRAY['acme', 'globex']) AS t
) AS s
"""
_WRONG = """
SELECT count(*) AS n FROM sessions
WHERE scope_l3 IS DISTINCT FROM CASE WHEN scope_depth >= 3 THEN
      split_part(scope, '/', 1) || '/' || split_part(scope, '/', 2) || '/' || split_part(scope, '/', 3) END
"""


def _columns(url: str) -> set[str]:
    rows = fetch(
        url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions'"
    )
    return {r["column_name"] for r in rows}


def test_upgrade_fills_every_user_session_and_the_old_release_is_filled_by_the_trigger(
    blank_db: str,
) -> None:
    upgrade(blank_db, BEFORE)
    execute(blank_db, _SEED)
    upgrade(blank_db, REVISION)
    assert fetch(blank_db, _WRONG)[0]["n"] == 0
    filled = fetch(blank_db, "SELECT count(*) AS n FROM sessions WHERE scope_l3 IS NOT NULL")
    assert filled[0]["n"] == 2 * 1500
    # The previous release inserts without the column: the trigger derives it.
    execute(
        blank_db,
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2)"
        " VALUES ('acme', gen_random_uuid(), 'old', 'acme/team/u9/deep', 4, 'acme/team'),"
        " ('acme', gen_random_uuid(), 'old', 'acme/team', 2, 'acme/team')",
    )
    rows = fetch(blank_db, "SELECT scope, scope_l3 FROM sessions WHERE agent_id = 'old'")
    assert {(r["scope"], r["scope_l3"]) for r in rows} == {
        ("acme/team/u9/deep", "acme/team/u9"),
        ("acme/team", None),
    }
    assert fetch(blank_db, _WRONG)[0]["n"] == 0
    downgrade_to(blank_db, BEFORE)
    assert "scope_l3" not in _columns(blank_db)
    assert not fetch(
        blank_db, "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'cortex_sessions_scope_l3'"
    )
    upgrade(blank_db, REVISION)
    assert fetch(blank_db, _WRONG)[0]["n"] == 0


def test_a_plain_owner_fills_through_row_level_security(server_url: str) -> None:
    """An owner neither superuser nor BYPASSRLS sees no rows under FORCE: each batch lifts it."""
    with plain_owner_database(server_url) as (as_owner, as_super):
        upgrade(as_owner, BEFORE)
        execute(as_super, _SEED)
        upgrade(as_owner, REVISION)
        assert fetch(as_super, _WRONG)[0]["n"] == 0
        forced = fetch(
            as_super, "SELECT relforcerowsecurity AS f FROM pg_class WHERE relname = 'sessions'"
        )
        assert forced[0]["f"]  # lifted only inside each batch's own statement


def test_the_offline_script_fills_as_a_plain_owner_too(server_url: str) -> None:
    """``cortex db sql`` reviewed, then run with psql by an owner held to FORCE: the fill sees every row."""
    with plain_owner_database(server_url) as (as_owner, as_super):
        upgrade(as_owner, BEFORE)
        execute(as_super, _SEED)
        command = [sys.executable, "-m", "cortex", "--database-url", as_owner, "db", "sql"]
        script = subprocess.run(
            [*command, f"{BEFORE}:{REVISION}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert _revision_module().FILL_POLICY in script
        subprocess.run(
            ["psql", "-v", "ON_ERROR_STOP=1", "-q", as_owner],
            input=script,
            check=True,
            capture_output=True,
            text=True,
        )
        assert fetch(as_super, "SELECT version_num FROM alembic_version")[0][0] == REVISION
        assert fetch(as_super, _WRONG)[0]["n"] == 0
        policy = _revision_module().FILL_POLICY
        assert not fetch(as_super, f"SELECT FROM pg_policy WHERE polname = '{policy}'")


def test_the_check_after_the_fill_refuses_a_row_left_unfilled(blank_db: str) -> None:
    """What the upgrade runs after its fill: a session at depth 3 without the column fails it."""
    upgrade(blank_db, REVISION)
    check = _revision_module()._CHECK_FILLED
    execute(blank_db, check)  # nothing missing: passes
    execute(
        blank_db,
        "ALTER TABLE sessions DISABLE TRIGGER cortex_sessions_scope_l3",
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2)"
        " VALUES ('acme', gen_random_uuid(), 'bot', 'acme/team/u1', 3, 'acme/team')",
    )
    with pytest.raises(asyncpg.RaiseError, match="1 sessions at depth 3 or deeper were not filled"):
        execute(blank_db, check)


def _revision_module() -> Any:
    return ScriptDirectory.from_config(alembic_config()).get_revision(REVISION).module


def test_a_users_listing_finds_the_sessions_written_before_the_upgrade(
    blank_db: str, server_url: str
) -> None:
    upgrade(blank_db, BEFORE)
    execute(blank_db, _SEED)
    upgrade(blank_db)
    role = f"cortex_app_{uuid.uuid4().hex[:8]}"
    execute(server_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        execute(blank_db, *grant_sql(role))
        app_url = blank_db.replace("postgres@", f"{role}@", 1)

        async def read() -> tuple[list[cortex.Session], int]:
            async with cortex.connect(app_url) as store:
                with use_scope("acme/team/u1"):
                    return await store.list_sessions(ListFilter(limit=1000)), (
                        await store.count_sessions()
                    )

        listed, counted = asyncio.run(read())
        # g % 5 in (2, 3, 4) and g % 3 = 1: the user's own and its threads'.
        expected = sum(1 for g in range(1, 2501) if g % 5 >= 2 and g % 3 == 1)
        assert counted == len(listed) == expected
        assert all(str(s.scope).startswith("acme/team/u1") for s in listed)
    finally:
        execute(blank_db, f'DROP OWNED BY "{role}"')
        execute(server_url, f'DROP ROLE "{role}"')
