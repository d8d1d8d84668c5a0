"""What every scenario shares: a throwaway database, the raw floor, timing, results.

The *floor* is the fastest plain-asyncpg way to do the same work on the same
schema: the very SQL cortex sends (compiled from cortex's own statement
builders), prepared once per connection, inside the same BEGIN + tenant
binding and COMMIT. So a ratio below 1.0 is exactly what cortex's Python
layers (SQLAlchemy Core, validation, models, retries) cost. Cortex and the
floor run in the same process, on the same database, in alternating blocks,
so machine drift hits both alike. Benchmarks print measurements; they never
pass or fail on a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import platform
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg

from cortex._engine import driver_dsn
from cortex.migrate import grant_sql, upgrade

_DIALECT = pg_asyncpg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated


@dataclass(frozen=True)
class BenchDatabase:
    """A migrated throwaway database: owner (superuser) and application URLs."""

    name: str
    owner_url: str
    app_url: str
    role: str


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def bench_database(
    server_url: str, *, keep: bool = False, revision: str = "head"
) -> AsyncIterator[BenchDatabase]:
    """Create, migrate (to ``revision``) and grant a throwaway database; drop it afterwards unless ``keep``.

    The grant needs the whole schema: it is skipped below the head.
    """
    suffix = uuid.uuid4().hex[:8]
    name, role = f"cortex_bench_{suffix}", f"cortex_bench_app_{suffix}"
    server = driver_dsn(server_url)
    await _execute(server, f'CREATE DATABASE "{name}"', f'CREATE ROLE "{role}" LOGIN')
    owner = driver_dsn(server_url, database=name)
    await asyncio.to_thread(upgrade, owner, revision)
    if revision == "head":
        await _execute(owner, *grant_sql(role))
    try:
        yield BenchDatabase(name, owner, driver_dsn(server_url, database=name, user=role), role)
    finally:
        if not keep:
            await _execute(
                server,
                f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                f'DROP ROLE IF EXISTS "{role}"',
            )


async def server_facts(url: str) -> dict[str, Any]:
    """PostgreSQL and driver versions and the machine, recorded with every result."""
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    import os

    return {
        "postgres_version": version,
        "asyncpg_version": asyncpg.__version__,
        "sqlalchemy_version": sa.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def compile_statement(stmt: Any) -> tuple[str, list[str]]:
    """The SQL text SQLAlchemy sends asyncpg for this statement, and its parameter order."""
    compiled = stmt.compile(dialect=_DIALECT)
    return str(compiled), list(compiled.positiontup or [])


def bind(order: list[str], values: dict[str, Any]) -> list[Any]:
    """Positional arguments for a compiled statement, from named values."""
    return [values[name] for name in order]


class Floor:
    """Raw asyncpg: BEGIN + tenant binding (one simple query), the statement, COMMIT."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def run(
        self, tenant: str, sql: str, args: Sequence[Any], *, custom_plans: bool = False
    ) -> list[asyncpg.Record]:
        begin = f"BEGIN; SELECT set_config('cortex.tenant', '{tenant}', true)"
        if custom_plans:  # what cortex does for searches
            begin += "; SET LOCAL plan_cache_mode = force_custom_plan"
        async with self.pool.acquire() as conn:
            await conn.execute(begin)
            try:
                rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")
            return rows


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (q in 0..100)."""
    ordered = sorted(samples)
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


@dataclass
class Side:
    """One side's measurements: latencies in seconds and the wall time of its blocks."""

    latencies: list[float] = field(default_factory=list)
    wall: float = 0.0
    ops: int = 0
    items: int = 0  # e.g. messages, when an op carries several

    def summary(self) -> dict[str, float]:
        lat = self.latencies or [math.nan]
        out = {
            "ops": self.ops,
            "ops_per_s": self.ops / self.wall if self.wall else math.nan,
            "p50_ms": percentile(lat, 50) * 1e3,
            "p95_ms": percentile(lat, 95) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
            "mean_ms": statistics.fmean(lat) * 1e3,
        }
        if self.items:
            out["items_per_s"] = self.items / self.wall if self.wall else math.nan
        return out


@dataclass
class Result:
    """One measured line: cortex beside the floor, and the ratio."""

    name: str
    cortex: dict[str, float]
    floor: dict[str, float]
    ratio: float
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput_ratio(cortex: Side, floor: Side) -> float:
    """Cortex throughput / floor throughput (1.0: as fast as hand-written asyncpg)."""
    a, b = cortex.summary()["ops_per_s"], floor.summary()["ops_per_s"]
    return a / b if b else math.nan


def latency_ratio(cortex: Side, floor: Side, key: str = "p50_ms") -> float:
    """Floor latency / cortex latency (1.0: as fast as hand-written asyncpg)."""
    a, b = cortex.summary()[key], floor.summary()[key]
    return b / a if a else math.nan


async def timed_workers(
    side: Side, workers: int, per_worker: int, op: Callable[[int, int], Awaitable[int]]
) -> None:
    """Run ``workers`` concurrent loops of ``per_worker`` ops; record latency and wall time.

    ``op(worker, i)`` returns how many items it carried (for items/s).
    """

    async def loop(w: int) -> None:
        for i in range(per_worker):
            start = time.perf_counter()
            items = await op(w, i)
            side.latencies.append(time.perf_counter() - start)
            side.ops += 1
            side.items += items

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for w in range(workers):
            tg.create_task(loop(w))
    side.wall += time.perf_counter() - start


async def alternate(
    blocks: int,
    cortex_block: Callable[[], Awaitable[None]],
    floor_block: Callable[[], Awaitable[None]],
) -> None:
    """Alternate cortex and floor blocks (starting side alternates too), so drift hits both."""
    for b in range(blocks):
        first, second = (cortex_block, floor_block) if b % 2 == 0 else (floor_block, cortex_block)
        await first()
        await second()


def print_result(result: Result) -> None:
    c, f = result.cortex, result.floor
    rate = "ops_per_s"
    items = f" ({c['items_per_s']:.0f} msg/s)" if "items_per_s" in c else ""
    print(
        f"  {result.name:<44} cortex {c[rate]:>8.0f}/s{items} p50 {c['p50_ms']:6.2f} p95 {c['p95_ms']:6.2f} ms"
        f" | floor {f[rate]:>8.0f}/s p50 {f['p50_ms']:6.2f} p95 {f['p95_ms']:6.2f} ms"
        f" | ratio {result.ratio:4.2f}{'  ' + result.note if result.note else ''}"
    )
