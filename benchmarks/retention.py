"""Scenario ``retention``: one retention run over a subtree of about 100,000 messages.

``python -m benchmarks retention [--dsn URL] [--n MESSAGES] [--quick] [--json FILE]``

Seeds, set-based as the database owner, ``sessions`` sessions of
``messages / sessions`` messages of 200 bytes each beneath one tenant
(``ret/u<i>``): a quarter untouched for 100 days, the rest busy. One policy
on the tenant erases sessions idle for 30 days and keeps a session's newest
20 messages, so a run erases the idle quarter and trims every other
session. Then, as the application role under row-level security:

* ``apply_retention(dry_run=True)``: the walk without writes;
* ``apply_retention()``: the run, while a probe appends one message every
  50 ms to a session of the same tenant (a scope whose policy keeps
  everything) and records how long each append took;
* ``apply_retention()`` again: nothing left to do.

Printed: seconds and messages removed a second for each, the probe's
appends (count, median, p99, max) and the largest. The run fails only if
the dry run's report differs from the run's, a second run removes
anything, or a session's counters disagree with its rows afterwards.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import asyncpg

import cortex
from benchmarks._common import BenchDatabase
from cortex import NewMessage, RetentionPolicy, use_scope

TENANT: Final = "ret"
PROBE_EVERY: Final = 0.05


@dataclass(frozen=True)
class Params:
    messages: int = 100_000
    sessions: int = 1_000
    keep: int = 20


async def _seed(db: BenchDatabase, p: Params) -> None:
    per = max(1, p.messages // p.sessions)
    conn = await asyncpg.connect(db.owner_url)
    try:
        await conn.execute(
            "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2,"
            " message_count, last_message, created_at, updated_at)"
            " SELECT $1, gen_random_uuid(), 'bot', $1 || '/u' || i, 2, $1 || '/u' || i, $2,"
            " 'newest', now() - interval '200 days',"
            " CASE WHEN i % 4 = 0 THEN now() - interval '100 days' ELSE now() END"
            " FROM generate_series(1, $3) AS i",
            TENANT,
            per,
            p.sessions,
        )
        await conn.execute(
            "INSERT INTO messages (tenant_id, id, session_id, seq, role, content, created_at)"
            " SELECT $1, gen_random_uuid(), s.id, g, 'user', repeat('x', 200), s.created_at"
            " FROM sessions AS s, generate_series(1, $2) AS g WHERE s.tenant_id = $1",
            TENANT,
            per,
        )
        await conn.execute("ANALYZE sessions; ANALYZE messages")
    finally:
        await conn.close()


async def _consistent(owner_url: str) -> bool:
    conn = await asyncpg.connect(owner_url)
    try:
        bad = await conn.fetchval(
            "SELECT count(*) FROM (SELECT s.id FROM sessions s LEFT JOIN messages m"
            " ON m.tenant_id = s.tenant_id AND m.session_id = s.id WHERE s.tenant_id = $1"
            " GROUP BY s.id, s.message_count, s.trimmed_count HAVING count(m.id) <> s.message_count"
            " OR (count(m.id) > 0 AND (min(m.seq) <> s.trimmed_count + 1"
            " OR max(m.seq) <> s.trimmed_count + s.message_count))) AS broken",
            TENANT,
        )
    finally:
        await conn.close()
    return int(bad) == 0


async def _timed(store: cortex.Store, *, dry_run: bool) -> tuple[cortex.RetentionReport, float]:
    started = time.perf_counter()
    report = await store.apply_retention(dry_run=dry_run)
    return report, time.perf_counter() - started


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    started = time.perf_counter()
    await _seed(db, p)
    print(
        f"  seeded {p.sessions:,} sessions, {p.messages:,} messages in {time.perf_counter() - started:.0f} s"
    )
    results: list[dict[str, Any]] = []
    async with cortex.connect(db.app_url) as store:
        with use_scope(TENANT):
            await store.set_retention_policy(
                RetentionPolicy(delete_idle_after=timedelta(days=30), keep_last_messages=p.keep)
            )
            # Beside the policy's sessions, in their tenant: it shares their tables and shard.
            await store.set_retention_policy(RetentionPolicy(), f"{TENANT}/probe")
        with use_scope(f"{TENANT}/probe"):
            busy = await store.create_session("probe")
        with use_scope(TENANT):
            dry, dry_seconds = await _timed(store, dry_run=True)
            waits: list[float] = []
            done = asyncio.Event()

            async def probe() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    await store.append_message(busy.id, NewMessage("user", "probe"))
                    waits.append(time.perf_counter() - t)
                    await asyncio.sleep(PROBE_EVERY)

            task = asyncio.create_task(probe())
            real, real_seconds = await _timed(store, dry_run=False)
            done.set()
            await task
            again, again_seconds = await _timed(store, dry_run=False)
    for name, report, seconds in (
        ("dry run", dry, dry_seconds),
        ("run", real, real_seconds),
        ("second run", again, again_seconds),
    ):
        row = {
            "step": name,
            "seconds": round(seconds, 2),
            "sessions_erased": report.sessions,
            "messages_removed": report.messages,
            "trimmed_sessions": report.trimmed_sessions,
            "messages_per_second": round(report.messages / seconds) if seconds else 0,
        }
        results.append(row)
        print(
            f"  {name:<10} {seconds:6.2f} s  {report.sessions:>6,} erased"
            f"  {report.trimmed_sessions:>6,} trimmed  {report.messages:>8,} messages"
            f"  {row['messages_per_second']:>8,}/s"
        )
    ms = sorted(w * 1000 for w in waits)
    probe_row = {
        "step": "appends during the run",
        "count": len(ms),
        "median_ms": round(statistics.median(ms), 2) if ms else 0,
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2) if ms else 0,
        "max_ms": round(ms[-1], 2) if ms else 0,
    }
    results.append(probe_row)
    print(
        f"  appends during the run: {probe_row['count']} (median {probe_row['median_ms']} ms,"
        f" p99 {probe_row['p99_ms']} ms, max {probe_row['max_ms']} ms)"
    )
    same = real.model_dump() == dry.model_dump() | {"dry_run": False}
    ok = same and again.messages == 0 and await _consistent(db.owner_url)
    return results, ok
