"""Migration at scale: a legacy database, the whole chain, and the old release writing throughout.

``python -m benchmarks migration --n 5000000`` builds a legacy database (schema
20260801000001) of ``n`` messages, set-based with a progress bar: about
``n / 17.8`` conversations over about ``n / 2,500`` tenants, six of them large
(18 % of the messages), scopes of depth 1-5, a few conversations whose agent
id or scope cortex refuses; a conversation's messages are spread over the
whole table, as years of interleaved writes leave them. Then it runs each
revision of the chain as its own ``cortex db upgrade REV`` process while a
*probe* plays the old release: every ``interval`` seconds, with
``lock_timeout = 1s``, it inserts a legacy row into a random existing
conversation and reads it back. Per revision it reports the duration, the
longest probe statement (an upper bound of the lock window the application
saw), probe failures, WAL written and the CLI's peak memory (its max RSS).

Afterwards ``cortex db backfill`` sessions the probe's last rows (written
after the backfill revision ran), and the invariants are checked: every valid
legacy message in exactly one session, none of the refused ones, counters
equal rows, ``seq`` gap-free, exactly one default per conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import asyncpg
from alembic.script import ScriptDirectory
from rich.console import Console
from rich.table import Table

from benchmarks._common import BenchDatabase
from cortex._db.engine import driver_dsn
from cortex._revision_helpers.backfill_v1 import is_valid
from cortex._revision_helpers.progress_v1 import progress
from cortex.migrate import alembic_config

LEGACY: Final = "20260801000001"
CHUNK: Final = 250_000
# Legacy rows the old release writes that cortex refuses (agent id, scope).
REFUSED: Final = (("bot\u00a0x", "t0/u1"), ("bot\u200b", "t1/u2"), ("bot", "t2/bad scope"))


@dataclass(frozen=True)
class Params:
    messages: int = 5_000_000
    interval: float = 0.5
    batch_rows: int = 20_000

    @property
    def conversations(self) -> int:
        return max(10, round(self.messages / 17.76))

    @property
    def tenants(self) -> int:
        return max(8, round(self.messages / 2_499))


@dataclass
class Sample:
    at: float
    seconds: float
    error: str = ""


@dataclass
class Step:
    revision: str
    seconds: float = 0.0
    wal_bytes: int = 0
    peak_rss_mib: float = 0.0
    probe_calls: int = 0
    probe_max_ms: float = 0.0
    probe_failures: int = 0
    errors: list[str] = field(default_factory=list)
    note: str = ""


# Conversation c (0-based): tenant, scope of depth 1-5, agent. Messages m go
# to conversation m % conversations, so each one's rows are spread over the table.
_CONVERSATION = """
    CASE WHEN abs(hashint8extended({c}, 1) % 100) < 18 THEN 't' || ({c} % 6)
         ELSE 't' || (6 + {c} % ({tenants} - 6)) END
"""
_BUILD = f"""
INSERT INTO messages (id, agent_id, scope, role, content, created_at)
SELECT md5(m::text)::uuid,
       -- (agent, scope) distinct per conversation: the agent carries c at
       -- depth 1, the scope's second segment below it.
       CASE WHEN d = 1 THEN 'agent-' || c ELSE 'agent-' || (c % 7) END,
       concat_ws('/', {_CONVERSATION.format(c="c", tenants=":tenants")},
                 CASE WHEN d >= 2 THEN 'u' || c END,
                 CASE WHEN d >= 3 THEN 'p' || (c % 40) END,
                 CASE WHEN d >= 4 THEN 'thread' END,
                 CASE WHEN d >= 5 THEN 'x' END),
       CASE WHEN m % 2 = 0 THEN 'user' ELSE 'assistant' END,
       'message ' || m || ' ' || repeat(chr((97 + m % 26)::int), (m % 120)::int),
       timestamptz '2026-07-01' - make_interval(secs => ((:n - m) * 3)::double precision)
FROM generate_series(:lo::bigint, :hi::bigint) AS m,
     LATERAL (SELECT m % :conversations AS c) AS k,
     LATERAL (SELECT 1 + abs(hashint8extended(c, 2) % 5) AS d) AS depth
"""


async def build_legacy(owner_url: str, params: Params, *, show: bool = True) -> None:
    """Fill the legacy ``messages`` table with ``params.messages`` rows, set-based."""
    conn = await asyncpg.connect(owner_url)
    try:
        sql = _BUILD.replace(":tenants", str(params.tenants))
        sql = sql.replace(":conversations", str(params.conversations))
        sql = sql.replace(":n", str(params.messages))
        statement = await conn.prepare(sql.replace(":lo", "$1").replace(":hi", "$2"))
        with progress("legacy messages", params.messages, unit="messages") as advance:
            for lo in range(0, params.messages, CHUNK):
                hi = min(lo + CHUNK, params.messages) - 1
                await statement.fetch(lo, hi)
                advance(hi - lo + 1)
        for agent, scope in REFUSED:
            await conn.execute(
                "INSERT INTO messages (id, agent_id, scope, role, content, created_at) "
                "VALUES (gen_random_uuid(), $1, $2, 'user', 'refused', now())",
                agent,
                scope,
            )
        await conn.execute("VACUUM ANALYZE messages")
    finally:
        await conn.close()


class Probe:
    """The old release: a legacy insert and read every ``interval`` seconds, lock_timeout 1s."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.samples: list[Sample] = []
        self.written = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute("SET lock_timeout = '1s'")
            keys = [
                (r["agent_id"], r["scope"])
                for r in await conn.fetch(
                    "SELECT agent_id, scope FROM messages TABLESAMPLE SYSTEM (1) LIMIT 200"
                )
            ] or [("agent-0", "t0")]
            rng = random.Random(7)
            while not self._stop.is_set():
                agent, scope = rng.choice(keys)
                await self._one(conn, agent, scope)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
        finally:
            await conn.close()

    async def _one(self, conn: asyncpg.Connection, agent: str, scope: str) -> None:
        started = time.perf_counter()
        try:
            # Exactly the legacy release's statements; the read goes by the row's
            # ctid so it measures the lock, not a scan of millions of rows.
            ctid = await conn.fetchval(
                "INSERT INTO messages (id, agent_id, scope, role, content, created_at) "
                "VALUES (gen_random_uuid(), $1, $2, 'user', 'probe', now()) RETURNING ctid",
                agent,
                scope,
            )
            self.written += 1
            found = await conn.fetchval(
                "SELECT count(*) FROM messages WHERE ctid = $1 AND scope = $2", ctid, scope
            )
            error = "" if found == 1 else "legacy read did not find its row"
        except asyncpg.PostgresError as exc:
            error = f"{exc.sqlstate}: {exc}"
        self.samples.append(Sample(started, time.perf_counter() - started, error))

    def stop(self) -> None:
        self._stop.set()


def chain() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def _upgrade(owner_url: str, revision: str, params: Params, log: Any) -> tuple[int, float]:
    """Run ``cortex db upgrade REV`` as its own process; return its exit code and peak RSS (MiB)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cortex.cli",
            "--database-url",
            owner_url,
            "db",
            "upgrade",
            revision,
            "--backfill-batch",
            str(params.batch_rows),
        ],
        stdout=log,
        stderr=log,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024  # Linux: KiB


async def _wal(conn: asyncpg.Connection) -> int:
    """WAL position in bytes."""
    return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"))


async def run_chain(db: BenchDatabase, params: Params) -> tuple[list[Step], Probe]:
    """Upgrade revision by revision with the probe running; measure each step."""
    probe = Probe(db.owner_url, params.interval)
    probe_task = asyncio.create_task(probe.run())
    await asyncio.sleep(params.interval * 2)
    steps: list[Step] = []
    conn = await asyncpg.connect(db.owner_url)
    try:
        # The CLI's log (progress lines, errors) for each step: kept for a failure's report.
        with tempfile.TemporaryFile() as log:
            for revision in chain()[1:]:
                log.seek(0)
                log.truncate()
                step = Step(revision)
                lsn = await _wal(conn)
                first = len(probe.samples)
                started = time.perf_counter()
                code, rss = await asyncio.to_thread(_upgrade, db.owner_url, revision, params, log)
                step.seconds = time.perf_counter() - started
                step.peak_rss_mib = rss
                step.wal_bytes = await _wal(conn) - lsn
                if code != 0:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                    step.errors.append(f"cortex db upgrade {revision} exited {code}: {tail}")
                window = probe.samples[first:]
                step.probe_calls = len(window)
                step.probe_max_ms = max((s.seconds for s in window), default=0.0) * 1e3
                step.probe_failures = sum(1 for s in window if s.error)
                step.errors += sorted({s.error for s in window if s.error})
                steps.append(step)
                if code != 0:
                    break
    finally:
        probe.stop()
        await probe_task
        await conn.close()
    return steps, probe


async def check_invariants(owner_url: str) -> list[str]:
    """Every broken invariant, described; [] when all hold."""
    conn = await asyncpg.connect(owner_url)
    broken: list[str] = []
    try:
        keys = await conn.fetch(
            "SELECT DISTINCT agent_id, scope FROM messages WHERE scope IS NOT NULL"
        )
        refused = [(r["agent_id"], r["scope"]) for r in keys if not is_valid(*r)]
        await conn.execute(
            "CREATE TEMP TABLE refused (agent_id text, scope text); "
            "CREATE TEMP TABLE valid_keys AS SELECT DISTINCT agent_id, scope FROM messages "
            "WHERE scope IS NOT NULL"
        )
        await conn.executemany("INSERT INTO refused VALUES ($1, $2)", refused)
        await conn.execute(
            "DELETE FROM valid_keys v USING refused r "
            "WHERE v.agent_id = r.agent_id AND v.scope = r.scope"
        )
        checks = {
            "valid legacy messages without a session": """
                SELECT count(*) FROM messages m JOIN valid_keys v USING (agent_id, scope)
                WHERE m.session_id IS NULL""",
            "refused legacy messages in a session": """
                SELECT count(*) FROM messages m JOIN refused r USING (agent_id, scope)
                WHERE m.session_id IS NOT NULL""",
            "sessions whose counter differs from their rows, or seq with gaps": """
                SELECT count(*) FROM sessions s LEFT JOIN (
                    SELECT tenant_id, session_id, count(*) AS n, max(seq) AS top,
                           count(DISTINCT seq) AS distinct_seq
                    FROM messages WHERE session_id IS NOT NULL GROUP BY 1, 2
                ) c ON c.tenant_id = s.tenant_id AND c.session_id = s.id
                WHERE s.message_count <> coalesce(c.n, 0) OR c.top <> c.n OR c.distinct_seq <> c.n""",
            "valid conversations without exactly one default session": """
                SELECT count(*) FROM valid_keys v LEFT JOIN LATERAL (
                    SELECT count(*) AS n FROM sessions s
                    WHERE s.tenant_id = split_part(v.scope, '/', 1)
                      AND s.agent_id = v.agent_id COLLATE "C" AND s.scope = v.scope COLLATE "C"
                      AND s.is_default
                ) d ON true WHERE d.n <> 1""",
            "messages in a session of another conversation": """
                SELECT count(*) FROM messages m JOIN sessions s
                  ON s.tenant_id = m.tenant_id AND s.id = m.session_id
                WHERE m.scope IS NOT NULL
                  AND (s.agent_id <> m.agent_id COLLATE "C" OR s.scope <> m.scope COLLATE "C")""",
        }
        for name, sql in checks.items():
            n = await conn.fetchval(sql)
            if n:
                broken.append(f"{name}: {n}")
    finally:
        await conn.close()
    return broken


def _backfill_again(owner_url: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "cortex.cli", "--database-url", owner_url, "db", "backfill"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode


async def run(db: BenchDatabase, params: Params) -> tuple[dict[str, Any], bool]:
    """Build, migrate with the probe, check. Returns the report and whether invariants held."""
    owner = driver_dsn(db.owner_url)
    started = time.perf_counter()
    await build_legacy(owner, params)
    build_seconds = time.perf_counter() - started
    conn = await asyncpg.connect(owner)
    try:
        conversations = await conn.fetchval(
            "SELECT count(*) FROM (SELECT DISTINCT agent_id, scope FROM messages) AS c"
        )
        tenants = await conn.fetchval(
            "SELECT count(DISTINCT split_part(scope, '/', 1)) FROM messages"
        )
        large = await conn.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM messages GROUP BY split_part(scope, '/', 1) "
            "HAVING count(*) > 100000) AS t"
        )
    finally:
        await conn.close()
    steps, probe = await run_chain(db, params)
    catch_up = await asyncio.to_thread(_backfill_again, owner)
    broken = await check_invariants(owner)
    if catch_up != 0:
        broken.append(f"cortex db backfill exited {catch_up}")
    backfill_step = next((s for s in steps if s.revision == "20260824000004"), None)
    legacy_rows = params.messages + len(REFUSED)
    report = {
        "messages": legacy_rows,
        "conversations": conversations,
        "tenants": tenants,
        "tenants_over_100k_messages": large,
        "build_seconds": round(build_seconds, 1),
        "probe_interval_s": params.interval,
        "probe_rows_written": probe.written,
        "backfill_messages_per_s": round(legacy_rows / backfill_step.seconds)
        if backfill_step and backfill_step.seconds
        else None,
        "steps": [asdict(s) for s in steps],
        "broken_invariants": broken,
    }
    ok = not broken and all(not s.errors for s in steps)
    return report, ok


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=120)
    table = Table(
        title=(
            f"migration chain: {report['messages']:,} legacy messages, "
            f"{report['conversations']:,} conversations, {report['tenants']:,} tenants; "
            f"probe every {report['probe_interval_s']} s"
        ),
        title_justify="left",
    )
    table.add_column("revision", no_wrap=True)
    for column in ("seconds", "longest probe (ms)", "probe failures", "WAL (MiB)"):
        table.add_column(column, justify="right")
    table.add_column("CLI peak RSS (MiB)", justify="right")
    for s in report["steps"]:
        table.add_row(
            s["revision"],
            f"{s['seconds']:.1f}",
            f"{s['probe_max_ms']:.0f}",
            f"{s['probe_failures']}/{s['probe_calls']}",
            f"{s['wal_bytes'] / 2**20:,.0f}",
            f"{s['peak_rss_mib']:.0f}",
        )
    console.print(table)
    if report["backfill_messages_per_s"]:
        console.print(f"backfill: {report['backfill_messages_per_s']:,} legacy messages/s")
    for s in report["steps"]:
        for error in s["errors"]:
            console.print(f"[red]{s['revision']}: {error}[/]")
    for broken in report["broken_invariants"]:
        console.print(f"[red]invariant broken: {broken}[/]")
