"""Every listing page shape is one index walk that reads only the page, under the plan the store runs.

On plain PostgreSQL the routines run generic plans (cortex._db.routines
ROUTINE_SETTINGS): one plan per shape, whatever the scope, the agent or the
page size, so a shape whose generic plan sorted or filtered its way to a
page would be slow for every caller. On Citus the workers plan each call.
Twenty-four shapes (whole tenant, project, user, exact scope at three
depths; with and without an agent; with and without ``default_only``) over
20,000 sessions of one tenant beside 20,000 of another, EXPLAIN (ANALYZE)
as the application role: no shape may sort more than a page, and every
session row read must be one the page returns. The user's subtree (depth 3,
docs/query-plans.md P8) read the tenant's or the project's index and dropped
the other users' rows until revision 20261201000016 gave it ``scope_l3``.
"""

from __future__ import annotations

import itertools
import uuid

import asyncpg
import pytest

import cortex
from cortex.scope import Scope
from tests import plans
from tests.conftest import Database


@pytest.fixture(scope="module")
def database(module_database: Database) -> Database:
    # The planner's choices here follow the statistics of every session in the database.
    return module_database


pytestmark = pytest.mark.citus

_SEED = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, scope_l3,
                      created_at, updated_at)
SELECT $1, gen_random_uuid(), 'agent-' || agent,
       CASE depth WHEN 1 THEN $1 WHEN 2 THEN $1 || '/proj' || proj
            ELSE $1 || '/proj' || proj || '/user' || usr END,
       depth, CASE WHEN depth >= 2 THEN $1 || '/proj' || proj END,
       CASE WHEN depth >= 3 THEN $1 || '/proj' || proj || '/user' || usr END,
       now() - g * interval '1 second', now() - g * interval '1 second'
FROM (SELECT g, abs(hashint4(g)) % 5 AS agent, abs(hashint4(g + 1)) % 20 AS proj,
             abs(hashint4(g + 2)) % 50 AS usr,
             CASE WHEN g % 50 = 0 THEN 1 WHEN g % 10 = 0 THEN 2 ELSE 3 END AS depth
      FROM generate_series(1, 20000) AS g) AS s
"""
# The oldest session of about a third of the (agent, scope) pairs is their
# default, and of every pair of agent-1 (so an exact default-only page of it
# has its one row).
_DEFAULTS = """
UPDATE sessions SET is_default = true
WHERE id IN (SELECT DISTINCT ON (agent_id, scope) id FROM sessions
             WHERE tenant_id = $1
               AND (abs(hashtext(agent_id || scope)) % 3 = 0 OR agent_id = 'agent-1')
             ORDER BY agent_id, scope, created_at)
"""

_SCOPES = (
    ("", False),
    ("/proj1", False),
    ("/proj1/user21", False),
    ("", True),
    ("/proj1", True),
    ("/proj1/user21", True),
)
# One seeded tenant (and a neighbour) per test database, shared by the cases.
_SEEDED: dict[str, str] = {}


async def _seeded(database: Database, owner_conn: asyncpg.Connection) -> str:
    if database.name not in _SEEDED:
        tenant, neighbour = (f"p{uuid.uuid4().hex[:12]}" for _ in range(2))
        for name in (tenant, neighbour):
            await owner_conn.execute(_SEED, name)
            await owner_conn.execute(_DEFAULTS, name)
        await owner_conn.execute("ANALYZE sessions")
        _SEEDED[database.name] = tenant
    return _SEEDED[database.name]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("below", "exact", "agent", "default_only"),
    [
        (below, exact, agent, default_only)
        for (below, exact), agent, default_only in itertools.product(
            _SCOPES, (None, "agent-1"), (False, True)
        )
    ],
)
async def test_a_page_is_one_index_walk_of_its_own_rows(
    below: str,
    exact: bool,
    agent: str | None,
    default_only: bool,
    database: Database,
    owner_conn: asyncpg.Connection,
    app_conn: asyncpg.Connection,
) -> None:
    tenant = await _seeded(database, owner_conn)
    scope = Scope.parse(tenant + below)
    flt = cortex.ListFilter(exact=exact, agent_id=agent, default_only=default_only, limit=20)
    rows, parsed = await plans.explain_page(app_conn, scope, flt)
    assert rows  # every shape has sessions to list
    for node in plans.nodes(parsed):
        if node.get("Node Type") == "Sort":
            sorted_rows = sum(plans.rows_returned(child) for child in node["Plans"])
            assert sorted_rows <= flt.page_size, node
    scans = plans.scans(parsed, "sessions")
    assert scans
    for scan in scans:
        assert "Index" in str(scan.get("Node Type")), scan
    # Every row read is a row of the page: nothing filtered out of the heap.
    assert plans.rows_read(parsed, "sessions") == len(rows), [
        (s.get("Index Name"), s.get("Actual Rows"), s.get("Rows Removed by Filter")) for s in scans
    ]
