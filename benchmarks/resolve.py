"""Scenario ``resolve``: concurrent default resolution on fresh and existing (agent, scope) pairs.

Cortex's ``resolve_session`` beside the floor running the same two statements
(``INSERT ... ON CONFLICT DO NOTHING RETURNING``, then the SELECT) through raw
asyncpg. A race round then fires C concurrent resolves at each of many fresh
pairs; afterwards every pair must have exactly one default.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import anyio
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
from cortex import use_scope
from cortex.scope import Scope

SCOPE = Scope.parse("bench/team/user")


@dataclass(frozen=True)
class Params:
    n: int = 4000
    concurrency: int = 8
    existing: int = 50
    race_pairs: int = 50
    blocks: int = 4


async def run(db: BenchDatabase, p: Params) -> tuple[list[Result], bool]:
    results: list[Result] = []
    counter = itertools.count()
    async with cortex.connect(db.app_url, pool_size=p.concurrency, max_overflow=0) as store:
        pool = await asyncpg.create_pool(db.app_url, min_size=p.concurrency, max_size=p.concurrency)
        assert pool is not None
        floor = SameSql(Floor(pool), SCOPE)

        try:
            existing = [f"existing-{i}" for i in range(p.existing)]
            with use_scope(SCOPE):
                for agent in existing:
                    await store.resolve_session(agent)
            per_worker = max(1, p.n // p.concurrency // (p.blocks // 2 or 1))
            modes: dict[str, Any] = {
                "fresh pairs (insert wins)": lambda: f"fresh-{next(counter)}",
                "existing pairs (conflict, then select)": lambda: existing[
                    next(counter) % len(existing)
                ],
            }
            for mode, agent_for in modes.items():
                cortex_side, floor_side = Side(), Side()

                async def cortex_op(w: int, i: int, agent_for: Any = agent_for) -> int:
                    with use_scope(SCOPE):
                        await store.resolve_session(agent_for())
                    return 0  # no items beyond the call itself

                async def floor_op(w: int, i: int, agent_for: Any = agent_for) -> int:
                    await floor.resolve(agent_for())
                    return 0

                async def cortex_block(side: Side = cortex_side, op: Any = cortex_op) -> None:
                    await timed_workers(side, p.concurrency, per_worker, op)

                async def floor_block(side: Side = floor_side, op: Any = floor_op) -> None:
                    await timed_workers(side, p.concurrency, per_worker, op)

                await alternate(p.blocks // 2 or 1, cortex_block, floor_block)
                result = Result(
                    f"resolve {mode}",
                    cortex_side.summary(),
                    floor_side.summary(),
                    throughput_ratio(cortex_side, floor_side),
                )
                print_result(result)
                results.append(result)

            # The race: C concurrent resolves per fresh pair, all at once.
            winners: dict[str, set[str]] = {}

            async def racer(agent: str) -> None:
                with use_scope(SCOPE):
                    winners.setdefault(agent, set()).add((await store.resolve_session(agent)).id)

            async with anyio.create_task_group() as tg:
                for pair in range(p.race_pairs):
                    for _ in range(p.concurrency):
                        tg.start_soon(racer, f"race-{pair}")
        finally:
            await pool.close()
    conn = await asyncpg.connect(db.owner_url)
    try:
        doubles = await conn.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE is_default "
            "GROUP BY tenant_id, agent_id, scope HAVING count(*) > 1) AS d"
        )
        race_defaults = await conn.fetchval(
            "SELECT count(*) FROM sessions WHERE is_default AND agent_id LIKE 'race-%'"
        )
    finally:
        await conn.close()
    ok = (
        doubles == 0
        and race_defaults == p.race_pairs
        and all(len(v) == 1 for v in winners.values())
    )
    print(
        f"  race: {p.race_pairs} pairs x {p.concurrency} concurrent resolves -> "
        f"{race_defaults} defaults, {doubles} pairs with two; each caller got the one default: "
        f"{all(len(v) == 1 for v in winners.values())}"
    )
    if not ok:
        print("!!! INVARIANT BROKEN: a pair has more or fewer than one default")
    return results, ok
