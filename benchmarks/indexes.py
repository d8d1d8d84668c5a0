"""What each promise's indexes cost an append: the schema as built, then without one promise's indexes.

An append rewrites its session's row, and no update of that row is HOT
(``updated_at`` leads every listing index), so every index on ``sessions``
gets an entry for every append. This scenario measures what each group of
indexes costs, with the physical floor (:mod:`benchmarks.physical`) beside
it in the same rounds: 8 tasks, each appending one 200-byte message to a
session of its own, through the store's public API. For each variant the
named indexes are dropped in the throwaway database and rebuilt from their
own definitions (``pg_get_indexdef``) after its blocks; the last step checks
every index of ``sessions`` is back as it was. Before each variant's blocks
every table's indexes are rebuilt and its dead rows vacuumed, so no variant
inherits another's bloat (a GIN left in place grows with every block, one
just rebuilt is compact).

One variant gives up nothing: the title index on every session, as it was
before revision 20261203000018 (an entry for an untitled session too).
What another variant gives up is what the index serves (docs/query-plans.md):

- **preview search**: a whole-tenant ``search`` finds its candidates in
  ``ix_sessions_tenant_last_message_trgm``; without it, it reads the tenant;
- **title search**: the same for titles (``ix_sessions_tenant_title_trgm``);
- **subtree listings**: a depth-2 or depth-3 subtree (a team's, a user's
  sessions) is one index walk (``ix_sessions_l2_recent``,
  ``ix_sessions_l3_recent`` and their agent forms); without them, a walk of
  the tenant's rows that filters;
- **agent listings**: ``agent_id`` filters (``ix_sessions_agent_*``);
- **metadata filters**: ``ListFilter(metadata=...)`` finds its candidates in
  ``metadata_pairs``, which three triggers on ``sessions`` keep (revision
  20261205000026); the variant disables them. The appending sessions carry
  metadata, as a host's usually do; an append within the hour pays only
  the update trigger's ``WHEN``, and the first append of a session in a new
  hour rewrites its pairs (measured apart: docs/benchmarks.md);
- **the console's page**: waiting sessions across tenants
  (``ix_sessions_console_recent``, partial: no entry for an idle session,
  so these appends pay nothing for it).

Per variant and round: both sides' appends per second and bytes of WAL per
append, and, where the server runs on this machine, the whole machine's CPU
per append (``/proc/stat``:
this process, the backends, the WAL writer). The ratio is the median of the
rounds' ratios to the floor, so drift between rounds cancels. Nothing passes
or fails on a time; the exit code is 1 only if a counter and its rows
disagree, or an index did not come back.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
from rich.console import Console
from rich.table import Table

import cortex
from benchmarks._common import BenchDatabase, Side, rotate, timed_workers
from benchmarks.append import check_invariants
from benchmarks.cpu import Backend
from benchmarks.physical import (
    AGENT,
    APPEND_SQL,
    PHYSICAL_DDL,
    SCOPE,
    TEXT,
    _physical_invariants,
    _physical_session,
)
from cortex import NewMessage, use_scope


@dataclass(frozen=True)
class Params:
    """Appends per task in each block, tasks, and rounds (each variant's blocks once per round)."""

    n: int = 400
    concurrency: int = 8
    rounds: int = 4


@dataclass(frozen=True)
class Variant:
    """A schema variant: the listed ``sessions`` indexes dropped, then ``builds`` built (name, SQL).

    ``gives_up``: what the dropped indexes serve (or what the variant is).
    ``triggers``: ``sessions`` triggers disabled for the variant's blocks.
    """

    name: str
    gives_up: str
    indexes: tuple[str, ...] = ()
    builds: tuple[tuple[str, str], ...] = ()
    triggers: tuple[str, ...] = ()


_SUBTREE: Final = (
    "ix_sessions_l2_recent",
    "ix_sessions_agent_l2_recent",
    "ix_sessions_l3_recent",
    "ix_sessions_agent_l3_recent",
)
_TITLE: Final = "ix_sessions_tenant_title_trgm"
VARIANTS: Final = (
    Variant("as built", "nothing"),
    Variant(
        "title index on every session",
        "nothing: the title index as it was before revision 20261203000018",
        (_TITLE,),
        ((_TITLE, f"CREATE INDEX {_TITLE} ON sessions USING gin (tenant_id, title gin_trgm_ops)"),),
    ),
    Variant(
        "no preview search index",
        "indexed whole-tenant search of last_message",
        ("ix_sessions_tenant_last_message_trgm",),
    ),
    Variant(
        "no title search index",
        "indexed whole-tenant search of titles",
        ("ix_sessions_tenant_title_trgm",),
    ),
    Variant(
        "no search indexes",
        "indexed whole-tenant search",
        ("ix_sessions_tenant_last_message_trgm", "ix_sessions_tenant_title_trgm"),
    ),
    Variant("no subtree listing indexes", "one index walk per team or user", _SUBTREE),
    Variant(
        "no metadata pairs triggers",
        "indexed metadata filters",
        triggers=(
            "cortex_metadata_pairs_insert",
            "cortex_metadata_pairs_update",
            "cortex_metadata_pairs_delete",
        ),
    ),
    Variant(
        "no console index",
        "one index walk per console page across tenants",
        ("ix_sessions_console_recent",),
    ),
    Variant(
        "no agent listing indexes",
        "one index walk per agent filter",
        (
            "ix_sessions_agent_recent",
            "ix_sessions_agent_scope_recent",
            "ix_sessions_agent_l2_recent",
            "ix_sessions_agent_l3_recent",
        ),
    ),
)

# What a host typically files a session under.
METADATA: Final = {"channel": "web", "plan": "pro", "locale": "en-GB"}
_FLOOR_TABLES: Final = ("physical.sessions", "physical.messages")
_DISABLED_TRIGGERS_SQL: Final = """
SELECT pg_catalog.string_agg(tgname::text, ', ') FROM pg_catalog.pg_trigger
WHERE tgrelid = 'public.sessions'::regclass AND NOT tgisinternal AND tgenabled = 'D'
"""
_INDEXES_SQL: Final = """
SELECT c.relname::text AS name, pg_catalog.pg_get_indexdef(c.oid) AS definition
FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'public.sessions'::regclass
ORDER BY 1
"""


@dataclass
class Line:
    """One variant: per round, both sides' rates, machine CPU and WAL per append; medians in ``summary``."""

    name: str
    gives_up: str
    dropped: list[str]
    built: list[str]
    rounds: list[dict[str, float]] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_busy() -> float | None:
    """Seconds every CPU of this machine spent busy so far (``/proc/stat``), or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(f) for f in fields]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


async def _server_is_here(conn: asyncpg.Connection) -> bool:
    """Whether the server runs on this machine: its backend is a local postgres process."""
    return Backend(await conn.fetchval("SELECT pg_backend_pid()")).is_postgres()


async def run(db: BenchDatabase, p: Params) -> tuple[list[Line], bool]:
    """Every variant's blocks in every round; the counters and the indexes checked at the end."""
    owner = await asyncpg.connect(db.owner_url)
    phys = await asyncpg.create_pool(
        db.owner_url,
        min_size=p.concurrency,
        max_size=p.concurrency,
        server_settings={"search_path": "physical"},
    )
    lines = [
        Line(v.name, v.gives_up, [*v.indexes, *v.triggers], [n for n, _ in v.builds])
        for v in VARIANTS
    ]
    try:
        await owner.execute(PHYSICAL_DDL)
        await owner.execute("SET search_path = public")
        built = {r["name"]: r["definition"] for r in await owner.fetch(_INDEXES_SQL)}
        missing = sorted({i for v in VARIANTS for i in v.indexes} - built.keys())
        if missing:
            raise RuntimeError(f"the schema has no index {', '.join(missing)}")
        local = await _server_is_here(owner)
        async with cortex.connect(db.app_url, pool_size=p.concurrency, max_overflow=0) as store:
            with use_scope(SCOPE):
                ours = [
                    (await store.create_session(AGENT, metadata=METADATA)).id
                    for _ in range(p.concurrency)
                ]
            theirs = [await _physical_session(phys, "indexes") for _ in range(p.concurrency)]
            batch = [NewMessage("user", TEXT)]

            async def physical(w: int, i: int) -> int:
                await phys.fetchval(APPEND_SQL, theirs[w], "user", TEXT)
                return 1

            async def through_cortex(w: int, i: int) -> int:
                with use_scope(SCOPE):
                    await store.append_messages(ours[w], batch)
                return 1

            for r in range(p.rounds):
                # Each round starts its variants at another one: drift hits them alike.
                order = list(range(len(VARIANTS)))
                order = order[r % len(order) :] + order[: r % len(order)]
                for k in order:
                    variant, line = VARIANTS[k], lines[k]
                    for name in variant.indexes:
                        await owner.execute(f'DROP INDEX "{name}"')
                    for _, sql in variant.builds:
                        await owner.execute(sql)
                    for name in variant.triggers:
                        await owner.execute(f'ALTER TABLE sessions DISABLE TRIGGER "{name}"')
                    # Every variant starts from the same state: a rebuilt index
                    # is compact (and a GIN's pending list empty) where one
                    # left in place carries the dead entries of every block
                    # before, so each variant's remaining indexes are rebuilt
                    # and the dead rows vacuumed, the floor's alike.
                    for table in ("public.sessions", "public.messages", *_FLOOR_TABLES):
                        await owner.execute(f"VACUUM {table}")
                        await owner.execute(f"REINDEX TABLE {table}")
                    try:
                        # One block unmeasured: the variant's first appends warm its pages.
                        await timed_workers(Side(), p.concurrency, max(1, p.n // 4), through_cortex)
                        line.rounds.append(
                            await _round(
                                p, {"physical": physical, "cortex": through_cortex}, local, owner
                            )
                        )
                    finally:
                        for name in variant.triggers:
                            await owner.execute(f'ALTER TABLE sessions ENABLE TRIGGER "{name}"')
                        for name, _ in variant.builds:
                            await owner.execute(f'DROP INDEX "{name}"')
                        for name in variant.indexes:
                            await owner.execute(built[name])
        restored = {r["name"]: r["definition"] for r in await owner.fetch(_INDEXES_SQL)}
        broken = await check_invariants(db.owner_url)
        await owner.execute("SET search_path = physical")
        broken += await _physical_invariants(owner)
        if restored != built:
            broken.append("the indexes of sessions did not come back as they were")
        disabled = await owner.fetchval(_DISABLED_TRIGGERS_SQL)
        if disabled:
            broken.append(f"triggers of sessions left disabled: {disabled}")
    finally:
        await phys.close()
        await owner.close()
    for line in lines:
        line.summary = _summary(line.rounds)
    for problem in broken:
        print(f"!!! {problem}")
    print_table(lines)
    return lines, not broken


Op = Callable[[int, int], Awaitable[int]]


_WAL_AT: Final = "SELECT pg_catalog.pg_current_wal_insert_lsn()"


async def _round(
    p: Params, ops: dict[str, Op], local: bool, owner: asyncpg.Connection
) -> dict[str, float]:
    """Both sides' blocks, in rotating order: appends per second, machine CPU and WAL per append."""
    out: dict[str, float] = {}

    def block(name: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            side = Side()
            before = machine_busy() if local else None
            wal_before = await owner.fetchval(_WAL_AT)
            await timed_workers(side, p.concurrency, p.n, ops[name])
            wal = await owner.fetchval(
                "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_insert_lsn(), $1)",
                wal_before,
            )
            after = machine_busy() if local else None
            out[f"{name}_per_s"] = side.ops / side.wall
            out[f"{name}_wal_bytes"] = float(wal) / side.ops
            if before is not None and after is not None:
                out[f"{name}_cpu_us"] = (after - before) / side.ops * 1e6

        return go

    await rotate(1, [block(name) for name in ops])
    out["ratio"] = out["cortex_per_s"] / out["physical_per_s"]
    return out


def _summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Medians over the rounds, and the ratio's spread."""
    keys = sorted({k for r in rounds for k in r})
    out = {k: statistics.median(r[k] for r in rounds if k in r) for k in keys}
    out["ratio_min"] = min(r["ratio"] for r in rounds)
    out["ratio_max"] = max(r["ratio"] for r in rounds)
    return out


def print_table(lines: list[Line], console: Console | None = None) -> None:
    """One row per variant: rates, ratio to the floor, CPU per append, and the change from as built."""
    console = console or Console()
    table = Table(
        title="8 tasks appending to their own sessions, by schema variant (medians of rounds)",
        title_justify="left",
    )
    table.add_column("variant")
    columns = ("cortex/s", "floor/s", "÷ floor", "min-max", "CPU µs", "floor CPU", "CPU", "WAL B")
    for column in (*columns, "floor WAL"):
        table.add_column(column, justify="right")
    base = lines[0].summary.get("cortex_cpu_us")
    for line in lines:
        s = line.summary
        cpu = s.get("cortex_cpu_us")
        table.add_row(
            line.name,
            f"{s['cortex_per_s']:,.0f}",
            f"{s['physical_per_s']:,.0f}",
            f"{s['ratio']:.2f}",
            f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}",
            f"{cpu:.0f}" if cpu is not None else "-",
            f"{s['physical_cpu_us']:.0f}" if "physical_cpu_us" in s else "-",
            f"{(cpu / base - 1) * 100:+.0f}%" if cpu is not None and base else "-",
            f"{s['cortex_wal_bytes']:,.0f}",
            f"{s['physical_wal_bytes']:,.0f}",
            style="bold" if not line.dropped else None,
        )
    console.print(table)
    console.print(
        "CPU µs: the whole machine's busy time per append (client, backends, WAL writer),"
        " where the server runs here; CPU: against as built. WAL B: bytes of WAL per append."
        " ÷ floor: the median of the rounds' ratios to the physical floor. What each variant"
        " gives up:"
    )
    for line in lines[1:]:
        console.print(f"  {line.name}: {line.gives_up}")


def draw(report: dict[str, Any], png: Path) -> None:
    """Bars: machine CPU per append for each variant (the floor's as a line), ratios on the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Horizontal bars, first variant on top: nine names side by side overlapped.
    lines = list(reversed(report["results"]))
    names = [line["name"] for line in lines]
    cpu = [line["summary"].get("cortex_cpu_us", 0.0) for line in lines]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(lines) + 1.4))
    bars = ax.barh(range(len(lines)), cpu, color="#2a9d8f")
    floor = [line["summary"].get("physical_cpu_us") for line in lines]
    known = [f for f in floor if f is not None]
    if known:
        ax.axvline(statistics.median(known), color="#e76f51", ls="--", label="physical floor")
        ax.legend(fontsize=8, loc="lower right")
    for bar, line in zip(bars, lines, strict=True):
        ax.annotate(
            f" {line['summary']['ratio']:.2f} of the floor",
            (bar.get_width(), bar.get_y() + bar.get_height() / 2),
            ha="left",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(lines)), names, fontsize=8)
    ax.set_xlim(0, max(cpu, default=1) * 1.25)
    ax.set_xlabel("machine CPU µs per append")
    ax.set_title(
        f"What each promise's indexes cost an append (8 tasks, own sessions),"
        f" PostgreSQL {report['postgres_version'].split()[0]}, {report['cpus']} CPUs",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
