"""cortex_tenant_search attacked as the application role, and the routed listing against the plain one.

Attacks on revision 20261201000012. The function answers
only for the tenant bound to the transaction, whatever it is asked and
whatever objects the caller creates; the statements a Citus store sends
list, count and iterate exactly what the plain store does, LIKE's own
characters included. (Under ``set_config()`` on Citus the workers' policy
sees no tenant while the function still answers for the bound one: no more
than ``SET LOCAL`` would show; documented in the revision.)
"""

from __future__ import annotations

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from cortex.ids import format_id
from cortex.models import SessionState
from tests.conftest import CITUS_URL, Database

pytestmark = pytest.mark.citus

SEARCH = "SELECT cortex_tenant_search($1, $2)"


async def _seed(store: cortex.Store, tenant: str) -> str:
    with use_scope(f"{tenant}/u"):
        s = await store.create_session("bot", title=f"secret of {tenant}")
        await store.append_message(s.id, NewMessage("user", f"private to {tenant}"))
        return s.id


async def test_function_attacks_as_app_role(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    await _seed(store, tenant)
    await _seed(store, other_tenant)
    # Never bound on this connection: NULL setting.
    for t in (None, "", other_tenant, tenant):
        for p in (None, "%", "%%", "_%", "%secret%"):
            assert await app_conn.fetchval(SEARCH, t, p) in ([], None), (t, p)
    # After a transaction-local binding ended, the setting reads '' (not NULL).
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
    assert await app_conn.fetchval("SELECT current_setting('cortex.tenant', true)") == ""
    for t in (None, "", other_tenant, tenant, " ", tenant.upper()):
        assert await app_conn.fetchval(SEARCH, t, "%") in ([], None), t
    # Bound with set_config (is_local) to my tenant: others' names, odd spellings.
    async with app_conn.transaction():
        await app_conn.execute("SELECT set_config('cortex.tenant', $1, true)", tenant)
        mine = await app_conn.fetchval(SEARCH, tenant, "%")
        assert len(mine) == 1
        for t in (other_tenant, tenant + " ", tenant.upper(), "%", tenant + "%", None, ""):
            assert await app_conn.fetchval(SEARCH, t, "%") in ([], None), t
        # A trailing escape character: an error, whoever's rows exist.
        with pytest.raises(asyncpg.PostgresError):
            async with app_conn.transaction():
                await app_conn.fetchval(SEARCH, tenant, "%/")
    # RESET after SET (session level): the setting is '' again.
    await app_conn.execute(f"SET cortex.tenant = '{tenant}'")
    await app_conn.execute("RESET cortex.tenant")
    assert await app_conn.fetchval(SEARCH, other_tenant, "%") == []
    assert await app_conn.fetchval(SEARCH, "", "%") == []


async def test_function_ignores_app_role_objects(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    """Temp objects and a search_path the caller controls change nothing the function reads."""
    mine = await _seed(store, tenant)
    await _seed(store, other_tenant)
    await app_conn.execute(
        "CREATE TEMP TABLE sessions (id uuid, tenant_id text, title text, last_message text)"
    )
    await app_conn.execute(
        "INSERT INTO pg_temp.sessions VALUES (gen_random_uuid(), $1, 'secret', 'secret')", tenant
    )
    await app_conn.execute(
        "CREATE FUNCTION pg_temp.current_setting(text, boolean) RETURNS text"
        f" LANGUAGE sql AS $$ SELECT '{other_tenant}'::text $$"
    )
    await app_conn.execute("SET search_path = pg_temp, public, pg_catalog")
    async with app_conn.transaction():
        await app_conn.execute("SELECT pg_catalog.set_config('cortex.tenant', $1, true)", tenant)
        found = await app_conn.fetchval(
            "SELECT public.cortex_tenant_search($1, '%secret%')", tenant
        )
        assert [format_id("ses", i) for i in found] == [mine]
        assert (
            await app_conn.fetchval(
                "SELECT public.cortex_tenant_search($1, '%secret%')", other_tenant
            )
            == []
        )


TITLES = [
    "100% sure",
    "100 percent",
    "a_b c",
    "axb c",
    "path/to/x",
    "pathXto",
    "plain title",
    "PLAIN TITLE",
    "back\\slash",
    "mixed % _ / all",
    "",
]
TERMS = ["%", "_", "/", "100%", "a_b", "path/to", "plain", "\\", "% _ /", "x", "c", "//", "%%"]


async def _build(store: cortex.Store, tenant: str) -> None:
    n = 0
    for i, title in enumerate(TITLES):
        for scope in (tenant, f"{tenant}/a", f"{tenant}/a/b", f"{tenant}/z"):
            with use_scope(scope):
                agent = "bot" if n % 2 else "other"
                s = await store.create_session(
                    agent, title=title, is_default=(n % 5 == 0 and i == 0)
                )
                if n % 3 == 0:
                    await store.append_message(
                        s.id, NewMessage("user", f"said {TERMS[n % len(TERMS)]}")
                    )
                if n % 7 == 0:
                    await store.abort_session(s.id, "stop")
                elif n % 4 == 0:
                    await store.mark_interrupted(s.id, "stop")
                n += 1


async def test_distributed_listing_matches_plain(
    database: Database, store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    if CITUS_URL is not None:
        pytest.skip("compares the two forms on plain PostgreSQL")
    await _build(store, tenant)
    await _build(store, other_tenant)
    async with cortex.connect(database.app_url) as routed:
        routed._distributed = True
        mismatches = []
        for scope in (tenant, f"{tenant}/a"):
            for term in TERMS:
                for flt_kw in (
                    {},
                    {"exact": True},
                    {"agent_id": "bot"},
                    {"default_only": True},
                    {"state": SessionState.ABORTED},
                    {"state": SessionState.IDLE},
                    {"state": SessionState.INTERRUPTED},
                    {"limit": 3},
                    {"limit": 3, "offset": 2},
                    {"agent_id": "other", "state": SessionState.IDLE, "limit": 2, "offset": 1},
                ):
                    flt = ListFilter(search=term, **flt_kw)
                    with use_scope(scope):
                        a = [s.id for s in await store.list_sessions(flt)]
                        b = [s.id for s in await routed.list_sessions(flt)]
                        ca = await store.count_sessions(flt)
                        cb = await routed.count_sessions(flt)
                        ia, ib = [], []
                        if not flt.offset:
                            ia = [s.id async for s in store.iter_sessions(flt)]
                            ib = [s.id async for s in routed.iter_sessions(flt)]
                    if a != b or ca != cb or ia != ib:
                        mismatches.append(
                            (scope, term, flt_kw, len(a), len(b), ca, cb, len(ia), len(ib))
                        )
        assert mismatches == []
