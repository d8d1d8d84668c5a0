"""A metadata filter reads its candidates from ``metadata_pairs``, newest hours first.

20,000 sessions of one tenant beside 20,000 of another, updated a second
apart over the six whole hours before this one (a clock early in its hour
would leave the newest hour nearly empty, and the plans would follow the
minute the tests ran), 1 % of each with ``{"channel": "web"}`` and the
rest ``{"channel": "email"}``, EXPLAIN (ANALYZE) as the application role.
Before revision 20261205000024 a page filtered on the 1 % walked the
tenant's listing index and dropped about a hundred rows for each one it
kept; with 24's index it read every match (docs/benchmarks.md, 2026-12-02).
"""

from __future__ import annotations

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
       date_trunc('hour', now()) - g * interval '1 second',
       date_trunc('hour', now()) - g * interval '1 second'
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
async def test_a_selective_filter_reads_only_its_newest_hours(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """A page reads the matches of the newest hours holding a page (36 an hour here)."""
    tenant = await _seeded(database, owner_conn)
    flt = cortex.ListFilter(metadata=WEB, limit=20)
    ids, rows, parsed = await plans.explain_filtered_page(app_conn, Scope.parse(tenant), flt)
    # The tenant's matches of its newest hours, not the neighbour's: the tenant is in every hash.
    assert ids is not None
    assert 20 <= len(ids) <= 80
    assert len(rows) == 20
    assert plans.rows_read(parsed, "sessions") <= 80
    assert all("Seq" not in str(scan.get("Node Type")) for scan in plans.scans(parsed, "sessions"))


@pytest.mark.anyio
async def test_a_subtree_walks_its_own_listing(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """The candidates are the tenant's: a project's page walks the project's rows instead."""
    tenant = await _seeded(database, owner_conn)
    flt = cortex.ListFilter(metadata=WEB, limit=20)
    ids, rows, parsed = await plans.explain_filtered_page(
        app_conn, Scope.parse(tenant + "/proj7"), flt
    )
    assert ids is None
    assert len(rows) == 20  # every match of the tenant is in proj7
    assert plans.rows_read(parsed, "sessions") <= 1000


@pytest.mark.anyio
async def test_the_candidates_come_from_the_pairs_key(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """The candidates' statement as the application role: index-only reads of a page's hours."""
    from cortex._db.executor import compile_statement
    from cortex._sql.predicates import metadata_candidate_params, metadata_candidates_statement

    tenant = await _seeded(database, owner_conn)
    await owner_conn.execute("VACUUM ANALYZE metadata_pairs")
    found = compile_statement(metadata_candidates_statement(1, before=False))
    given = metadata_candidate_params(
        Scope.parse(tenant), cortex.ListFilter(metadata=WEB), skip=19, cap=METADATA_CANDIDATES
    )
    args = [given[n] if n in given else found.fixed[n] for n in found.order]
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        explained = await app_conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + found.sql, *args)
    parsed = plans.parsed(explained)
    scans = [node for node in plans.nodes(parsed) if node.get("Relation Name") == "metadata_pairs"]
    assert scans
    assert all(node.get("Index Name") == "pk_metadata_pairs" for node in scans)
    assert sum(int(node.get("Actual Rows", 0)) for node in scans) <= 200
    assert "sessions" not in {node.get("Relation Name") for node in plans.nodes(parsed)}


@pytest.mark.anyio
async def test_an_unselective_filter_walks_the_listing(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """More candidates in a page's newest hour than the cap: none are bound, and the walk finds a page."""
    tenant = await _seeded(database, owner_conn)
    assert METADATA_CANDIDATES < 3_500
    assert METADATA_CANDIDATES > 200
    flt = cortex.ListFilter(metadata={"channel": "email"}, limit=20)
    ids, rows, parsed = await plans.explain_filtered_page(app_conn, Scope.parse(tenant), flt)
    assert ids is None
    assert len(rows) == 20
    assert plans.rows_read(parsed, "sessions") <= 40


@pytest.mark.anyio
async def test_the_pairs_answer_only_for_the_bound_tenant(
    database: Database, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    tenant = await _seeded(database, owner_conn)
    count = "SELECT count(*) FROM metadata_pairs WHERE tenant_id = $1"
    async with app_conn.transaction():
        assert await app_conn.fetchval(count, tenant) == 0  # nothing bound
        await app_conn.execute("SET LOCAL cortex.tenant = 'someone'")
        assert await app_conn.fetchval(count, tenant) == 0
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        assert await app_conn.fetchval(count, tenant) == 40_000  # two keys a session
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app_conn.execute(
                "INSERT INTO metadata_pairs VALUES ($1, 1, 1, gen_random_uuid())", tenant
            )


@pytest.mark.anyio
async def test_a_session_without_metadata_has_no_pairs(
    database: Database, owner_conn: asyncpg.Connection
) -> None:
    await _seeded(database, owner_conn)
    without = await owner_conn.fetchval(
        "SELECT count(*) FROM sessions AS s WHERE COALESCE(s.metadata_json::text, s.metadata::text)"
        " = '{}' AND EXISTS (SELECT FROM metadata_pairs AS m"
        " WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id)"
    )
    assert without == 0
