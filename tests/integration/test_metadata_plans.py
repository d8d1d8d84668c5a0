"""A metadata filter reads its candidates from ``ix_sessions_metadata_pairs``, not the tenant's walk.

20,000 sessions of one tenant beside 20,000 of another, 1 % of each with
``{"channel": "web"}`` (fewer than a page's cap of candidates) and the rest
``{"channel": "email"}``, EXPLAIN
(ANALYZE) as the application role. Before revision 20261205000024 a page
filtered on the 1 % walked the tenant's listing index and dropped about a
hundred rows for each one it kept (docs/benchmarks.md, 2026-12-02).
"""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest

import cortex
from cortex._sql.predicates import METADATA_CANDIDATES
from cortex.scope import Scope
from tests import plans
from tests.conftest import Database


@pytest.fixture(scope="module")
def database(module_database: Database) -> Database:
    # The planner's choices here follow the statistics of every session in the database.
    return module_database


_SEED = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, scope_l3,
                      metadata_json, created_at, updated_at)
SELECT $1, gen_random_uuid(), 'agent-' || g % 5, $1 || '/proj' || g % 20 || '/user' || g % 50,
       3, $1 || '/proj' || g % 20, $1 || '/proj' || g % 20 || '/user' || g % 50,
       CASE WHEN g % 100 = 7 THEN '{"channel":"web","n":' || g || '}'
            ELSE '{"channel":"email","n":' || g || '}' END::json,
       now() - g * interval '1 second', now() - g * interval '1 second'
FROM generate_series(1, 20000) AS g
"""
_SEEDED: dict[str, str] = {}

WEB = {"channel": "web"}


async def _seeded(database: Database, owner_conn: asyncpg.Connection) -> str:
    if database.name not in _SEEDED:
        tenant, neighbour = (f"m{uuid.uuid4().hex[:12]}" for _ in range(2))
        for name in (tenant, neighbour):
            await owner_conn.execute(_SEED, name)
        await owner_conn.execute("VACUUM ANALYZE sessions")
        _SEEDED[database.name] = tenant
    return _SEEDED[database.name]


@pytest.mark.anyio
# The most rows a page may read: the tenant's candidates; in a project, the
# planner may read the project's 1,000 rows in order instead of 200 by key.
@pytest.mark.parametrize(("below", "most"), [("", 200), ("/proj7", 1000)])
async def test_a_selective_filter_reads_only_its_candidates(
    below: str,
    most: int,
    database: Database,
    owner_conn: asyncpg.Connection,
    app_conn: asyncpg.Connection,
) -> None:
    tenant = await _seeded(database, owner_conn)
    flt = cortex.ListFilter(metadata=WEB, limit=20)
    ids, rows, parsed = await plans.explain_filtered_page(
        app_conn, Scope.parse(tenant + below), flt
    )
    # The tenant's 200 matches, not the neighbour's: the tenant is in every hash.
    assert ids is not None
    assert len(ids) == 200
    assert len(rows) == 20
    assert plans.rows_read(parsed, "sessions") <= most
    assert all("Seq" not in str(scan.get("Node Type")) for scan in plans.scans(parsed, "sessions"))


@pytest.mark.anyio
async def test_the_candidates_come_from_the_index(
    database: Database, owner_conn: asyncpg.Connection
) -> None:
    """The function's query as installed, planned as it runs it: a bitmap of the matches only."""
    tenant = await _seeded(database, owner_conn)
    source = await owner_conn.fetchval(
        "SELECT prosrc FROM pg_proc WHERE oid = 'cortex_metadata_ids(text, jsonb, integer)'::regprocedure"
    )
    query = source.split("found := ARRAY(", 1)[1].split(");", 1)[0]
    for argument, placeholder in (("tenant", "$1"), ("filter", "$2"), ("cap", "$3")):
        query = re.sub(rf"\b{argument}\b", placeholder, query)
    async with owner_conn.transaction():
        settings = await owner_conn.fetchval(
            "SELECT proconfig FROM pg_proc"
            " WHERE oid = 'cortex_metadata_ids(text, jsonb, integer)'::regprocedure"
        )
        for setting in settings:
            name, value = setting.split("=", 1)
            await owner_conn.execute(f"SET LOCAL {name} = '{value}'")
        explained = await owner_conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + query, tenant, '{"channel":"web"}', 4000
        )
    parsed = plans.parsed(explained)
    names = {str(node.get("Index Name")) for node in plans.nodes(parsed)}
    assert "ix_sessions_metadata_pairs" in names
    assert plans.rows_read(parsed, "sessions") == 200


@pytest.mark.anyio
async def test_an_unselective_filter_walks_the_listing(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """More candidates than the cap: none are bound, and the walk finds a page in a few rows."""
    tenant = await _seeded(database, owner_conn)
    assert METADATA_CANDIDATES < 19_800
    assert METADATA_CANDIDATES > 200
    flt = cortex.ListFilter(metadata={"channel": "email"}, limit=20)
    ids, rows, parsed = await plans.explain_filtered_page(app_conn, Scope.parse(tenant), flt)
    assert ids is None
    assert len(rows) == 20
    assert plans.rows_read(parsed, "sessions") <= 40


@pytest.mark.anyio
async def test_the_candidates_answer_only_for_the_bound_tenant(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    tenant = await _seeded(database, owner_conn)
    call = 'SELECT public.cortex_metadata_ids($1, \'{"channel":"web"}\', 4000)'
    async with app_conn.transaction():
        assert await app_conn.fetchval(call, tenant) == []  # nothing bound
        await app_conn.execute("SET LOCAL cortex.tenant = 'someone'")
        assert await app_conn.fetchval(call, tenant) == []
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        assert len(await app_conn.fetchval(call, tenant)) == 200


@pytest.mark.anyio
async def test_a_session_without_metadata_has_no_entry(
    database: Database, owner_conn: asyncpg.Connection
) -> None:
    """The index is partial: an append to a session without metadata never touches it."""
    await _seeded(database, owner_conn)
    entries = await owner_conn.fetchval(
        "SELECT count(*) FROM sessions WHERE COALESCE(metadata_json::text, metadata::text) <> '{}'"
    )
    predicate = await owner_conn.fetchval(
        "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i"
        " WHERE i.indexrelid = 'ix_sessions_metadata_pairs'::regclass"
    )
    assert entries == 40_000
    assert "<> '{}'" in predicate
