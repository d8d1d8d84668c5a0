"""The chain on a legacy database with the old release writing throughout, and killed mid-way.

The migration benchmark at a small size: a legacy database, each revision as
its own ``cortex db upgrade REV`` process, and a probe playing the old release
(a legacy insert and read every 0.1 s with ``lock_timeout = 1s``). No probe
statement may fail: none hit its 1 s lock timeout (no lock window above 1 s),
and none was refused (the old release keeps working at every revision). No
time is asserted.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time

import asyncpg
import pytest

from benchmarks import migration
from benchmarks._common import bench_database
from cortex._db.engine import driver_dsn
from cortex.migrate import upgrade
from tests.migrations.legacy import LEGACY_INSERT, current

pytestmark = pytest.mark.slow


def test_chain_keeps_the_old_release_serving_without_long_locks(server_url: str) -> None:
    async def run() -> tuple[dict[str, object], bool]:
        params = migration.Params(messages=200_000, interval=0.1, batch_rows=20_000)
        async with bench_database(server_url, revision=migration.LEGACY) as db:
            return await migration.run(db, params)

    report, ok = asyncio.run(run())
    steps = report["steps"]
    assert isinstance(steps, list)
    assert [s["revision"] for s in steps] == migration.chain()[1:]
    for step in steps:
        assert step["errors"] == [], step
        assert step["probe_failures"] == 0, step
    assert sum(s["probe_calls"] for s in steps) > 20  # the probe really ran throughout
    assert report["broken_invariants"] == []
    assert ok


def _start_upgrade(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cortex.cli",
            "--database-url",
            url,
            "db",
            "upgrade",
            "--backfill-batch",
            "700",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _progress(url: str) -> tuple[bool, int]:
    """Whether messages has tenant_id yet, and how many sessions exist (-1: no table yet)."""
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        expanded = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'messages'::regclass "
            "AND attname = 'tenant_id')"
        )
        if await conn.fetchval("SELECT to_regclass('sessions')") is None:
            return bool(expanded), -1
        return bool(expanded), int(await conn.fetchval("SELECT count(*) FROM sessions"))
    finally:
        await conn.close()


def _wait_until(url: str, proc: subprocess.Popen[bytes], point: tuple[bool, int]) -> None:
    """Poll until the upgrade has got as far as ``point``, or has finished."""
    while proc.poll() is None:
        expanded, sessions = asyncio.run(_progress(url))
        if expanded >= point[0] and sessions >= point[1]:
            return
        time.sleep(0.05)


def _sigkill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


async def _write_legacy(url: str, n: int, rng: random.Random) -> None:
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        keys = await conn.fetch("SELECT DISTINCT agent_id, scope FROM messages LIMIT 50")
        for _ in range(n):
            agent, scope = rng.choice(keys)
            await conn.execute(
                LEGACY_INSERT.replace("$5", "now()"), agent, scope, "user", "between kills"
            )
    finally:
        await conn.close()


def test_upgrade_killed_at_any_point_resumes_with_exact_counts(server_url: str) -> None:
    rng = random.Random(15)
    kill_points = [
        (True, 0),  # in 20260824000002: the tenant_id fill or its DDL steps
        (True, 200),  # mid-backfill, early
        (True, 1200),  # mid-backfill, late
    ]

    kills = 0

    async def run() -> list[str]:
        nonlocal kills
        params = migration.Params(messages=30_000)
        async with bench_database(server_url, revision=migration.LEGACY) as db:
            url = db.owner_url
            await migration.build_legacy(url, params)
            for point in kill_points:
                proc = _start_upgrade(url)
                await asyncio.to_thread(_wait_until, url, proc, point)
                if proc.poll() is None:
                    _sigkill(proc)
                    kills += 1
                await _write_legacy(url, 20, rng)  # the old release writes on between attempts
            await asyncio.to_thread(upgrade, url)
            assert await asyncio.to_thread(current, url) == migration.chain()[-1:]
            await _write_legacy(url, 20, rng)
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "cortex.cli", "--database-url", url, "db", "backfill"],
                check=True,
                capture_output=True,
            )
            return await migration.check_invariants(url)

    assert asyncio.run(run()) == []
    assert kills >= 2  # the upgrade really died mid-way (not just finished first)
