"""``python -m benchmarks <scenario> [--dsn URL] [--n N] [--concurrency C] [--quick] [--json FILE]``.

Scenarios: ``append`` (the message-counter path), ``listing`` (list and count
at scale), ``resolve`` (default resolution), ``frameworks`` (the ADK and
Agents SDK adapters beside those frameworks' own PostgreSQL stores; needs
the ``peers`` extra), ``physical`` (every operation beside the physical floor,
today's same-SQL floor, ADK and the Agents SDK, in one interleaved run; needs
the ``peers`` extra), or ``all``; and, not part of ``all``: ``migration``
(the migration chain on a legacy database of ``--n`` messages with the old
release writing throughout), ``memory`` (peak client RSS while
``iter_sessions`` walks ``--n`` sessions, default 1,000,000, and
``list_messages`` pages through a session of a tenth as many messages) and
``cpu`` (client and server CPU per call: the physical floor, cortex's routine
through raw asyncpg, and the store), ``filters`` (listing pages filtered by
metadata and by time, beside the unfiltered page, on ``--n`` sessions,
default 1,000,000) and ``indexes`` (what each promise's
indexes cost an append: 8 tasks on their own sessions beside the physical
floor, with the schema as built and without each group) and ``lifecycle``
(export, erase and import a subtree of ``--n`` messages, default 200,000,
while probes write beside it: rates, the export's peak RSS, the neighbours'
latencies and the longest lock wait) and ``retention`` (one retention run over a
subtree of ``--n`` messages, default 100,000: erasing idle sessions and trimming
long ones, beside a probe's appends) and ``telemetry`` (``get_session`` in a loop
with cortex.telemetry off, with metrics, and with spans and metrics, beside the
call as it was before telemetry existed) and ``server`` (appends and listing
pages through ``cortex serve`` in a subprocess, from ``--concurrency`` HTTP
workers, beside the same calls on the Store). The database server
long ones, beside a probe's appends) and ``console`` (the operator console's
page of waiting sessions across tenants on ``--n`` sessions, default
1,000,000). The database server
comes from ``--dsn`` (a superuser URL), else ``CORTEX_DATABASE_URL``, else the
embedded PostgreSQL; each scenario runs in a throwaway database it creates and
drops. ``--json`` writes one object per scenario and a PNG chart beside it.
Benchmarks measure; they never pass or fail on a time. The exit code is 1 only
if a correctness invariant broke.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import append, listing, memory, migration, resolve, retention
from benchmarks._common import bench_database, kept_database, server_facts

SCENARIOS = ("append", "listing", "resolve", "frameworks", "physical")
# Not part of ``all``: each takes minutes and reports a table of its own.
SEPARATE = (
    "migration",
    "memory",
    "cpu",
    "indexes",
    "filters",
    "lifecycle",
    "retention",
    "telemetry",
    "server",
    "console",
)
# Scenarios that can measure again on a database an earlier run kept (``--database``).
REUSABLE = ("filters", "lifecycle")


@contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    from cortex.embedded import database_url

    with database_url() as (url, _embedded):
        yield url


def _params(scenario: str, args: argparse.Namespace) -> Any:
    quick = args.quick
    c = args.concurrency
    if scenario == "append":
        n = args.n or (800 if quick else 4000)
        return append.Params(n=n, concurrency=c, k=args.k, sessions=50 if quick else 200)
    if scenario == "resolve":
        n = args.n or (800 if quick else 4000)
        return resolve.Params(n=n, concurrency=c, race_pairs=20 if quick else 50)
    if scenario == "frameworks":
        from benchmarks import frameworks

        n = args.n or (400 if quick else 2000)
        return frameworks.Params(n=n, concurrency=c, sessions_per_user=20 if quick else 50)
    if scenario == "physical":
        from benchmarks import physical

        n = args.n or (400 if quick else 2000)
        return physical.Params(
            n=n,
            concurrency=c,
            list_sessions=200 if quick else 1000,
            repeats=40 if quick else 200,
            existing=20 if quick else 50,
        )
    if scenario == "cpu":
        from benchmarks import cpu

        return cpu.Params(
            n=args.n or (200 if quick else 2000), list_sessions=200 if quick else 1000
        )
    if scenario == "indexes":
        from benchmarks import indexes

        return indexes.Params(
            n=args.n or (40 if quick else 400), concurrency=c, rounds=2 if quick else 4
        )
    if scenario == "filters":
        from benchmarks import filters

        return filters.Params(
            sessions=args.n or (20_000 if quick else 1_000_000), repeats=30 if quick else 200
        )
    if scenario == "console":
        from benchmarks import console

        return console.Params(
            sessions=args.n or (20_000 if quick else 1_000_000), repeats=30 if quick else 200
        )
    if scenario == "lifecycle":
        from benchmarks import lifecycle

        return lifecycle.Params(messages=args.n or (20_000 if quick else 200_000))
    if scenario == "telemetry":
        from benchmarks import telemetry

        return telemetry.Params(n=args.n or (300 if quick else 2000), blocks=4 if quick else 20)
    if scenario == "server":
        from benchmarks import server

        return server.Params(
            n=args.n or (400 if quick else 4000),
            concurrency=c,
            sessions=200 if quick else 1000,
            messages=200 if quick else 500,
            repeats=40 if quick else 400,
            seconds=1 if quick else 3,
            generator=args.generator,
            metrics=not args.no_metrics,
            baseline=os.path.abspath(args.baseline) if args.baseline else None,
        )
    if scenario == "retention":
        messages = args.n or (20_000 if quick else 100_000)
        return retention.Params(messages=messages, sessions=max(1, messages // 100))
    if scenario == "memory":
        sessions = args.n or (100_000 if quick else 1_000_000)
        return memory.Params(sessions=sessions, messages=max(1, sessions // 10))
    sessions = args.n or (20_000 if quick else 1_000_000)
    return listing.Params(sessions=sessions, repeats=30 if quick else 200)


async def _run_migration(server: str, args: argparse.Namespace) -> dict[str, Any]:
    facts = await server_facts(server)
    params = migration.Params(
        messages=args.n or (200_000 if args.quick else 5_000_000),
        interval=args.probe_interval,
        batch_rows=args.backfill_batch,
    )
    print(f"\n== migration ({params}) on PostgreSQL {facts['postgres_version']}")
    started = time.perf_counter()
    async with bench_database(server, keep=args.keep, revision=migration.LEGACY) as db:
        report, ok = await migration.run(db, params)
    migration.print_report(report)
    return {
        "scenario": "migration",
        "params": vars(params) if hasattr(params, "__dict__") else params.__dict__,
        **facts,
        "seconds": round(time.perf_counter() - started, 1),
        "report": report,
        "invariants_ok": ok,
    }


async def _run_memory(server: str, args: argparse.Namespace) -> dict[str, Any]:
    facts = await server_facts(server)
    params = _params("memory", args)
    print(f"\n== memory ({params}) on PostgreSQL {facts['postgres_version']}")
    started = time.perf_counter()
    async with bench_database(server, keep=args.keep) as db:
        report, ok = await memory.run(db, params)
    return {
        "scenario": "memory",
        "params": params.__dict__,
        **facts,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "report": report,
        "invariants_ok": ok,
    }


async def _run_retention(server: str, args: argparse.Namespace) -> dict[str, Any]:
    facts = await server_facts(server)
    params = _params("retention", args)
    print(f"\n== retention ({params}) on PostgreSQL {facts['postgres_version']}")
    started = time.perf_counter()
    async with bench_database(server, keep=args.keep) as db:
        report, ok = await retention.run(db, params)
    return {
        "scenario": "retention",
        "params": params.__dict__,
        **facts,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "report": report,
        "invariants_ok": ok,
    }


async def _run_one(scenario: str, server: str, args: argparse.Namespace) -> dict[str, Any]:
    if scenario == "migration":
        return await _run_migration(server, args)
    if scenario == "memory":
        return await _run_memory(server, args)
    if scenario == "retention":
        return await _run_retention(server, args)
    facts = await server_facts(server)
    params = _params(scenario, args)
    print(f"\n== {scenario} ({params}) on PostgreSQL {facts['postgres_version']}")
    started = time.perf_counter()
    kept = args.database and scenario in REUSABLE
    async with (
        kept_database(server, args.database) if kept else bench_database(server, keep=args.keep)
    ) as db:
        modules: dict[str, Any] = {"append": append, "listing": listing, "resolve": resolve}
        if scenario == "frameworks":
            from benchmarks import frameworks

            modules["frameworks"] = frameworks
        if scenario == "physical":
            from benchmarks import physical

            modules["physical"] = physical
        if scenario == "cpu":
            from benchmarks import cpu

            modules["cpu"] = cpu
        if scenario == "indexes":
            from benchmarks import indexes

            modules["indexes"] = indexes
        if scenario == "filters":
            from benchmarks import filters

            modules["filters"] = filters
        if scenario == "lifecycle":
            from benchmarks import lifecycle

            modules["lifecycle"] = lifecycle
        if scenario == "telemetry":
            from benchmarks import telemetry

            modules["telemetry"] = telemetry
        if scenario == "server":
            from benchmarks import server as http_server

            modules["server"] = http_server
        if scenario == "console":
            from benchmarks import console

            modules["console"] = console
        module = modules[scenario]
        results, ok = await module.run(db, params)
    return {
        "scenario": scenario,
        "params": vars(params) if hasattr(params, "__dict__") else params.__dict__,
        **facts,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "results": [r if isinstance(r, dict) else r.as_dict() for r in results],
        "invariants_ok": ok,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all", *SEPARATE])
    parser.add_argument(
        "--dsn",
        help="superuser URL of a PostgreSQL server (default: $CORTEX_DATABASE_URL, else embedded)",
    )
    parser.add_argument(
        "--n", type=int, default=0, help="appends/resolves per side per mode, or sessions to seed"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--k", type=int, default=1, help="messages per append")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: each scenario well under a minute"
    )
    parser.add_argument(
        "--probe-interval", type=float, default=0.5, help="migration: seconds between probes"
    )
    parser.add_argument(
        "--backfill-batch", type=int, default=20_000, help="migration: legacy messages per batch"
    )
    parser.add_argument("--json", type=Path, help="write results here (and a PNG chart beside it)")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway databases")
    parser.add_argument(
        "--database",
        help=f"{', '.join(REUSABLE)}: measure again on this kept database (upgraded to head),"
        " without seeding",
    )
    parser.add_argument(
        "--generator",
        choices=("auto", "wrk", "httpx"),
        default="auto",
        help="server: the load generator (auto: wrk when it is on the PATH, else httpx)",
    )
    parser.add_argument(
        "--no-metrics", action="store_true", help="server: run cortex serve --no-metrics"
    )
    parser.add_argument(
        "--baseline",
        help="server: also run cortex serve from this source tree (an earlier commit's"
        " checkout) as a third side",
    )
    args = parser.parse_args(argv)
    # Progress of long steps (the legacy build, the backfill): a bar on a terminal, else log lines.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    with _server(args.dsn or os.environ.get("CORTEX_DATABASE_URL")) as server:
        reports = [asyncio.run(_run_one(s, server, args)) for s in scenarios]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(reports if len(reports) > 1 else reports[0], indent=2, default=str)
        )
        print(f"\nwrote {args.json}")
    if args.json and args.scenario == "cpu":
        from benchmarks import cpu

        cpu.draw(reports[0], args.json.with_suffix(".png"))
        print(f"wrote {args.json.with_suffix('.png')}")
    elif args.json and args.scenario == "indexes":
        from benchmarks import indexes

        indexes.draw(reports[0], args.json.with_suffix(".png"))
        print(f"wrote {args.json.with_suffix('.png')}")
    elif args.json and args.scenario not in SEPARATE:  # their reports are tables
        try:
            from benchmarks.chart import draw
        except ImportError:
            print("(no chart: pip install matplotlib)")
        else:
            png = args.json.with_suffix(".png")
            draw(reports, png)
            print(f"wrote {png}")
    broken = [r["scenario"] for r in reports if not r["invariants_ok"]]
    if broken:
        print(f"!!! invariants broken in: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
