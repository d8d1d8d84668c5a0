"""Scenario ``lifecycle``: export, erase and import a large subtree while another scope keeps working.

``python -m benchmarks lifecycle [--dsn URL] [--n MESSAGES] [--quick] [--json FILE]``

Seeds, set-based as the owner, a subtree ``life/team/u1`` of ``messages``
messages (default 200,000, ``--quick`` 20,000) of 200 bytes in sessions of
``per_session`` messages spread over ``threads`` scopes beneath it (so the
erasure crosses segments, with a state document at each), and a neighbour
``life/team/u10`` (a text prefix of the subtree's path, not in it) whose
sessions the probes write to. Then, as the application role under
row-level security:

* export: ``Store.export_scope`` in a child process of its own, writing
  JSON Lines to a file: messages per second and the child's peak resident
  set size (the pattern of :mod:`benchmarks.memory`; target under 150 MB);
* erase: ``Store.erase_scope`` while ``probes`` tasks append to and read
  the neighbour's sessions: messages erased per second (target at least
  20,000), each probe call's latency before and during the erasure, and
  the longest lock wait any backend was seen in (``pg_stat_activity``
  sampled every few milliseconds; target under 100 ms);
* import: ``Store.import_scope`` of the file: messages per second, and the
  rows afterwards compared with the rows before (the identity).

Benchmarks measure; the run fails only if an invariant breaks (a probe
call failing, a row not coming back, the neighbour losing a row).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncpg
import sqlalchemy as sa

import cortex
from benchmarks._common import BenchDatabase
from cortex import NewMessage, use_scope

TENANT: Final = "life"
ROOT: Final = "life/team/u1"
NEIGHBOUR: Final = "life/team/u10"
TARGET_MB: Final = 150
TARGET_RATE: Final = 20_000
TARGET_WAIT_MS: Final = 100
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class Params:
    messages: int = 200_000
    per_session: int = 20
    threads: int = 50
    probes: int = 4
    sample_ms: int = 5


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float | None:
    """A local process's CPU seconds (Linux /proc): the server backend's share of the work."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _backend_pid(store: cortex.Store) -> int:
    """The server process behind a store whose pool holds one connection."""
    async with store.engine.connect() as conn:
        return int(await conn.scalar(sa.text("SELECT pg_backend_pid()")))


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_SEED_SESSIONS: Final = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, scope_l3,
                      title, metadata_json, message_count, last_message, created_at, updated_at)
SELECT 'life', gen_random_uuid(), 'bench',
       'life/team/u1/thread-' || (g % $2::int), 4, 'life/team', 'life/team/u1',
       'session ' || g, '{}', $3::int, 'last', now() - interval '1 hour',
       now() - g * interval '1 millisecond'
FROM generate_series(1, $1::int) AS g
"""
_SEED_MESSAGES: Final = """
INSERT INTO messages (tenant_id, id, session_id, seq, role, content, metadata_json, created_at)
SELECT 'life', gen_random_uuid(), s.id, g,
       CASE WHEN g % 2 = 1 THEN 'user' ELSE 'assistant' END,
       left(md5(s.id::text || g) || repeat(' the quick brown fox', 10), 200),
       '{}', s.created_at + g * interval '1 millisecond'
FROM sessions AS s CROSS JOIN generate_series(1, $1::int) AS g
WHERE s.tenant_id = 'life' AND s.scope_l3 = 'life/team/u1'
"""
_SEED_DOCUMENTS: Final = """
INSERT INTO scope_data (tenant_id, scope, data)
SELECT 'life', 'life/team/u1/thread-' || g, jsonb_build_object('n', (g)::text)
FROM generate_series(0, $1::int - 1) AS g
"""
# Every row of the subtree, as one fingerprint per table (the identity check).
_FINGERPRINT: Final = """
SELECT (SELECT count(*) FROM sessions WHERE tenant_id = 'life' AND scope_l3 = 'life/team/u1'),
       (SELECT md5(string_agg(s::text, '' ORDER BY s.id)) FROM sessions AS s
        WHERE tenant_id = 'life' AND scope_l3 = 'life/team/u1'),
       (SELECT count(*) FROM messages AS m JOIN sessions AS s
        ON s.tenant_id = m.tenant_id AND s.id = m.session_id
        WHERE s.tenant_id = 'life' AND s.scope_l3 = 'life/team/u1'),
       (SELECT md5(string_agg(m::text, '' ORDER BY m.id)) FROM messages AS m
        WHERE m.tenant_id = 'life' AND m.session_id IN (
            SELECT id FROM sessions WHERE tenant_id = 'life' AND scope_l3 = 'life/team/u1')),
       (SELECT md5(string_agg(d::text, '' ORDER BY d.scope)) FROM scope_data AS d
        WHERE tenant_id = 'life' AND scope >= 'life/team/u1/' AND scope < 'life/team/u10')
"""


async def _seed(db: BenchDatabase, p: Params) -> tuple[list[str], float]:
    """The subtree, set-based; the neighbour's sessions through the store."""
    started = time.perf_counter()
    sessions = p.messages // p.per_session
    conn = await asyncpg.connect(db.owner_url)
    try:
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(_SEED_SESSIONS, sessions, p.threads, p.per_session)
        await conn.execute(_SEED_MESSAGES, p.per_session)
        await conn.execute(_SEED_DOCUMENTS, p.threads)
        await conn.execute("VACUUM ANALYZE sessions")
        await conn.execute("VACUUM ANALYZE messages")
    finally:
        await conn.close()
    async with cortex.connect(db.app_url, pool_size=2) as store:
        with use_scope(NEIGHBOUR):
            made = [await store.create_session("probe") for _ in range(p.probes)]
    return [s.id for s in made], time.perf_counter() - started


async def _fingerprint(db: BenchDatabase) -> tuple[Any, ...]:
    conn = await asyncpg.connect(db.owner_url)
    try:
        row = await conn.fetchrow(_FINGERPRINT)
    finally:
        await conn.close()
    return tuple(row) if row is not None else ()


# --- export, in a child process (its peak RSS is the export's alone) -------------------------


async def _export(url: str, path: str, out: str) -> dict[str, Any]:
    async with cortex.connect(url, pool_size=1, max_overflow=0) as store:
        backend = await _backend_pid(store)
        server_cpu = _process_cpu(backend)
        gc.collect()
        before = _peak_mib()
        messages = records = written = 0
        cpu = _cpu_seconds()
        started = time.perf_counter()
        with open(out, "w", encoding="utf-8") as sink:  # noqa: ASYNC230  # the measured work
            with use_scope(path):
                walk = store.export_scope()
            async with contextlib.aclosing(walk):
                async for record in walk:
                    line = json.dumps(record, separators=(",", ":")) + "\n"
                    sink.write(line)
                    written += len(line)
                    records += 1
                    messages += record["type"] == "message"
        seconds = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu
        server_after = _process_cpu(backend)
    server = None if server_cpu is None or server_after is None else server_after - server_cpu
    return {
        "server_cpu_seconds": None if server is None else round(server, 2),
        "messages_per_cpu_s": None if server is None else round(messages / (cpu + server)),
        "records": records,
        "client_cpu_seconds": round(cpu, 2),
        "messages_per_client_cpu_s": round(messages / cpu),
        "messages": messages,
        "seconds": round(seconds, 2),
        "messages_per_s": round(messages / seconds),
        "peak_before_mib": round(before, 1),
        "peak_after_mib": round(_peak_mib(), 1),
        "bytes": written,
    }


async def _child(args: list[str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.lifecycle",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the measuring process failed:\n{err.decode()}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


# --- erase, with probes in the neighbour and a lock-wait sampler ------------------------------


@dataclass
class _Probe:
    latencies: list[float]
    failures: list[str]
    appended: int = 0


async def _probe(store: cortex.Store, sid: str, stop: asyncio.Event, probe: _Probe) -> None:
    with use_scope(NEIGHBOUR):
        while not stop.is_set():
            started = time.perf_counter()
            try:
                await store.append_messages(sid, [NewMessage("user", "still here")])
                await store.get_session(sid)
            except cortex.CortexError as exc:  # an invariant: the neighbour never fails
                probe.failures.append(repr(exc))
                return
            probe.latencies.append(time.perf_counter() - started)
            probe.appended += 1


async def _sample_lock_waits(url: str, stop: asyncio.Event, every: float) -> dict[str, Any]:
    """The longest wait on a heavyweight lock any backend was seen in, by who waited."""
    conn = await asyncpg.connect(url)
    seen: dict[tuple[int, Any], tuple[float, float, str]] = {}
    try:
        while not stop.is_set():
            now = time.perf_counter()
            rows = await conn.fetch(
                "SELECT pid, query_start, application_name FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            for row in rows:
                key = (row["pid"], row["query_start"])
                first = seen.get(key, (now, now, row["application_name"]))[0]
                seen[key] = (first, now, row["application_name"])
            await asyncio.sleep(every)
    finally:
        await conn.close()
    waits = [(last - first, who) for first, last, who in seen.values()]
    longest = max(waits, default=(0.0, ""))
    return {
        "waits_seen": len(waits),
        "longest_wait_ms": round(longest[0] * 1000, 1),
        "longest_waiter": longest[1],
        "sample_ms": round(every * 1000, 1),
    }


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latency(values: list[float]) -> dict[str, Any]:
    return {
        "calls": len(values),
        "p50_ms": round(_percentile(values, 0.5) * 1000, 2),
        "p99_ms": round(_percentile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values, default=0.0) * 1000, 2),
    }


def _named(name: str) -> dict[str, Any]:
    return {"server_settings": {"application_name": name}}


async def _probed(
    db: BenchDatabase, probe_ids: list[str], p: Params, seconds: float | None, work: Any
) -> tuple[Any, dict[str, Any]]:
    """Run ``work(store)`` (or, without it, sleep ``seconds``) while the probes run."""
    stop = asyncio.Event()
    probes = [_Probe([], []) for _ in probe_ids]
    async with (
        cortex.connect(db.app_url, pool_size=p.probes, connect_args=_named("probe")) as probing,
        cortex.connect(
            db.app_url, pool_size=1, max_overflow=0, connect_args=_named("erase")
        ) as store,
    ):
        tasks = [
            asyncio.create_task(_probe(probing, sid, stop, probe))
            for sid, probe in zip(probe_ids, probes, strict=True)
        ]
        sampler = asyncio.create_task(_sample_lock_waits(db.owner_url, stop, p.sample_ms / 1000))
        await asyncio.sleep(0.5)  # the probes warm up
        for probe in probes:
            probe.latencies.clear()
        backend = await _backend_pid(store)
        server_cpu = _process_cpu(backend)
        started = time.perf_counter()
        result = None
        if work is None:
            await asyncio.sleep(seconds or 0)
        else:
            result = await work(store)
        elapsed = time.perf_counter() - started
        server_after = _process_cpu(backend)
        stop.set()
        await asyncio.gather(*tasks)
        locks = await sampler
    latencies = [x for probe in probes for x in probe.latencies]
    server = None if server_cpu is None or server_after is None else server_after - server_cpu
    return result, {
        "seconds": round(elapsed, 2),
        "server_cpu_seconds": None if server is None else round(server, 2),
        "probe": _latency(latencies),
        "probe_failures": [f for probe in probes for f in probe.failures],
        "appended": sum(probe.appended for probe in probes),
        "locks": locks,
    }


async def _erase(store: cortex.Store) -> cortex.ErasureReport:
    with use_scope(ROOT):
        return await store.erase_scope()


async def _import(store: cortex.Store, file: Path) -> cortex.ImportReport:
    def records() -> Any:
        with file.open(encoding="utf-8") as source:
            for line in source:
                yield json.loads(line)

    with use_scope(ROOT):
        return await store.import_scope(records())


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    probe_ids, seeded = await _seed(db, p)
    before = await _fingerprint(db)
    print(f"  seeded {before[0]:,} sessions, {before[2]:,} messages in {seeded:.0f} s")
    ok = True
    with tempfile.TemporaryDirectory(prefix="cortex-lifecycle-") as folder:
        file = Path(folder) / "u1.jsonl"
        exported = await _child(["--child-export", db.app_url, ROOT, str(file)])
        exported["target_mib"] = TARGET_MB
        print(
            f"  export: {exported['messages']:,} messages in {exported['seconds']} s"
            f" ({exported['messages_per_s']:,}/s; {exported['client_cpu_seconds']} s of client"
            f" CPU, {exported['server_cpu_seconds']} s of the server's:"
            f" {exported['messages_per_cpu_s']:,}/s of CPU), {exported['bytes'] / MIB:.0f} MiB;"
            f" peak RSS {exported['peak_before_mib']} MiB before, {exported['peak_after_mib']} after"
        )
        _, baseline = await _probed(db, probe_ids, p, 3.0, None)
        report, erased = await _probed(db, probe_ids, p, None, _erase)
        erased["sessions"], erased["messages"] = report.sessions, report.messages
        erased["messages_per_s"] = round(report.messages / erased["seconds"])
        if erased["server_cpu_seconds"]:
            erased["messages_per_server_cpu_s"] = round(
                report.messages / erased["server_cpu_seconds"]
            )
        erased["baseline_probe"] = baseline["probe"]
        erased["baseline_locks"] = baseline["locks"]
        print(
            f"  erase: {report.messages:,} messages, {report.sessions:,} sessions in"
            f" {erased['seconds']} s ({erased['messages_per_s']:,}/s; {erased['server_cpu_seconds']} s"
            f" of server CPU); neighbour probes"
            f" p50/p99/max {erased['probe']['p50_ms']}/{erased['probe']['p99_ms']}/"
            f"{erased['probe']['max_ms']} ms (before: {baseline['probe']['p50_ms']}/"
            f"{baseline['probe']['p99_ms']}/{baseline['probe']['max_ms']} ms); longest lock"
            f" wait seen {erased['locks']['longest_wait_ms']} ms"
            f" ({erased['locks']['longest_waiter'] or 'none'},"
            f" {erased['locks']['waits_seen']} waits)"
        )
        ok = ok and not erased["probe_failures"] and not baseline["probe_failures"]
        ok = ok and report.messages == before[2] and report.sessions == before[0]
        async with cortex.connect(db.app_url, pool_size=1) as store:
            started = time.perf_counter()
            restored = await _import(store, file)
            seconds = time.perf_counter() - started
    imported = {
        "messages": restored.messages,
        "sessions": restored.sessions,
        "seconds": round(seconds, 2),
        "messages_per_s": round(restored.messages / seconds),
    }
    after = await _fingerprint(db)
    imported["identical"] = after == before
    ok = ok and after == before
    print(
        f"  import: {restored.messages:,} messages in {imported['seconds']} s"
        f" ({imported['messages_per_s']:,}/s); rows identical to before: {after == before}"
    )
    results = [
        {"step": "export", **exported},
        {"step": "erase", **erased, "target_per_s": TARGET_RATE, "target_wait_ms": TARGET_WAIT_MS},
        {"step": "import", **imported},
    ]
    return results, ok


def main(argv: list[str] | None = None) -> int:
    """The measuring child (the parent is ``python -m benchmarks lifecycle``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lifecycle")
    parser.add_argument("--child-export", nargs=3, metavar=("URL", "SCOPE", "FILE"))
    args = parser.parse_args(argv)
    if not args.child_export:
        parser.error("run it as `python -m benchmarks lifecycle`")
    url, scope, out = args.child_export
    print(json.dumps(asyncio.run(_export(url, scope, out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
