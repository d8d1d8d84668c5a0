"""Where a call's CPU goes: the client's and the server backend's, per call, beside the physical floor.

Throughput on a shared machine mixes two costs: the Python that builds and
reads a call, and what PostgreSQL does for it. This scenario measures them
apart, on one connection per side whose server backend it knows
(``pg_backend_pid()``), calls made one after another:

- **physical**: plain asyncpg on the minimal schema, one statement
  (:data:`benchmarks.physical.APPEND_SQL`, ``LIST_SQL``), as the owner;
- **routine**: the very call cortex sends (its one-round-trip routine, with
  the arguments cortex binds), through raw asyncpg as the application role:
  what cortex's schema, SQL and row-level security cost, without its Python;
- **cortex**: the store's public API on a pool of one connection.

Per call: wall time, client CPU (this process, ``time.process_time``), and
server CPU, the backend's time on a CPU from ``/proc/<pid>/schedstat`` (else
its ``utime + stime`` from ``/proc/<pid>/stat``), read only where the server
runs on this machine; elsewhere that column is absent. Operations: append one
200-byte message to a session of one's own (holding no state, then 600 KB of
it: an append must not read a document it leaves alone), and list a user's
newest 20 and 100 sessions, then 20 sessions holding 50 KB of state each
(the floor's page stays the plain one; the routine's column shows the
server's share of the documents, cortex's the decoding). Blocks rotate each
round (:func:`benchmarks._common.rotate`).
Nothing passes or fails on a time; the exit code is 1 only if an append's
counter and its rows disagree at the end.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
from rich.console import Console
from rich.table import Table

import cortex
from benchmarks._common import BenchDatabase, Floor, SameSql, listing_sql, rotate
from benchmarks.append import check_invariants
from benchmarks.physical import (
    AGENT,
    APPEND_SQL,
    LIST_SCOPE,
    LIST_SQL,
    LIST_USER,
    PHYSICAL_DDL,
    SCOPE,
    TEXT,
    _physical_invariants,
    _seed_listings,
)
from benchmarks.physical import Params as PhysicalParams
from cortex import ListFilter, NewMessage, use_scope
from cortex._db.executor import routine_key
from cortex.ids import parse_id
from cortex.scope import Scope

PHYSICAL, ROUTINE, CORTEX = "physical", "routine", "cortex"
SIDES: Final = (PHYSICAL, ROUTINE, CORTEX)
_LABELS: Final = {
    PHYSICAL: "physical floor",
    ROUTINE: "cortex's routine, raw asyncpg",
    CORTEX: "cortex (store API)",
}


@dataclass(frozen=True)
class Params:
    """Calls per side and operation (split over ``rounds`` blocks) and the listing's seed."""

    n: int = 2000
    rounds: int = 4
    list_sessions: int = 1000  # sessions of each listed user (benchmarks.physical)


@dataclass
class Line:
    """One operation: per side, microseconds per call of wall time, client and server CPU."""

    name: str
    sides: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend:
    """CPU time of one server process, read from /proc (None where it cannot be read)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.local = True  # False: the server is elsewhere, the pid means nothing here
        self._ticks = os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float | None:
        """The process's CPU time so far, in seconds; None if the server is not on this machine."""
        if not self.local:
            return None
        try:
            # The first field: nanoseconds on a CPU (the scheduler's own count).
            return int(Path(f"/proc/{self.pid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            # Fields after the command name (which may hold spaces): utime and stime.
            rest = stat.rsplit(")", 1)[1].split()
            return (int(rest[11]) + int(rest[12])) / self._ticks
        except (OSError, ValueError, IndexError):
            return None

    def is_postgres(self) -> bool:
        """Whether this machine's process ``pid`` is a PostgreSQL server process."""
        try:
            command = Path(f"/proc/{self.pid}/cmdline").read_bytes()
            name = Path(f"/proc/{self.pid}/comm").read_text()
        except OSError:
            return False
        return b"postgres" in command or "postgres" in name


@dataclass
class _Tally:
    calls: int = 0
    wall: float = 0.0
    client: float = 0.0
    server: float | None = 0.0

    def summary(self) -> dict[str, float]:
        out = {
            "calls": float(self.calls),
            "wall_us": self.wall / self.calls * 1e6,
            "client_cpu_us": self.client / self.calls * 1e6,
        }
        if self.server is not None:
            out["server_cpu_us"] = self.server / self.calls * 1e6
            out["cpu_us"] = out["client_cpu_us"] + out["server_cpu_us"]
        return out


Call = Callable[[int], Awaitable[Any]]


async def _measure(
    name: str, calls: dict[str, Call], backends: dict[str, Backend], p: Params
) -> Line:
    tallies = {side: _Tally() for side in calls}
    per_block = max(1, p.n // p.rounds)

    def block(side: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            tally, call, backend = tallies[side], calls[side], backends[side]
            server0 = backend.seconds()
            wall0, client0 = time.perf_counter(), time.process_time()
            for i in range(per_block):
                await call(i)
            wall1, client1 = time.perf_counter(), time.process_time()
            server1 = backend.seconds()
            tally.calls += per_block
            tally.wall += wall1 - wall0
            tally.client += client1 - client0
            if server0 is None or server1 is None or tally.server is None:
                tally.server = None
            else:
                tally.server += server1 - server0

        return run

    for call in calls.values():  # prepared statements and caches warm, outside the timing
        for i in range(20):
            await call(i)
    await rotate(p.rounds, [block(side) for side in calls])
    line = Line(name, {side: t.summary() for side, t in tallies.items()})
    _print_line(line)
    return line


def _print_line(line: Line) -> None:
    parts = []
    for side, s in line.sides.items():
        server = f", server {s['server_cpu_us']:.0f}" if "server_cpu_us" in s else ""
        parts.append(f"{side} {s['wall_us']:.0f} us (client {s['client_cpu_us']:.0f}{server})")
    print(f"  {line.name}: " + " | ".join(parts))


async def _backend_of(conn: asyncpg.Connection) -> Backend:
    return Backend(int(await conn.fetchval("SELECT pg_backend_pid()")))


async def run(db: BenchDatabase, p: Params) -> tuple[list[Line], bool]:
    """Append and listing calls on every side; the counters checked against the rows after."""
    setup = await asyncpg.connect(db.owner_url)
    try:
        await setup.execute(PHYSICAL_DDL)
    finally:
        await setup.close()
    # One connection per side. The pool is the one SameSql builds the routine's
    # arguments with; it opens nothing.
    same = SameSql(Floor(await asyncpg.create_pool(db.app_url, min_size=0, max_size=1)), SCOPE)
    pc = await asyncpg.connect(db.owner_url, server_settings={"search_path": "physical"})
    rc = await asyncpg.connect(db.app_url)
    lines: list[Line] = []
    try:
        async with cortex.connect(db.app_url, pool_size=1, max_overflow=0) as store:
            backends = {PHYSICAL: await _backend_of(pc), ROUTINE: await _backend_of(rc)}
            # The store's one pooled connection, whose backend serves every call.
            async with store.engine.connect() as sc:
                raw = await sc.get_raw_connection()
                driver: asyncpg.Connection = raw.driver_connection  # type: ignore[assignment]
                backends[CORTEX] = await _backend_of(driver)
            local = all(b.is_postgres() and b.seconds() is not None for b in backends.values())
            if not local:
                print("  (the server is not on this machine: client CPU only)")
                for backend in backends.values():
                    backend.local = False
            lines.append(await _appends(p, store, same, pc, rc, backends))
            lines.append(await _appends(p, store, same, pc, rc, backends, state=_big_state()))
            await _seed_listings(
                PhysicalParams(list_sessions=p.list_sessions, peers=False), db, pc, None
            )
            for size in (20, 100):
                lines.append(await _listing(p, size, store, pc, rc, backends))
            lines.append(
                await _listing(p, 20, store, pc, rc, backends, scope=await _stateful(store))
            )
        broken = await check_invariants(db.owner_url) + await _physical_invariants(pc)
    finally:
        await pc.close()
        await rc.close()
        await same.floor.pool.close()
    for problem in broken:
        print(f"!!! counter and rows disagree: {problem}")
    print_tables(lines)
    return lines, not broken


async def _appends(
    p: Params,
    store: cortex.Store,
    same: SameSql,
    pc: asyncpg.Connection,
    rc: asyncpg.Connection,
    backends: dict[str, Backend],
    *,
    state: dict[str, str] | None = None,
) -> Line:
    """One-message appends; with ``state``, cortex's sessions hold that state document.

    The floor's session holds none: its append never reads one, which is
    what cortex's should match whatever the session holds.
    """
    phys_id = await pc.fetchval(
        "INSERT INTO sessions (id, user_id, agent_id) VALUES (gen_random_uuid(), 'user', $1)"
        " RETURNING id",
        AGENT,
    )
    with use_scope(SCOPE):
        mine = (await store.create_session(AGENT, data=state)).id
        theirs = (await store.create_session(AGENT, data=state)).id
    routine_call = store._routines[same.append_one_key]  # the call cortex sends
    target = parse_id("ses", theirs)
    message = NewMessage("user", TEXT)

    async def physical(i: int) -> Any:
        return await pc.fetchval(APPEND_SQL, phys_id, "user", TEXT)

    async def routine(i: int) -> Any:
        return await rc.fetch(routine_call, *same.append_args(target, 1, TEXT))

    async def through_cortex(i: int) -> Any:
        with use_scope(SCOPE):
            return await store.append_message(mine, message)

    calls: dict[str, Call] = {PHYSICAL: physical, ROUTINE: routine, CORTEX: through_cortex}
    name = "append one message"
    if state is not None:
        size = sum(len(key) + len(value) for key, value in state.items())
        name += f", {size // 1000} KB of session state"
    return await _measure(name, calls, backends, p)


def _big_state() -> dict[str, str]:
    """About 600 KB of state that TOAST cannot compress much: stored out of line."""
    return {f"k{i}": secrets.token_hex(15_000) for i in range(20)}


async def _listing(
    p: Params,
    size: int,
    store: cortex.Store,
    pc: asyncpg.Connection,
    rc: asyncpg.Connection,
    backends: dict[str, Backend],
    *,
    scope: Scope = LIST_SCOPE,
) -> Line:
    """A page of ``size`` through every side; ``scope``: cortex's sessions listed (the floor's stay)."""
    flt = ListFilter(limit=size)
    sql, args = listing_sql(scope, flt, distributed=store.distributed)
    routine_call = store._routines[routine_key(sql)]

    async def physical(i: int) -> Any:
        return await pc.fetch(LIST_SQL, LIST_USER, size)

    async def routine(i: int) -> Any:
        return await rc.fetch(routine_call, *args)

    async def through_cortex(i: int) -> Any:
        with use_scope(scope):
            return await store.list_sessions(flt)

    calls: dict[str, Call] = {PHYSICAL: physical, ROUTINE: routine, CORTEX: through_cortex}
    name = f"list a user's newest {size}"
    if scope is not LIST_SCOPE:
        name += f", each session holding {_STATE_KB} KB of state"
    return await _measure(name, calls, backends, p)


_STATE_KB: Final = 50
STATEFUL_SCOPE: Final = Scope.parse("listing/team/stateful")


async def _stateful(store: cortex.Store) -> Scope:
    """20 sessions each holding 50 KB of prose as state: what the page decodes.

    The floor's page stays the plain one: its sessions hold no state, and the
    routine's column beside cortex's shows what decoding the documents costs.
    """
    prose = ("the quick brown fox jumps over the lazy dog " * 1200)[: _STATE_KB * 1000]
    with use_scope(STATEFUL_SCOPE):
        for _ in range(20):
            await store.create_session(AGENT, data={"notes": prose})
    return STATEFUL_SCOPE


def print_tables(lines: list[Line], console: Console | None = None) -> None:
    """One table: per operation and side, microseconds per call, and the multiple of the floor's CPU."""
    console = console or Console()
    table = Table(
        title="CPU per call, microseconds (calls one after another)", title_justify="left"
    )
    for column in ("operation", "side"):
        table.add_column(column)
    for column in ("wall", "client CPU", "server CPU", "CPU in all", "CPU ÷ physical"):
        table.add_column(column, justify="right")
    for line in lines:
        floor = line.sides[PHYSICAL].get("cpu_us")
        for k, side in enumerate(SIDES):
            s = line.sides[side]
            total = s.get("cpu_us")
            table.add_row(
                line.name if k == 0 else "",
                _LABELS[side],
                f"{s['wall_us']:.0f}",
                f"{s['client_cpu_us']:.0f}",
                f"{s['server_cpu_us']:.0f}" if "server_cpu_us" in s else "-",
                f"{total:.0f}" if total is not None else "-",
                f"{total / floor:.2f}" if total is not None and floor else "-",
                style="bold" if side == CORTEX else None,
                end_section=k == len(SIDES) - 1,
            )
    console.print(table)
    console.print(
        "client CPU: this process; server CPU: the side's backend (/proc, when the server runs"
        " here). routine: the call cortex sends, without cortex's Python."
    )


def draw(report: dict[str, Any], png: Path) -> None:
    """Stacked bars: client and server CPU per call, per side, for each operation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = report["results"]
    fig, axes = plt.subplots(1, len(lines), figsize=(5 * len(lines), 4), squeeze=False)
    for ax, line in zip(axes[0], lines, strict=True):
        sides = [side for side in SIDES if side in line["sides"]]
        client = [line["sides"][s]["client_cpu_us"] for s in sides]
        server = [line["sides"][s].get("server_cpu_us", 0.0) for s in sides]
        xs = range(len(sides))
        ax.bar(list(xs), client, label="client CPU", color="#264653")
        ax.bar(list(xs), server, bottom=client, label="server CPU", color="#2a9d8f")
        ax.set_xticks(list(xs), [_LABELS[s].replace(", ", ",\n") for s in sides], fontsize=8)
        ax.set_ylabel("µs per call")
        ax.set_title(line["name"], fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"CPU per call: PostgreSQL {report['postgres_version'].split()[0]}, {report['cpus']} CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
