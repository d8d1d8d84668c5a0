"""Scenario ``append``: the transactional message-counter path.

N appends of k messages through ``append_messages`` with C concurrent
writers, (a) all on one hot session, (b) each writer on its own session,
(c) spread over many sessions of one tenant; the floor runs the same
one-statement append through raw asyncpg. After each mode every session's
``message_count`` must equal its rows and ``seq`` must be 1..n: a mismatch
fails the run, loudly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import asyncpg

import cortex
from benchmarks._common import (
    BenchDatabase,
    Floor,
    Result,
    SameSql,
    Side,
    alternate,
    print_result,
    throughput_ratio,
    timed_workers,
)
from cortex import NewMessage, use_scope
from cortex.ids import parse_id
from cortex.scope import Scope

SCOPE = Scope.parse("bench/team/user")


@dataclass(frozen=True)
class Params:
    n: int = 4000  # appends per side per mode
    concurrency: int = 8
    k: int = 1  # messages per append
    sessions: int = 200  # mode (c)
    blocks: int = 4


async def check_invariants(owner_url: str) -> list[str]:
    """Sessions whose counter disagrees with their rows, or whose seq has gaps."""
    conn = await asyncpg.connect(owner_url)
    try:
        rows = await conn.fetch(
            """
            SELECT s.id, s.message_count, count(m.id) AS n,
                   coalesce(max(m.seq), 0) AS max_seq, count(DISTINCT m.seq) AS distinct_seq
            FROM sessions s LEFT JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id
            GROUP BY s.id, s.message_count
            HAVING s.message_count <> count(m.id) OR coalesce(max(m.seq), 0) <> count(m.id)
                OR count(DISTINCT m.seq) <> count(m.id)
            """
        )
    finally:
        await conn.close()
    return [
        f"{r['id']}: count {r['message_count']} rows {r['n']} max seq {r['max_seq']}" for r in rows
    ]


async def run(db: BenchDatabase, p: Params) -> tuple[list[Result], bool]:
    results: list[Result] = []
    invariants_ok = True
    text = "hello from the benchmark"
    pool_size = p.concurrency
    async with cortex.connect(db.app_url, pool_size=pool_size, max_overflow=0) as store:
        pool = await asyncpg.create_pool(db.app_url, min_size=pool_size, max_size=pool_size)
        assert pool is not None
        # The floor sends exactly cortex's SQL, compiled once, outside any timing.
        floor = SameSql(Floor(pool), SCOPE)
        try:
            with use_scope(SCOPE):
                many = [(await store.create_session("bench")).id for _ in range(p.sessions)]
                own = [(await store.create_session("bench")).id for _ in range(p.concurrency)]
                hot = (await store.create_session("bench")).id
            modes: dict[str, Any] = {
                "a) one hot session": lambda w, i: hot,
                "b) own session per writer": lambda w, i: own[w],
                "c) many sessions, one tenant": lambda w, i: random.choice(many),
            }
            per_worker = max(1, p.n // p.concurrency // (p.blocks // 2 or 1))
            batch = [NewMessage("user", text)] * p.k
            for mode, pick in modes.items():
                cortex_side, floor_side = Side(), Side()

                async def cortex_op(w: int, i: int, pick: Any = pick) -> int:
                    with use_scope(SCOPE):
                        await store.append_messages(pick(w, i), batch)
                    return p.k

                async def floor_op(w: int, i: int, pick: Any = pick) -> int:
                    sid = parse_id("ses", pick(w, i))
                    await floor.append(sid, p.k, text)
                    return p.k

                async def cortex_block(side: Side = cortex_side, op: Any = cortex_op) -> None:
                    await timed_workers(side, p.concurrency, per_worker, op)

                async def floor_block(side: Side = floor_side, op: Any = floor_op) -> None:
                    await timed_workers(side, p.concurrency, per_worker, op)

                await alternate(p.blocks // 2 or 1, cortex_block, floor_block)
                broken = await check_invariants(db.owner_url)
                if broken:
                    invariants_ok = False
                    print(
                        f"!!! INVARIANT BROKEN after {mode}: {len(broken)} sessions, e.g. {broken[:3]}"
                    )
                result = Result(
                    f"append {mode}",
                    cortex_side.summary(),
                    floor_side.summary(),
                    throughput_ratio(cortex_side, floor_side),
                    note="" if not broken else "INVARIANTS BROKEN",
                )
                print_result(result)
                results.append(result)
        finally:
            await pool.close()
    return results, invariants_ok
