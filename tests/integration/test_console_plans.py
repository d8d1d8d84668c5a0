"""A console page of waiting sessions is one index walk that reads only the page, across tenants.

20,000 sessions over 40 tenants, one in 53 paused and one in 151 aborted;
EXPLAIN (ANALYZE) as ``cortex_console`` under a generic plan (the one a
prepared statement settles on): every tenant's page, the page after a
cursor, one tenant's page (by scope and by filter) and the aborted page. No
shape may sort, scan a table whole, or read a session row it does not return
(revision 20261205000025's ``ix_sessions_console_recent``; without it every
tenant's page read and sorted every waiting session).
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
       CASE WHEN g % 53 = 0 THEN 1 ELSE 0 END, g % 151 = 1
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
            explained = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.sql, *args)
    finally:
        await conn.close()
    return rows, plans.parsed(explained)


_FAR = {AFTER_UPDATED_AT: datetime.now(UTC), AFTER_ID: uuid.UUID(int=0), AFTER_TENANT: ""}


@pytest.mark.parametrize(
    ("case", "state", "scope", "tenant", "after"),
    [
        ("every tenant", "paused", None, None, False),
        ("every tenant, after a cursor", "paused", None, None, True),
        ("one tenant by scope", "paused", "t7", None, False),
        ("one project by scope", "paused", "t0/proj0", None, False),
        ("one tenant by filter", "paused", None, "t7", False),
        ("every tenant, aborted", "aborted", None, None, False),
    ],
)
async def test_a_console_page_is_one_index_walk_of_its_own_rows(
    case: str, state: str, scope: str | None, tenant: str | None, after: bool, console_url: str
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
    for node in plans.nodes(parsed):
        assert node.get("Node Type") not in ("Sort", "Seq Scan"), (case, node.get("Node Type"))
    scans = plans.scans(parsed, "sessions")
    assert scans
    for scan in scans:
        assert "Index" in str(scan.get("Node Type")), scan
    # Every session row read is a row of the page.
    assert plans.rows_read(parsed, "sessions") == len(rows), [
        (s.get("Index Name"), s.get("Actual Rows"), s.get("Rows Removed by Filter")) for s in scans
    ]
