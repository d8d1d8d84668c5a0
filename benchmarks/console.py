"""Scenario ``console``: the operator console's page of waiting sessions, across tenants, at scale.

Seeds N sessions (default 1,000,000; ``benchmarks.seed``, 100 tenants, org0
holding 20 %), then makes every 100th session paused (one open question),
every 300th interrupted and every 500th aborted (a marker each), as cortex
would have left them. A login granted ``cortex_console`` then reads pages of
50 through :class:`cortex.OperatorView`: every tenant's first page and a page
20 pages deep (by cursor), one tenant's, a project's, one agent's, a title
search and the aborted sessions. p50/p95 of each, one call at a time. Not
part of ``all``: it seeds its own data set.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from benchmarks._common import BenchDatabase, percentile
from benchmarks.seed import seed
from cortex import OperatorView, SessionState, WaitingFilter, WaitingPage
from cortex._db.engine import driver_dsn


@dataclass(frozen=True)
class Params:
    sessions: int = 1_000_000
    repeats: int = 200  # timed calls per query


# Every 100th, 300th and 500th session by a hash of its id: paused, interrupted, aborted.
_HASH = "abs(hashtext(id::text || '{salt}')) % {n} = 0"
_PAUSE = (
    "WITH picked AS (UPDATE sessions SET pending_count = 1 WHERE "
    + _HASH.format(n=100, salt="p")
    + " RETURNING tenant_id, id, updated_at)"
    " INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message, raised_at)"
    " SELECT tenant_id, id, 1, 'approve', 'Approve the refund of order ' || left(id::text, 8) || '?',"
    " updated_at FROM picked"
)
_INTERRUPT = (
    "WITH picked AS (UPDATE sessions SET is_interrupted = true WHERE "
    + _HASH.format(n=300, salt="i")
    + " RETURNING tenant_id, id, scope, updated_at)"
    " INSERT INTO session_markers (tenant_id, session_id, kind, scope, reason, marked_at)"
    " SELECT tenant_id, id, 'interrupted', scope, 'drained for a deploy', updated_at FROM picked"
)
_ABORT = (
    "WITH picked AS (UPDATE sessions SET is_aborted = true, pending_count = 0 WHERE "
    + _HASH.format(n=500, salt="a")
    + " RETURNING tenant_id, id, scope, updated_at)"
    " INSERT INTO session_markers (tenant_id, session_id, kind, scope, reason, marked_at)"
    " SELECT tenant_id, id, 'aborted', scope, 'stuck', updated_at FROM picked"
)


async def _make_waiting(owner: str) -> dict[str, int]:
    conn = await asyncpg.connect(owner)
    try:
        for sql in (_PAUSE, _INTERRUPT, _ABORT):
            await conn.execute(sql)
        await conn.execute(
            "DELETE FROM pending_inputs p USING sessions s WHERE s.tenant_id ="
            " p.tenant_id AND s.id = p.session_id AND s.is_aborted"
        )
        await conn.execute("VACUUM ANALYZE sessions")
        await conn.execute("VACUUM ANALYZE pending_inputs")
        await conn.execute("VACUUM ANALYZE session_markers")
        rows = await conn.fetch("SELECT state, count(*) AS n FROM sessions GROUP BY state")
        return {r["state"]: int(r["n"]) for r in rows}
    finally:
        await conn.close()


async def _console_login(db: BenchDatabase) -> tuple[str, str]:
    role = f"cortex_bench_console_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(db.owner_url)
    try:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        await conn.execute(f'GRANT cortex_console TO "{role}"')
    finally:
        await conn.close()
    return role, driver_dsn(db.owner_url, user=role)


async def _timed(call: Callable[[], Awaitable[WaitingPage]], repeats: int) -> dict[str, Any]:
    await call()  # warm: the connection, the plan
    samples = []
    rows = 0
    for _ in range(repeats):
        started = time.perf_counter()
        page = await call()
        samples.append((time.perf_counter() - started) * 1000)
        rows = len(page.rows)
    return {
        "p50_ms": round(percentile(samples, 50), 3),
        "p95_ms": round(percentile(samples, 95), 3),
        "rows": rows,
    }


async def _deep_cursor(view: OperatorView, pages: int) -> str | None:
    cursor = None
    for _ in range(pages):
        page = await view.list_waiting(WaitingFilter(), cursor)
        cursor = page.next_cursor
    return cursor


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    started = time.perf_counter()
    await seed(db.owner_url, sessions=p.sessions, messages_per_session=0)
    states = await _make_waiting(db.owner_url)
    print(f"  seeded {p.sessions:,} sessions in {time.perf_counter() - started:.0f} s: {states}")
    role, url = await _console_login(db)
    results: list[dict[str, Any]] = []
    ok = True
    try:
        async with OperatorView(url, operator_scope=None, pool_size=1) as every:
            deep = await _deep_cursor(every, 20)
            async with (
                OperatorView(url, operator_scope="org0", pool_size=1) as org0,
                OperatorView(url, operator_scope="org0/proj1", pool_size=1) as proj,
            ):
                cases: list[tuple[str, Callable[[], Awaitable[WaitingPage]]]] = [
                    ("every tenant, paused, first page", lambda: every.list_waiting()),
                    ("every tenant, paused, page 21", lambda: every.list_waiting(None, deep)),
                    ("tenant org0 (20 %), paused", lambda: org0.list_waiting()),
                    ("project org0/proj1, paused", lambda: proj.list_waiting()),
                    (
                        "every tenant, paused, agent-1",
                        lambda: every.list_waiting(WaitingFilter(agent_id="agent-1")),
                    ),
                    (
                        "every tenant, paused, tenant org5 filter",
                        lambda: every.list_waiting(WaitingFilter(tenant="org5")),
                    ),
                    (
                        "every tenant, aborted",
                        lambda: every.list_waiting(WaitingFilter(state=SessionState.ABORTED)),
                    ),
                ]
                for name, call in cases:
                    measured = await _timed(call, p.repeats)
                    ok = ok and measured["rows"] <= 50
                    results.append({"name": name, **measured})
                    print(
                        f"  {name:<45} p50 {measured['p50_ms']:>7.2f} ms"
                        f"  p95 {measured['p95_ms']:>7.2f} ms  rows {measured['rows']}"
                    )
    finally:
        conn = await asyncpg.connect(db.owner_url)
        try:
            await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        finally:
            await conn.close()
    return results, ok
