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
import gc
import math
import os
import platform
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg
import sqlalchemy as sa

from cortex import ListFilter
from cortex._calls.sessions import scope_columns
from cortex._db.engine import driver_dsn
from cortex._db.executor import compile_statement as cortex_compile
from cortex._db.executor import routine_key
from cortex._db.transaction import begin_sql
from cortex._sql.messages import append_statement
from cortex._sql.predicates import (
    cursor_params,
    depth_class,
    filter_params,
    filter_shape,
    scope_params,
)
from cortex._sql.sessions import (
    count_statement,
    default_statement,
    insert_statement,
    page_statement,
    resolve_default_insert_statement,
)
from cortex.ids import new_uuid
from cortex.migrate import grant_sql, upgrade
from cortex.scope import Scope


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


@contextlib.asynccontextmanager
async def kept_database(server_url: str, name: str) -> AsyncIterator[BenchDatabase]:
    """A database an earlier run kept (``--keep``), upgraded to this code's head and granted again.

    Its rows are measured again without seeding; it is kept afterwards.
    """
    role = name.replace("cortex_bench_", "cortex_bench_app_", 1)
    owner = driver_dsn(server_url, database=name)
    started = time.perf_counter()
    steps = await asyncio.to_thread(upgrade, owner, "head")
    for step in steps:
        print(f"  upgraded to {step.revision} in {step.seconds:.1f} s")
    print(f"  upgrade: {time.perf_counter() - started:.1f} s")
    await _execute(owner, *grant_sql(role))
    yield BenchDatabase(name, owner, driver_dsn(server_url, database=name, user=role), role)


async def server_facts(url: str) -> dict[str, Any]:
    """PostgreSQL and driver versions and the machine, recorded with every result."""
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return {
        "postgres_version": version,
        "asyncpg_version": asyncpg.__version__,
        "sqlalchemy_version": sa.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        # The machine is shared: how busy it was when the scenario started.
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def compile_statement(stmt: Any) -> tuple[str, list[str]]:
    """The SQL text SQLAlchemy sends asyncpg for this statement, and its parameter order."""
    compiled = cortex_compile(stmt)
    return compiled.sql, list(compiled.order)


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
        # cortex's own BEGIN message, so the floor binds the tenant the same way.
        begin = begin_sql(Scope.parse(tenant), custom_plans=custom_plans)
        async with self.pool.acquire() as conn:
            await conn.execute(begin)
            try:
                rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")
            return rows


class SameSql:
    """Today's floor: cortex's own SQL (compiled from its statement builders) through :class:`Floor`.

    Each method is the floor of one cortex call at ``scope``; the scenarios
    ``append``, ``resolve``, ``listing`` and ``physical`` all measure through
    it, so "the same-SQL floor" is one piece of code.
    """

    def __init__(self, floor: Floor, scope: Scope) -> None:
        self.floor = floor
        self.scope = scope
        # Compiled once, outside any timing.
        self._append = compile_statement(append_statement(depth_class(scope)))
        self._append_one = compile_statement(append_statement(depth_class(scope), single=True))
        self._insert = compile_statement(insert_statement(False))
        self._resolve_insert = compile_statement(resolve_default_insert_statement())
        self._resolve_select = compile_statement(default_statement())

    @property
    def append_one_key(self) -> str:
        """The routine key of the one-message append (cortex._db.routines): which routine runs it."""
        return routine_key(self._append_one[0])

    def append_args(self, session_id: uuid.UUID, k: int, text: str) -> list[Any]:
        """The parameters cortex binds for an append of ``k`` messages, built by hand."""
        path = str(self.scope)
        values = {
            "scope_tenant": self.scope.tenant,
            "scope_path": path,
            "scope_lo": path + "/",
            "scope_hi": path + "0",
            "target_id": session_id,
            "batch_size": k,
            "preview": text,
            "m_ids": [new_uuid() for _ in range(k)],
            "m_roles": ["user"] * k,
            "m_contents": [text] * k,
            "m_authors": [""] * k,
            "m_requested": [None] * k,
            "m_responses": [None] * k,
            "m_more_requested": [None] * k,
            "m_more_responses": [None] * k,
            "m_metadata": ["{}"] * k,
            "m_payloads": [None] * k,
            "deltas_digest": None,
        }
        if (
            k == 1
        ):  # cortex binds one message's fields as scalars (cortex._calls.messages._row_values)
            one: dict[str, Any] = {"m_id_0": new_uuid(), "m_role_0": "user", "m_content_0": text}
            one |= {"m_author_0": "", "m_metadata_0": "{}"}
            one |= dict.fromkeys(
                f"{name}_0"
                for name in (
                    "m_requested",
                    "m_response",
                    "m_more_requested",
                    "m_more_responses",
                    "m_payload",
                    "m_digest",
                )
            )
            return bind(self._append_one[1], {**values, **one})
        return bind(self._append[1], values)

    async def append(self, session_id: uuid.UUID, k: int, text: str) -> None:
        """The one-statement append cortex sends, ``k`` messages, of ``k`` messages, in its transaction."""
        sql = (self._append_one if k == 1 else self._append)[0]
        await self.floor.run(self.scope.tenant, sql, self.append_args(session_id, k, text))

    async def create(self, agent: str) -> None:
        """The INSERT cortex sends for a session with a generated id, in its transaction."""
        values = {
            "target_id": new_uuid(),
            "new_agent_id": agent,
            "new_title": "",
            "new_metadata": "{}",
            "new_is_default": False,
            "new_key": None,
            "new_data": None,
            "new_scope_digest": None,
            "scope_tenant": self.scope.tenant,
            **scope_columns(self.scope),
        }
        await self.floor.run(self.scope.tenant, self._insert[0], bind(self._insert[1], values))

    async def resolve(self, agent: str) -> None:
        """Default resolution as cortex sends it: INSERT ... ON CONFLICT DO NOTHING, else the SELECT."""
        values = {
            "target_id": new_uuid(),
            "new_agent_id": agent,
            **scope_columns(self.scope),
            **scope_params(self.scope),
        }
        (insert_sql, insert_order), (select_sql, select_order) = (
            self._resolve_insert,
            self._resolve_select,
        )
        async with self.floor.pool.acquire() as conn:
            await conn.execute(begin_sql(self.scope, custom_plans=False))
            try:
                row = await conn.fetchrow(insert_sql, *bind(insert_order, values))
                if row is None:
                    await conn.fetchrow(select_sql, *bind(select_order, values))
            except BaseException:
                await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")


def listing_sql(
    scope: Scope,
    flt: ListFilter,
    *,
    distributed: bool = False,
    count: bool = False,
    keyset: bool = False,
    cursor: tuple[Any, Any] | None = None,
) -> tuple[str, list[Any]]:
    """The SQL and arguments cortex sends for a listing (a page, a count, or a keyset page)."""
    shape = filter_shape(scope, flt, distributed=distributed)
    values = {**filter_params(scope, flt), "limit": flt.page_size, "offset": flt.offset}
    if count:
        stmt: Any = count_statement(shape)
    elif keyset:
        stmt = page_statement(shape, cursor=cursor is not None, offset=False)
        if cursor is not None:
            values.update(cursor_params(*cursor))
    else:
        stmt = page_statement(shape, cursor=False, offset=flt.offset > 0)
    sql, order = compile_statement(stmt)
    return sql, bind(order, values)


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
            # The tail: cortex's appends pause every thousand or so to merge
            # the trigram GIN's pending list (docs/benchmarks.md), which
            # p99 does not show.
            "p999_ms": percentile(lat, 99.9) * 1e3,
            "max_ms": max(lat) * 1e3,
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
    await rotate(blocks, [cortex_block, floor_block])


async def rotate(blocks: int, sides: Sequence[Callable[[], Awaitable[None]]]) -> None:
    """Run every side's block ``blocks`` times, the order rotating by one each round.

    With two sides this is :func:`alternate`; with more, each side opens a
    round as often as any other, so machine drift hits them all alike.
    """
    for b in range(blocks):
        shift = b % len(sides)
        for block in (*sides[shift:], *sides[:shift]):
            # Each block starts on a collected heap: a full collection that
            # the garbage of the block before would set off (measured at up
            # to 220 ms, with the peers' sessions holding thousands of events
            # in memory) lands in no side's timing but the one that made it.
            gc.collect()
            await block()


def print_result(result: Result) -> None:
    c, f = result.cortex, result.floor
    rate = "ops_per_s"
    items = f" ({c['items_per_s']:.0f} msg/s)" if "items_per_s" in c else ""
    print(
        f"  {result.name:<44} cortex {c[rate]:>8.0f}/s{items} p50 {c['p50_ms']:6.2f} p95 {c['p95_ms']:6.2f}"
        f" p99.9 {c['p999_ms']:6.2f} max {c['max_ms']:6.1f} ms"
        f" | floor {f[rate]:>8.0f}/s p50 {f['p50_ms']:6.2f} p95 {f['p95_ms']:6.2f}"
        f" p99.9 {f['p999_ms']:6.2f} max {f['max_ms']:6.1f} ms"
        f" | ratio {result.ratio:4.2f}{'  ' + result.note if result.note else ''}"
    )
