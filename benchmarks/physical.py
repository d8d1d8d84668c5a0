"""Scenario ``physical``: cortex beside the physical floor, its own same-SQL floor, and the peers.

The *physical floor* is the least a session store can do on PostgreSQL:
plain asyncpg on a minimal schema of its own (schema ``physical`` of the
benchmark database: a ``sessions`` table with one listing index, the
partial unique index default resolution needs, and a ``messages`` table),
one statement per operation, in autocommit, no row-level security
(:data:`PHYSICAL_DDL`, :data:`APPEND_SQL` and friends hold the exact SQL).
It is what the hardware and the server allow; cortex pays on top of it for
the tenant wall (BEGIN + binding, COMMIT), its richer schema (more indexes,
previews, state) and its Python layers.

*Today's same-SQL floor* (:class:`benchmarks._common.SameSql`) stays beside
it: cortex's own statements through raw asyncpg in cortex's transaction, so
cortex / same-SQL isolates the Python layer, and same-SQL / physical what
the schema and the transaction cost.

The peers run through their public APIs on the same server and driver:
Google ADK's ``DatabaseSessionService`` (``append_event``, ``list_sessions``
of one user) and the Agents SDK's ``SQLAlchemySession`` (``add_items``; it
has no listing). They create their own tables in schema ``peers``
(:mod:`benchmarks.frameworks`) and, like the physical floor, connect as the
database owner; cortex and the same-SQL floor connect as the application
role under row-level security.

Every side of an operation runs in the same process, in blocks whose order
rotates each round (:func:`benchmarks._common.rotate`). After each append
mode, cortex's and the physical floor's counters must equal their rows with
gap-free ``seq``: a mismatch fails the run. Nothing passes or fails on a time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import asyncpg
from rich.console import Console
from rich.table import Table

import cortex
from benchmarks._common import (
    BenchDatabase,
    Floor,
    SameSql,
    Side,
    listing_sql,
    rotate,
    timed_workers,
)
from benchmarks.append import check_invariants
from benchmarks.listing import plan_line
from cortex import ListFilter, NewMessage, use_scope
from cortex.ids import new_uuid, parse_id
from cortex.scope import Scope

SCOPE: Final = Scope.parse("bench/team/user")
# The listed user, one of LIST_USERS whose sessions interleave in time in one tenant.
LIST_USERS: Final = 10
LIST_USER: Final = "user3"
LIST_SCOPE: Final = Scope.parse(f"listing/team/{LIST_USER}")
AGENT: Final = "bench"
# 200 bytes of message content for every side.
TEXT: Final = ("the quick brown fox jumps over the lazy dog " * 5)[:200]

PHYSICAL_DDL: Final = """
CREATE SCHEMA physical;
SET search_path = physical;
CREATE TABLE sessions (
    id uuid PRIMARY KEY,
    user_id text NOT NULL,
    agent_id text NOT NULL,
    title text NOT NULL DEFAULT '',
    is_default boolean NOT NULL DEFAULT false,
    message_count integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sessions_user_recent ON sessions (user_id, updated_at DESC, id DESC);
CREATE UNIQUE INDEX sessions_user_default ON sessions (user_id, agent_id) WHERE is_default;
CREATE TABLE messages (
    session_id uuid NOT NULL,
    seq integer NOT NULL,
    role text NOT NULL,
    content text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);
"""
# The append: one statement, autocommit. The counter row's lock orders concurrent
# appends to one session, so seq is gap-free; RETURNING gives the caller its seq,
# as cortex's append does.
APPEND_SQL: Final = (
    "WITH u AS (UPDATE sessions SET message_count = message_count + 1, updated_at = now()"
    " WHERE id = $1 RETURNING message_count)"
    " INSERT INTO messages (session_id, seq, role, content)"
    " SELECT $1, u.message_count, $2, $3 FROM u RETURNING seq"
)
CREATE_SQL: Final = "INSERT INTO sessions (id, user_id, agent_id) VALUES ($1, $2, $3)"
_SESSION_COLUMNS: Final = (
    "id, user_id, agent_id, title, is_default, message_count, created_at, updated_at"
)
# Resolution: the insert wins, or the conflict leaves the row for the SELECT.
# Two statements: a single one could not see a row a concurrent insert just committed.
RESOLVE_INSERT_SQL: Final = (
    "INSERT INTO sessions (id, user_id, agent_id, is_default) VALUES ($1, $2, $3, true)"
    f" ON CONFLICT (user_id, agent_id) WHERE is_default DO NOTHING RETURNING {_SESSION_COLUMNS}"
)
RESOLVE_SELECT_SQL: Final = (
    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE user_id = $1 AND agent_id = $2 AND is_default"
)
LIST_SQL: Final = (
    f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE user_id = $1"
    " ORDER BY updated_at DESC, id DESC LIMIT $2"
)
_PHYSICAL_INVARIANTS: Final = """
SELECT s.id, s.message_count, count(m.seq) AS n, coalesce(max(m.seq), 0) AS max_seq
FROM sessions s LEFT JOIN messages m ON m.session_id = s.id
GROUP BY s.id, s.message_count
HAVING s.message_count <> count(m.seq) OR coalesce(max(m.seq), 0) <> count(m.seq)
"""

PHYSICAL, SAME_SQL, CORTEX, ADK, AGENTS = "physical", "same_sql", "cortex", "adk", "agents"
SIDES: Final = (PHYSICAL, SAME_SQL, CORTEX, ADK, AGENTS)
_LABELS: Final = {
    PHYSICAL: "physical floor",
    SAME_SQL: "same-SQL floor",
    CORTEX: "cortex",
    ADK: "ADK",
    AGENTS: "Agents SDK",
}


@dataclass(frozen=True)
class Params:
    n: int = 2000  # operations per side per concurrent mode (the sequential mode: n // 4)
    concurrency: int = 8
    list_sessions: int = 1000  # sessions of each of the LIST_USERS users (cortex, physical floor)
    repeats: int = 200  # timed listing calls per side
    existing: int = 50  # resolve: pairs that already have their default
    rounds: int = 4  # each side's block runs this often, the order rotating
    peers: bool = True  # ADK and the Agents SDK (the ``peers`` extra)


@dataclass
class Line:
    """One operation: every side's summary, and cortex's ratios to each of them.

    ``floor``/``ratio`` are the physical floor and cortex's speed relative to it
    (throughput, or floor p50 / cortex p50 for latencies), the fields every
    scenario's chart reads. ``ratios`` holds cortex's speed relative to every
    other side (above 1: cortex is faster); ``ceilings`` the physical floor's
    own speed relative to every side but cortex: the most ``cortex ÷ side``
    any implementation could show that is no faster than the floor (a target
    above it cannot be met on this machine). ``absent`` says why a side has
    no figure.
    """

    group: str
    name: str
    kind: str  # "throughput" or "latency"
    cortex: dict[str, float]
    floor: dict[str, float]
    ratio: float
    sides: dict[str, dict[str, float]] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _speed(kind: str, cortex: dict[str, float], other: dict[str, float]) -> float:
    """Cortex's speed relative to ``other``: throughput ratio, or the inverse p50 ratio."""
    if kind == "throughput":
        a, b = cortex["ops_per_s"], other["ops_per_s"]
        return a / b if b else math.nan
    a, b = cortex["p50_ms"], other["p50_ms"]
    return b / a if a else math.nan


Op = Callable[[int, int], Awaitable[int]]


async def _measure(
    lines: list[Line],
    group: str,
    name: str,
    ops: dict[str, Op],
    *,
    workers: int,
    total: int,
    rounds: int,
    kind: str = "throughput",
    absent: dict[str, str] | None = None,
) -> Line:
    """Every side of one operation in ``rounds`` rotating blocks, ``total`` ops per side."""
    sides = {side: Side() for side in ops}
    per_worker = max(1, total // rounds // workers)

    def block(side: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await timed_workers(sides[side], workers, per_worker, ops[side])

        return run

    for side in ops:  # warm every pool and statement cache outside the timing
        await ops[side](0, 0)
    await rotate(rounds, [block(side) for side in ops])
    summaries = {side: s.summary() for side, s in sides.items()}
    c = summaries[CORTEX]
    line = Line(
        group,
        name,
        kind,
        c,
        summaries[PHYSICAL],
        _speed(kind, c, summaries[PHYSICAL]),
        sides=summaries,
        ratios={side: _speed(kind, c, s) for side, s in summaries.items() if side not in (CORTEX,)},
        ceilings={
            side: _speed(kind, summaries[PHYSICAL], s)
            for side, s in summaries.items()
            if side not in (CORTEX, PHYSICAL)
        },
        absent=dict(absent or {}),
    )
    if kind == "latency":
        # The targets read as latency multiples: cortex p50 / the raw SELECT's p50.
        line.ratios["p50_x_physical"] = c["p50_ms"] / summaries[PHYSICAL]["p50_ms"]
        line.ratios["p95_x_physical"] = c["p95_ms"] / summaries[PHYSICAL]["p95_ms"]
    lines.append(line)
    _print_progress(line)
    return line


def _print_progress(line: Line) -> None:
    parts = []
    for side, s in line.sides.items():
        figure = (
            f"{s['ops_per_s']:,.0f}/s"
            if line.kind == "throughput"
            else f"p50 {s['p50_ms']:.2f} ms p95 {s['p95_ms']:.2f} ms"
        )
        parts.append(f"{_LABELS[side]} {figure}")
    print(f"  {line.name}: " + " | ".join(parts))


async def _physical_invariants(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(_PHYSICAL_INVARIANTS)
    return [
        f"{r['id']}: count {r['message_count']} rows {r['n']} max seq {r['max_seq']}" for r in rows
    ]


class _Peers:
    """ADK's DatabaseSessionService and the Agents SDK's SQLAlchemySession, in schema ``peers``."""

    def __init__(self, owner_url: str, concurrency: int) -> None:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
        from google.adk.sessions.database_session_service import DatabaseSessionService
        from sqlalchemy.ext.asyncio import create_async_engine

        from benchmarks.frameworks import PEER_CONNECT, asyncpg_url

        self.adk = DatabaseSessionService(
            asyncpg_url(owner_url),
            pool_size=concurrency,
            max_overflow=0,
            connect_args=PEER_CONNECT,
        )
        self.engine = create_async_engine(
            asyncpg_url(owner_url),
            pool_size=concurrency,
            max_overflow=0,
            connect_args=PEER_CONNECT,
        )
        self._agents_session = SQLAlchemySession

    def agents_session(self, session_id: str, *, create_tables: bool = False) -> Any:
        return self._agents_session(session_id, engine=self.engine, create_tables=create_tables)

    async def create_tables(self) -> None:
        # The Agents SDK creates its tables on a session's first use when asked to.
        await self.agents_session("setup", create_tables=True).get_items()

    async def close(self) -> None:
        await self.adk.close()
        await self.engine.dispose()


def _adk_event(i: int) -> Any:
    from benchmarks.frameworks import adk_event

    return adk_event(i, TEXT)


async def run(db: BenchDatabase, p: Params) -> tuple[list[Line], bool]:
    lines: list[Line] = []
    invariants_ok = True
    c = p.concurrency

    conn = await asyncpg.connect(db.owner_url)
    try:
        await conn.execute(PHYSICAL_DDL)
    finally:
        await conn.close()
    phys_pool = await asyncpg.create_pool(
        db.owner_url, min_size=c, max_size=c, server_settings={"search_path": "physical"}
    )
    same_pool = await asyncpg.create_pool(db.app_url, min_size=c, max_size=c)
    assert phys_pool is not None
    assert same_pool is not None
    same = SameSql(Floor(same_pool), SCOPE)
    peers: _Peers | None = None
    if p.peers:
        from benchmarks.frameworks import peer_schema

        await peer_schema(db.owner_url)
        peers = _Peers(db.owner_url, c)
        await peers.create_tables()
    try:
        async with cortex.connect(db.app_url, pool_size=c, max_overflow=0) as store:
            invariants_ok = await _appends(lines, p, store, same, phys_pool, peers, db)
            await _creates(lines, p, store, same, phys_pool)
            await _resolves(lines, p, store, same, phys_pool)
            await _listings(lines, p, db, store, same_pool, phys_pool, peers)
    finally:
        await phys_pool.close()
        await same_pool.close()
        if peers is not None:
            await peers.close()
    print_tables(lines)
    return lines, invariants_ok


async def _physical_session(pool: asyncpg.Pool, user: str) -> Any:
    sid = new_uuid()
    await pool.execute(CREATE_SQL, sid, user, AGENT)
    return sid


async def _appends(
    lines: list[Line],
    p: Params,
    store: cortex.Store,
    same: SameSql,
    phys: asyncpg.Pool,
    peers: _Peers | None,
    db: BenchDatabase,
) -> bool:
    c = p.concurrency
    ok = True
    batch = [NewMessage("user", TEXT)]
    counter = itertools.count()
    # Per mode: the session each worker of each side appends to.
    modes = {
        "append, sequential (1 task, one session)": (1, False),
        f"append, {c} tasks, own sessions": (c, False),
        f"append, {c} tasks, one hot session": (c, True),
    }
    for mode, (workers, hot) in modes.items():
        n_sessions = 1 if hot else workers

        def per_worker(sessions: list[Any], hot: bool = hot, workers: int = workers) -> list[Any]:
            """The session each worker appends to: its own, or the one hot session."""
            return sessions * workers if hot else sessions

        with use_scope(SCOPE):
            ours = per_worker([(await store.create_session(AGENT)).id for _ in range(n_sessions)])
        ours_uuid = [parse_id("ses", s) for s in ours]
        physical = per_worker(
            [await _physical_session(phys, "appender") for _ in range(n_sessions)]
        )

        async def phys_op(w: int, i: int, physical: list[Any] = physical) -> int:
            await phys.fetchval(APPEND_SQL, physical[w], "user", TEXT)
            return 1

        async def same_op(w: int, i: int, ours_uuid: list[Any] = ours_uuid) -> int:
            await same.append(ours_uuid[w], 1, TEXT)
            return 1

        async def cortex_op(w: int, i: int, ours: list[str] = ours) -> int:
            with use_scope(SCOPE):
                await store.append_messages(ours[w], batch)
            return 1

        ops: dict[str, Op] = {PHYSICAL: phys_op, SAME_SQL: same_op, CORTEX: cortex_op}
        absent: dict[str, str] = {}
        if peers is None:
            absent = {ADK: "peers not run", AGENTS: "peers not run"}
        else:
            adk_sessions = per_worker(
                [
                    await peers.adk.create_session(
                        app_name="bench-app", user_id=f"a{next(counter)}"
                    )
                    for _ in range(n_sessions)
                ]
            )
            agent_sessions = per_worker(
                [peers.agents_session(f"phys-{next(counter)}") for _ in range(n_sessions)]
            )

            async def agents_op(w: int, i: int, sessions: list[Any] = agent_sessions) -> int:
                await sessions[w].add_items([{"role": "user", "content": TEXT}])
                return 1

            ops[AGENTS] = agents_op

            async def adk_op(w: int, i: int, sessions: list[Any] = adk_sessions) -> int:
                # On the hot session all workers share one ADK session object, as
                # callers sharing a conversation would; ADK refreshes its update
                # time on each append, so none is refused as stale.
                await peers.adk.append_event(sessions[w], _adk_event(next(counter)))
                return 1

            ops[ADK] = adk_op
        await _measure(
            lines,
            "append",
            mode,
            ops,
            workers=workers,
            total=p.n if workers > 1 else max(1, p.n // 4),
            rounds=p.rounds,
            absent=absent,
        )
        broken = await check_invariants(db.owner_url)
        conn = await asyncpg.connect(db.owner_url, server_settings={"search_path": "physical"})
        try:
            broken += await _physical_invariants(conn)
        finally:
            await conn.close()
        if broken:
            ok = False
            lines[-1].note = "INVARIANTS BROKEN"
            print(f"!!! INVARIANT BROKEN after {mode}: {len(broken)} sessions, e.g. {broken[:3]}")
    return ok


async def _creates(
    lines: list[Line],
    p: Params,
    store: cortex.Store,
    same: SameSql,
    phys: asyncpg.Pool,
) -> None:
    async def phys_op(w: int, i: int) -> int:
        await phys.execute(CREATE_SQL, new_uuid(), f"creator{w}", AGENT)
        return 0

    async def same_op(w: int, i: int) -> int:
        await same.create(AGENT)
        return 0

    async def cortex_op(w: int, i: int) -> int:
        with use_scope(SCOPE):
            await store.create_session(AGENT)
        return 0

    await _measure(
        lines,
        "create",
        f"create session, {p.concurrency} tasks",
        {PHYSICAL: phys_op, SAME_SQL: same_op, CORTEX: cortex_op},
        workers=p.concurrency,
        total=p.n,
        rounds=p.rounds,
        absent={ADK: "not compared", AGENTS: "not compared"},
    )


async def _phys_resolve(phys: asyncpg.Pool, user: str, agent: str) -> None:
    async with phys.acquire() as conn:
        row = await conn.fetchrow(RESOLVE_INSERT_SQL, new_uuid(), user, agent)
        if row is None:
            await conn.fetchrow(RESOLVE_SELECT_SQL, user, agent)


async def _resolves(
    lines: list[Line],
    p: Params,
    store: cortex.Store,
    same: SameSql,
    phys: asyncpg.Pool,
) -> None:
    counter = itertools.count()
    existing = [f"existing-{i}" for i in range(p.existing)]
    with use_scope(SCOPE):
        for agent in existing:
            await store.resolve_session(agent)
    for agent in existing:
        await _phys_resolve(phys, "resolver", agent)
    modes: dict[str, Callable[[], str]] = {
        "fresh pairs (the insert wins)": lambda: f"fresh-{next(counter)}",
        "existing pairs (conflict, then select)": lambda: existing[next(counter) % len(existing)],
    }
    for mode, agent_for in modes.items():

        async def phys_op(w: int, i: int, agent_for: Callable[[], str] = agent_for) -> int:
            await _phys_resolve(phys, "resolver", agent_for())
            return 0

        async def same_op(w: int, i: int, agent_for: Callable[[], str] = agent_for) -> int:
            await same.resolve(agent_for())
            return 0

        async def cortex_op(w: int, i: int, agent_for: Callable[[], str] = agent_for) -> int:
            with use_scope(SCOPE):
                await store.resolve_session(agent_for())
            return 0

        await _measure(
            lines,
            "resolve",
            f"resolve default, {p.concurrency} tasks, {mode}",
            {PHYSICAL: phys_op, SAME_SQL: same_op, CORTEX: cortex_op},
            workers=p.concurrency,
            total=p.n,
            rounds=p.rounds,
            absent={ADK: "not compared", AGENTS: "not compared"},
        )


async def _seed_listings(
    p: Params, db: BenchDatabase, phys: asyncpg.Pool | asyncpg.Connection, peers: _Peers | None
) -> None:
    """LIST_USERS users' sessions, interleaved in time, on every side; statistics fresh.

    Written set-based (cortex's rows as the database owner, with the scope
    columns cortex derives), then ``VACUUM ANALYZE``: a listing is measured on
    the plan a settled table gets, not on the one stale statistics give.
    """
    total = p.list_sessions * LIST_USERS
    conn = await asyncpg.connect(db.owner_url)
    try:
        await conn.execute(
            "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2,"
            " scope_l3, created_at, updated_at)"
            " SELECT $1, gen_random_uuid(), $2, $1 || '/team/user' || (g % $4), 3, $1 || '/team',"
            " $1 || '/team/user' || (g % $4), t, t FROM (SELECT g, now() - g * interval '1 second' AS t"
            " FROM generate_series(1, $3::int) AS g) AS s",
            LIST_SCOPE.tenant,
            AGENT,
            total,
            LIST_USERS,
        )
        await conn.execute("VACUUM ANALYZE sessions")
        if peers is not None:
            # ADK returns all of a user's sessions: one user per page size.
            for size in (20, 100):
                for s in range(size):
                    await peers.adk.create_session(
                        app_name="bench-app", user_id=f"lister{size}", session_id=f"s{s}"
                    )
            await conn.execute("VACUUM ANALYZE peers.sessions")
    finally:
        await conn.close()
    await phys.execute(
        "INSERT INTO sessions (id, user_id, agent_id, created_at, updated_at)"
        " SELECT gen_random_uuid(), 'user' || (g % $3), $1, t, t"
        " FROM (SELECT g, now() - g * interval '1 second' AS t"
        " FROM generate_series(1, $2::int) AS g) AS s",
        AGENT,
        total,
        LIST_USERS,
    )
    await phys.execute("VACUUM ANALYZE sessions")


async def _listings(
    lines: list[Line],
    p: Params,
    db: BenchDatabase,
    store: cortex.Store,
    same_pool: asyncpg.Pool,
    phys: asyncpg.Pool,
    peers: _Peers | None,
) -> None:
    await _seed_listings(p, db, phys, peers)
    floor = Floor(same_pool)
    for size in (20, 100):
        flt = ListFilter(limit=size)
        sql, args = listing_sql(LIST_SCOPE, flt, distributed=store.distributed)

        async def phys_op(w: int, i: int, size: int = size) -> int:
            return len(await phys.fetch(LIST_SQL, LIST_USER, size))

        async def same_op(w: int, i: int, sql: str = sql, args: list[Any] = args) -> int:
            return len(await floor.run(LIST_SCOPE.tenant, sql, args))

        async def cortex_op(w: int, i: int, flt: ListFilter = flt) -> int:
            with use_scope(LIST_SCOPE):
                return len(await store.list_sessions(flt))

        ops: dict[str, Op] = {PHYSICAL: phys_op, SAME_SQL: same_op, CORTEX: cortex_op}
        absent = {AGENTS: "no listing"}
        if peers is None:
            absent[ADK] = "peers not run"
        else:

            async def adk_op(w: int, i: int, size: int = size) -> int:
                listed = await peers.adk.list_sessions(
                    app_name="bench-app", user_id=f"lister{size}"
                )
                return len(listed.sessions)

            ops[ADK] = adk_op
        line = await _measure(
            lines,
            "listing",
            f"list one user's newest {size} (sequential calls)",
            ops,
            workers=1,
            total=p.repeats,
            rounds=p.rounds,
            kind="latency",
            absent=absent,
        )
        # The key plan lines: which index each floor's statement walks.
        cortex_plan = await plan_line(db.app_url, LIST_SCOPE.tenant, sql, args, False)
        async with phys.acquire() as conn:
            rows = await conn.fetch("EXPLAIN (ANALYZE, COSTS OFF) " + LIST_SQL, LIST_USER, size)
        phys_plan = next((str(r[0]).strip() for r in rows if "Scan" in str(r[0])), "")
        line.note = f"cortex: {cortex_plan} | physical: {phys_plan.replace('->  ', '')[:110]}"
        print(f"      plans: {line.note}")


# --- the report ---------------------------------------------------------------------

_TARGETS: Final = {
    "append": ">= 0.5x physical; >= 8x ADK",
    "create": ">= 0.5x physical",
    "resolve": ">= 0.5x physical",
    "listing": "p50 <= 1.5x (20), <= 2x (100) physical; >= 10x ADK",
}


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_tables(lines: list[Line], console: Console | None = None) -> None:
    """One table per operation group: a row per side, its figure, and cortex's ratio to it."""
    console = console or Console()
    for group in ("append", "create", "resolve", "listing"):
        rows = [line for line in lines if line.group == group]
        if not rows:
            continue
        latency = rows[0].kind == "latency"
        title = f"{group} (target: {_TARGETS[group]})"
        if group in ("create", "resolve"):
            title += "; not compared with the peers"
        table = Table(title=title, title_justify="left")
        table.add_column("operation")
        table.add_column("side")
        if latency:
            table.add_column("p50 ms", justify="right")
            table.add_column("p95 ms", justify="right")
            table.add_column("p50 cortex/side", justify="right")
        else:
            table.add_column("ops/s", justify="right")
            table.add_column("p95 ms", justify="right")
        table.add_column("cortex ÷ side", justify="right")
        table.add_column("physical ÷ side", justify="right")
        for line in rows:
            for k, side in enumerate(SIDES):
                name = line.name if k == 0 else ""
                s = line.sides.get(side)
                if s is None and group in ("create", "resolve"):
                    continue  # the peers have no such call: said once, in the title
                if s is None:
                    empty = [""] * (3 if latency else 2)
                    table.add_row(
                        name, _LABELS[side], *empty, f"[dim]{line.absent.get(side, '-')}[/dim]", ""
                    )
                    continue
                ratio = "" if side == CORTEX else _fmt(line.ratios.get(side))
                if latency:
                    x = (
                        ""
                        if side == CORTEX
                        else _fmt(s["p50_ms"] and line.cortex["p50_ms"] / s["p50_ms"])
                    )
                    figures = [f"{s['p50_ms']:.2f}", f"{s['p95_ms']:.2f}", x]
                else:
                    figures = [f"{s['ops_per_s']:,.0f}", f"{s['p95_ms']:.2f}"]
                style = "bold" if side == CORTEX else None
                ceiling = _fmt(line.ceilings.get(side))
                table.add_row(
                    name,
                    _LABELS[side],
                    *figures,
                    ratio,
                    ceiling,
                    style=style,
                    end_section=side == SIDES[-1],
                )
        console.print(table)
    console.print(
        "cortex ÷ side: cortex's throughput over that side's (listing: that side's p50"
        " latency over cortex's); above 1, cortex is faster. p50 cortex/side: cortex's"
        " latency in multiples of that side's. physical ÷ side: the same for the physical"
        " floor, the most cortex ÷ side could be for any code no faster than the floor"
        " (a target above it cannot be met on this machine)."
    )
