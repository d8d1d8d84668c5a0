"""Attacks by a client holding only the application role's login.

The store is not the only client a leaked application credential can drive:
these tests send raw SQL as that role and check that nothing it can do gives
it more than one tenant's rows, or the owner's rights.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

import cortex
from cortex import InvalidInput, NewMessage, RequestedInput, SessionState, use_scope
from cortex.migrate import downgrade, grant_sql, upgrade
from tests.conftest import Database, admin, asyncpg_dsn, with_user
from tests.figures import record

pytestmark = pytest.mark.reliability

# A pg_temp function that, run with the owner's rights, would lift row-level
# security both ways these attacks found: as a superuser owner (give
# the caller BYPASSRLS) and as a plain owner (switch RLS off on the table).
_HIJACK = [
    """
    CREATE FUNCTION pg_temp.escalate() RETURNS SETOF uuid LANGUAGE plpgsql AS $$
    BEGIN
        BEGIN
            EXECUTE format('ALTER ROLE %I BYPASSRLS', session_user);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
        BEGIN
            EXECUTE 'ALTER TABLE public.sessions DISABLE ROW LEVEL SECURITY';
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
        RETURN;
    END $$
    """,
    """
    CREATE TEMP VIEW sessions AS
    SELECT NULL::uuid AS id, current_setting('cortex.tenant', true) AS tenant_id,
           'x'::text AS title, 'x'::text AS last_message
    FROM pg_temp.escalate()
    """,
]
# The view's tenant_id is the bound tenant, so no one-time filter skips the
# function scan: the attack runs whenever the definer reads "sessions".


async def _rls_state(owner: asyncpg.Connection, role: str) -> tuple[bool, bool]:
    bypass = await owner.fetchval("SELECT rolbypassrls FROM pg_roles WHERE rolname = $1", role)
    enabled = await owner.fetchval(
        "SELECT relrowsecurity FROM pg_class WHERE oid = 'public.sessions'::regclass"
    )
    return bool(bypass), bool(enabled)


async def test_search_function_cannot_be_hijacked_through_pg_temp(
    database: Database, app_conn: asyncpg.Connection, owner_conn: asyncpg.Connection
) -> None:
    for statement in _HIJACK:
        await app_conn.execute(statement)
    async with app_conn.transaction():
        await app_conn.execute("SELECT set_config('cortex.tenant', 'anyone', true)")
        await app_conn.fetch("SELECT * FROM cortex_search_ids('%x%')")
        await app_conn.fetch("SELECT cortex_tenant_search('anyone', '%x%')")
    try:
        assert await _rls_state(owner_conn, database.app_role) == (False, True)
        # And with no tenant bound, the role still reads nothing.
        assert await app_conn.fetchval("SELECT count(*) FROM public.sessions") == 0
    finally:
        await owner_conn.execute(f'ALTER ROLE "{database.app_role}" NOBYPASSRLS')
        await owner_conn.execute("ALTER TABLE sessions ENABLE ROW LEVEL SECURITY")
    record("isolation attacks: privilege escalation through SECURITY DEFINER", 3)


async def test_every_security_definer_function_pins_its_search_path(
    owner_conn: asyncpg.Connection,
) -> None:
    rows = await owner_conn.fetch(
        """
        SELECT p.oid::regprocedure::text AS name, p.proconfig
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')
        """
    )
    assert rows, "expected cortex's SECURITY DEFINER functions"
    for row in rows:
        settings = [s for s in row["proconfig"] or [] if s.startswith("search_path=")]
        assert settings, f"{row['name']} runs with the caller's search_path"
        path = [p.strip() for p in settings[0].removeprefix("search_path=").split(",")]
        # pg_temp named, and last: never searched before the real schemas.
        assert path[0] == "pg_catalog", (row["name"], path)
        assert path[-1] == "pg_temp", (row["name"], path)


@pytest.fixture
def migrated(blank_db: str) -> Iterator[tuple[str, str]]:
    """A database at head with a granted application role; yields (owner URL, role)."""
    role = f"cortex_rt_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(blank_db, f'CREATE ROLE "{role}" LOGIN'))
    try:
        upgrade(blank_db)
        asyncio.run(admin(blank_db, *grant_sql(role)))
        yield blank_db, role
    finally:
        asyncio.run(admin(blank_db, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"'))


async def _app_can_use_everything(url: str, role: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(with_user(url, role)))
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('cortex.tenant', 't', true)")
            await conn.fetch("SELECT * FROM cortex_search_ids('%x%')")
            for table in ("sessions", "messages", "pending_inputs", "session_markers"):
                await conn.fetch(f"SELECT 1 FROM {table} LIMIT 1")
            await conn.fetch("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()


# One step below the search function, and below the operator tables too.
@pytest.mark.parametrize("back_to", ["20261001000006", "20260901000005"])
def test_grants_survive_a_rollback_and_the_upgrade_after_it(
    migrated: tuple[str, str], back_to: str
) -> None:
    url, role = migrated
    asyncio.run(_app_can_use_everything(url, role))
    downgrade(url, back_to)
    upgrade(url)
    # No `cortex db grant` in between: the upgrade gave the role its rights back.
    asyncio.run(_app_can_use_everything(url, role))


async def test_a_response_schema_cannot_stall_resume(store: cortex.Store, tenant: str) -> None:
    # A hostile schema: Python's backtracking re needs ~1.8**n steps for n
    # a's and a '!' (14 s at n = 28), with the session's row lock held. Here
    # n = 60,000 and the answer is refused at once, before any lock.
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}
    with use_scope(f"{tenant}/u"):
        s = await store.create_session("bot")
        await store.append_message(
            s.id,
            NewMessage(
                "assistant",
                "code?",
                requested_input=RequestedInput(interrupt_id="q", response_schema=schema),
            ),
        )
        with pytest.raises(InvalidInput, match="response: at code"):
            await store.resume(s.id, "q", {"code": "a" * 60_000 + "!"})
        assert (await store.get_session(s.id)).message_count == 1
        await store.resume(s.id, "q", {"code": "a" * 60_000})
        assert (await store.get_session(s.id)).state is SessionState.IDLE
    record("hostile inputs: response schemas built to stall validation", 1)


async def test_connecting_as_a_role_that_bypasses_rls_warns(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cortex"):
        async with cortex.connect(database.owner_url) as store:  # the server's superuser
            assert store.bypasses_row_level_security
    assert any("row-level security does not apply" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cortex"):
        async with cortex.connect(database.app_url) as store:
            assert not store.bypasses_row_level_security
    assert not [r for r in caplog.records if r.name == "cortex"]
