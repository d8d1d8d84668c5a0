"""A console page of waiting sessions is one index walk that reads only the page, across tenants.

20,000 sessions over 40 tenants, a quarter paused and a seventh aborted (as many waiting sessions as 1,000,000 with one in a hundred waiting);
EXPLAIN (ANALYZE) as ``cortex_console`` under a generic plan (the one a
prepared statement settles on): every tenant's page, the page after a
cursor and the aborted page may not sort, scan a table whole, or read a
session row they do not return (revision 20261205000025's
``ix_sessions_console_recent``, and the policy's test as a function the
planner gives a third of the rows: with the expression inline it expected a
few rows and sorted every waiting session). One tenant's or project's page
reads only the tenant's waiting sessions, through an index, and may sort them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from cortex._db.executor import compile_statement
from cortex._sql import console as sql
from cortex._sql.params import (
    AFTER_ID,
    AFTER_TENANT,
    AFTER_UPDATED_AT,
    C_TENANT,
    LIMIT,
)
from cortex._sql.predicates import scope_params
from cortex.scope import Scope
from tests import plans
from tests.conftest import Database, admin, asyncpg_dsn, with_user

pytestmark = pytest.mark.anyio

PAGE = 50

_SEED = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, title,
                      created_at, updated_at, pending_count, is_aborted)
SELECT 't' || (g % 40), gen_random_uuid(), 'agent-' || (g % 5),
       't' || (g % 40) || '/proj' || (g % 7), 2, 't' || (g % 40) || '/proj' || (g % 7),
       'session ' || g, now() - g * interval '1 second', now() - g * interval '1 second',
       CASE WHEN g % 4 = 0 THEN 1 ELSE 0 END, g % 7 = 1
FROM generate_series(1, 20000) AS g
"""
_QUESTIONS = """
INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message, raised_at)
SELECT tenant_id, id, 1, 'i1', 'approve?', updated_at FROM sessions WHERE pending_count > 0
"""


@pytest.fixture(scope="module")
def database(module_database: Database) -> Database:
    # The planner's choices here follow the statistics of every session in the database.
    return module_database


@pytest.fixture(scope="module")
def console_url(database: Database) -> Iterator[str]:
    role = f"console_plans_{uuid.uuid4().hex[:10]}"
    asyncio.run(
        admin(
            database.owner_url,
            f'CREATE ROLE "{role}" LOGIN',
            f'GRANT cortex_console TO "{role}"',
            _SEED,
            _QUESTIONS,
            "VACUUM ANALYZE sessions",
            "VACUUM ANALYZE pending_inputs",
        )
    )
    yield with_user(database.owner_url, role)
    asyncio.run(admin(database.owner_url, f'DROP ROLE IF EXISTS "{role}"'))


async def _explain(
    url: str, setting: str, stmt: Any, values: dict[str, Any]
) -> tuple[list[asyncpg.Record], Any]:
    compiled = compile_statement(stmt)
    args = [values[name] if name in values else compiled.fixed[name] for name in compiled.order]
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with conn.transaction():
            await conn.execute(sql.ROLE_STATEMENT)
            await conn.execute("SELECT set_config('cortex.operator_scope', $1, true)", setting)
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            rows = await conn.fetch(compiled.sql, *args)
            import os

            if os.environ.get("SHOWPLAN"):
                for r in await conn.fetch("EXPLAIN " + compiled.sql, *args):
                    print(r[0])
            explained = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.sql, *args)
    finally:
        await conn.close()
    return rows, plans.parsed(explained)


_FAR = {AFTER_UPDATED_AT: datetime.now(UTC), AFTER_ID: uuid.UUID(int=0), AFTER_TENANT: ""}


@pytest.mark.parametrize(
    ("case", "state", "scope", "tenant", "after", "strict"),
    [
        ("every tenant", "paused", None, None, False, True),
        ("every tenant, after a cursor", "paused", None, None, True, True),
        ("one tenant by scope", "paused", "t8", None, False, False),
        ("one project by scope", "paused", "t0/proj0", None, False, False),
        ("one tenant by filter", "paused", None, "t8", False, False),
        ("every tenant, aborted", "aborted", None, None, False, True),
    ],
)
async def test_a_console_page_is_one_index_walk_of_its_own_rows(
    case: str,
    state: str,
    scope: str | None,
    tenant: str | None,
    after: bool,
    strict: bool,
    console_url: str,
) -> None:
    bound = None if scope is None else Scope.parse(scope)
    kind = sql.ALL if bound is None else (sql.TENANT if bound.depth == 1 else sql.SUBTREE)
    stmt = sql.waiting_statement(
        state, kind, tenant=tenant is not None, agent=False, search=False, after=after
    )
    values: dict[str, Any] = {LIMIT: PAGE}
    if bound is not None:
        values |= scope_params(bound)
    if tenant is not None:
        values[C_TENANT] = tenant
    if after:
        values |= _FAR
    rows, parsed = await _explain(console_url, "/" if bound is None else f"{bound}/", stmt, values)
    assert rows, case
    scans = plans.scans(parsed, "sessions")
    assert scans
    for node in plans.nodes(parsed):
        assert node.get("Node Type") != "Seq Scan", (case, node.get("Relation Name"))
        if node.get("Node Type") == "Sort" and strict:
            # A session's own questions may be sorted; never the sessions.
            sorted_rows = sum(plans.rows_returned(child) for child in node["Plans"])
            assert sorted_rows <= 1, (case, node)
    if not strict:
        # One tenant's waiting sessions, read through an index on (tenant or state):
        # the planner may sort them, they are never the tenant's idle ones.
        names = {str(s.get("Index Name")) for s in scans if s.get("Index Name")}
        assert names <= {"ix_sessions_state_recent", "ix_sessions_console_recent", "pk_sessions"}
        return
    # Every session row read is a row of the page (the policy's own probe aside).
    read = plans.rows_read(parsed, "sessions") - plans.rows_read(parsed, "pending_inputs")
    assert read == len(rows), [
        (s.get("Index Name"), s.get("Actual Rows"), s.get("Rows Removed by Filter")) for s in scans
    ]
