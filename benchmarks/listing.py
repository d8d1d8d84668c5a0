"""Scenario ``listing``: list and count at scale, beside the floor, with each plan's key line.

Seeds N sessions (default 1,000,000; ``benchmarks.seed``: set-based, with a
progress bar) across 100 tenants (org0 holds 20 %), three depths and five
agents, gives 0.5 % of them a pending input, then measures p50/p95 of each
listing shape through ``list_sessions``/``count_sessions`` and through raw
asyncpg running the same SQL, both as the application role under row-level
security. Offset pages at depth 0 / 1,000 / 100,000 are set against the keyset
page ``iter_sessions`` fetches at the same depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import asyncpg

import cortex
from benchmarks._common import (
    BenchDatabase,
    Floor,
    Result,
    Side,
    latency_ratio,
    listing_sql,
)
from benchmarks.seed import seed
from cortex import ListFilter, SessionState, use_scope
from cortex._calls.sessions import select_page
from cortex._db.transaction import begin_sql, run_transaction
from cortex.scope import Scope


@dataclass(frozen=True)
class Params:
    sessions: int = 1_000_000
    repeats: int = 200  # timed calls per side per query
    blocks: int = 4


@dataclass(frozen=True)
class Query:
    name: str
    scope: str
    flt: ListFilter
    count: bool = False
    depth: int = 0  # > 0: a keyset page at this depth instead of an offset
    repeats: int = 0  # > 0: timed calls per side for this query instead of the scenario's


def queries(org0_size: int) -> list[Query]:
    deep = min(100_000, max(0, org0_size - 100))
    mid = min(1_000, deep)
    a1 = "agent-1"
    return [
        Query("page: tenant org0 (large subtree)", "org0", ListFilter()),
        Query("page: tenant org0 + agent", "org0", ListFilter(agent_id=a1)),
        Query("page: project org0/proj1", "org0/proj1", ListFilter()),
        Query("page: project org5/proj3 (small subtree)", "org5/proj3", ListFilter()),
        Query("page: project org5/proj3 + agent", "org5/proj3", ListFilter(agent_id=a1)),
        Query("page: exact scope org0/proj1/user7", "org0/proj1/user7", ListFilter(exact=True)),
        Query("page: exact tenant level org0", "org0", ListFilter(exact=True)),
        Query("page: by agent in org5", "org5", ListFilter(agent_id=a1)),
        Query("page: user subtree org0/proj1/user7", "org0/proj1/user7", ListFilter()),
        Query("page: default only, org0", "org0", ListFilter(default_only=True)),
        Query(
            "page: default only, project org0/proj1", "org0/proj1", ListFilter(default_only=True)
        ),
        Query(
            "page: default only, exact tenant level org0",
            "org0",
            ListFilter(default_only=True, exact=True),
        ),
        Query(
            "page: default only, org0 + agent", "org0", ListFilter(default_only=True, agent_id=a1)
        ),
        Query("page: state=paused, org0", "org0", ListFilter(state=SessionState.PAUSED)),
        Query("search 'zanzibar', org5/proj3", "org5/proj3", ListFilter(search="zanzibar")),
        Query("search 'invoice', org0/proj1", "org0/proj1", ListFilter(search="invoice")),
        Query("search 'zanzibar', whole org5", "org5", ListFilter(search="zanzibar")),
        Query("search 'zanzibar', whole org0", "org0", ListFilter(search="zanzibar")),
        Query("count: tenant org0", "org0", ListFilter(), count=True),
        Query("count: tenant org0 + agent", "org0", ListFilter(agent_id=a1), count=True),
        Query("count: project org0/proj1", "org0/proj1", ListFilter(), count=True),
        Query("count: project org5/proj3", "org5/proj3", ListFilter(), count=True),
        Query(
            "count: exact org0/proj1/user7", "org0/proj1/user7", ListFilter(exact=True), count=True
        ),
        Query("count: by agent in org5", "org5", ListFilter(agent_id=a1), count=True),
        Query("count: default only, org0", "org0", ListFilter(default_only=True), count=True),
        Query(
            "count: state=paused, org0", "org0", ListFilter(state=SessionState.PAUSED), count=True
        ),
        Query(
            "count: search 'zanzibar', whole org0",
            "org0",
            ListFilter(search="zanzibar"),
            count=True,
        ),
        Query("count: search 'invoice', org5", "org5", ListFilter(search="invoice"), count=True),
        Query("offset page at 0, org0", "org0", ListFilter(offset=0)),
        Query(f"offset page at {mid:,}, org0", "org0", ListFilter(offset=mid)),
        Query(f"offset page at {deep:,}, org0", "org0", ListFilter(offset=deep)),
        Query("iter page at 0, org0 (keyset)", "org0", ListFilter(), depth=0),
        Query(f"iter page at {mid:,}, org0 (keyset)", "org0", ListFilter(), depth=mid),
        Query(f"iter page at {deep:,}, org0 (keyset)", "org0", ListFilter(), depth=deep),
    ]


async def _mark_paused(owner_url: str) -> None:
    conn = await asyncpg.connect(owner_url)
    try:
        await conn.execute(
            """
            WITH pick AS (
                SELECT tenant_id, id, message_count FROM sessions
                WHERE hashint8extended(abs(hashtext(id::text))::bigint, 3) % 200 = 0
            )
            INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message, raised_at)
            SELECT tenant_id, id, message_count, 'approve', 'Approve?', now() FROM pick
            """
        )
        await conn.execute(
            "UPDATE sessions s SET pending_count = 1 FROM pending_inputs p "
            "WHERE s.tenant_id = p.tenant_id AND s.id = p.session_id"
        )
        await conn.execute("VACUUM ANALYZE sessions")
    finally:
        await conn.close()


async def _cursor_at(owner_url: str, tenant: str, depth: int) -> tuple[Any, Any] | None:
    if depth == 0:
        return None
    conn = await asyncpg.connect(owner_url)
    try:
        row = await conn.fetchrow(
            "SELECT updated_at, id FROM sessions WHERE tenant_id = $1 "
            "ORDER BY updated_at DESC, id DESC OFFSET $2 LIMIT 1",
            tenant,
            depth - 1,
        )
    finally:
        await conn.close()
    return None if row is None else (row["updated_at"], row["id"])


async def plan_line(app_url: str, tenant: str, sql: str, args: list[Any], custom: bool) -> str:
    """The key line of the plan the application role gets: index used, rows."""
    conn = await asyncpg.connect(app_url, statement_cache_size=0)
    try:
        async with conn.transaction():
            # cortex's binding (its BEGIN message without the BEGIN).
            binding = begin_sql(Scope.parse(tenant), custom_plans=custom).split(";", 1)[1]
            await conn.execute(binding)
            rows = await conn.fetch("EXPLAIN (ANALYZE, COSTS OFF) " + sql, *args)
    finally:
        await conn.close()
    lines = [str(r[0]).strip() for r in rows]
    # The scan that reads sessions: not the scope-state probe (an InitPlan on
    # scope_data that every session read carries, and skips when it is empty).
    for wanted in (" on sessions", "Scan"):
        for line in lines:
            if "Scan" in line and wanted in line:
                return line.replace("->  ", "")[:110]
    return lines[0][:110]


async def run(db: BenchDatabase, p: Params) -> tuple[list[Result], bool]:
    started = time.perf_counter()
    await seed(db.owner_url, sessions=p.sessions)
    await _mark_paused(db.owner_url)
    print(f"  seeded {p.sessions:,} sessions in {time.perf_counter() - started:.0f} s")
    org0 = await tenant_size(db.owner_url, "org0")
    return await measure(db, queries(org0), repeats=p.repeats, blocks=p.blocks), True


async def tenant_size(owner_url: str, tenant: str) -> int:
    """How many sessions ``tenant`` holds."""
    conn = await asyncpg.connect(owner_url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM sessions WHERE tenant_id = $1", tenant)
        )
    finally:
        await conn.close()


async def measure(db: BenchDatabase, qs: list[Query], *, repeats: int, blocks: int) -> list[Result]:
    """p50/p95 of each query through the store and through raw asyncpg, in alternating blocks."""
    results: list[Result] = []
    async with cortex.connect(db.app_url, pool_size=2, max_overflow=0) as store:
        pool = await asyncpg.create_pool(db.app_url, min_size=2, max_size=2)
        assert pool is not None
        floor = Floor(pool)
        try:
            for q in qs:
                scope = Scope.parse(q.scope)
                cursor = await _cursor_at(db.owner_url, scope.tenant, q.depth)
                sql, args = listing_sql(
                    scope,
                    q.flt,
                    distributed=store.distributed,
                    count=q.count,
                    keyset=q.name.startswith("iter"),
                    cursor=cursor,
                )
                custom = bool(q.flt.search)

                async def cortex_call(
                    q: Query = q, scope: Scope = scope, cursor: Any = cursor
                ) -> None:
                    with use_scope(scope):
                        if q.count:
                            await store.count_sessions(q.flt)
                        elif q.name.startswith("iter"):
                            # Exactly the call iter_sessions makes for its page at this depth.
                            await run_transaction(
                                store.engine,
                                scope,
                                partial(
                                    select_page,
                                    scope=scope,
                                    flt=q.flt,
                                    limit=q.flt.page_size,
                                    after=cursor,
                                    distributed=store.distributed,
                                ),
                            )
                        else:
                            await store.list_sessions(q.flt)

                async def floor_call(
                    scope: Scope = scope,
                    sql: str = sql,
                    args: list[Any] = args,
                    custom: bool = custom,
                ) -> None:
                    await floor.run(scope.tenant, sql, args, custom_plans=custom)

                cortex_side, floor_side = Side(), Side()
                reps = max(1, (q.repeats or repeats) // (blocks // 2 or 1))
                for block in range(blocks):
                    side, call = (
                        (cortex_side, cortex_call) if block % 2 == 0 else (floor_side, floor_call)
                    )
                    await call()  # warm the statement caches outside the timing
                    begin = time.perf_counter()
                    for _ in range(reps):
                        t = time.perf_counter()
                        await call()
                        side.latencies.append(time.perf_counter() - t)
                        side.ops += 1
                    side.wall += time.perf_counter() - begin
                plan = await plan_line(db.app_url, scope.tenant, sql, args, custom)
                result = Result(
                    q.name,
                    cortex_side.summary(),
                    floor_side.summary(),
                    latency_ratio(cortex_side, floor_side, "p95_ms"),
                    note=plan,
                )
                c, f = result.cortex, result.floor
                print(
                    f"  {q.name:<42} cortex p50 {c['p50_ms']:7.2f} p95 {c['p95_ms']:7.2f} ms"
                    f" | floor p50 {f['p50_ms']:7.2f} p95 {f['p95_ms']:7.2f} ms | ratio {result.ratio:4.2f}"
                )
                print(f"      plan: {plan}")
                results.append(result)
        finally:
            await pool.close()
    return results
