"""Scenario ``memory``: the client's peak memory while walking a million sessions and a long chat.

``python -m benchmarks memory [--dsn URL] [--n SESSIONS] [--quick] [--json FILE]``

Seeds ``sessions`` sessions (default 1,000,000, ``--quick`` 100,000) in one
tenant (:func:`benchmarks.seed.seed`, set-based, about 3 minutes for a
million) and one session of ``messages`` messages (default 100,000, a tenth
of the sessions) of 200 bytes each, written set-based as the database owner
with ``message_count`` and a gap-free ``seq`` 1..n. Then, each in a child
process of its own (so that its peak resident set size, ``ru_maxrss``,
belongs to that walk alone, the pattern of :mod:`benchmarks.big_append`),
as the application role under row-level security:

* ``Store.iter_sessions`` walks every session of the tenant (keyset pages
  of ``page_size``, one snapshot);
* ``Store.list_messages`` pages through the long session (``after_seq``,
  ``page_size`` messages a page).

Printed for each: the peak before the walk (interpreter, cortex, the
connection and one warm-up page), the peak after it, rows walked, seconds,
and the current RSS sampled along the way, so "flat" can be seen, not just
asserted. The target is a peak under 150 MB. The run fails only if a walk
misses or repeats rows.
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
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

import cortex
from benchmarks._common import BenchDatabase
from benchmarks.seed import seed
from cortex import ListFilter, use_scope
from cortex.ids import parse_id

TENANT: Final = "mem"
LONG_SCOPE: Final = "memchat/team/user"
TARGET_MB: Final = 150
SAMPLES: Final = 10  # RSS samples along each walk
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class Params:
    sessions: int = 1_000_000
    messages: int = 100_000
    page_size: int = 1000  # the largest page either call allows
    progress: bool = True


def _peak_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    """The current resident set size (Linux /proc; else the peak)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return _peak_mib()
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


def _every(total: int) -> int:
    return max(1, total // SAMPLES)


async def _walk_sessions(url: str, expected: int, page_size: int) -> dict[str, Any]:
    async with cortex.connect(url, pool_size=1) as store:
        flt = ListFilter(limit=page_size)
        with use_scope(TENANT):
            await store.list_sessions(flt)  # warm-up: the connection and the statement
            gc.collect()
            before, rss_start = _peak_mib(), _rss_mib()
            samples: list[tuple[int, float]] = []
            seen, out_of_order = 0, 0
            # List order is (updated_at, id) strictly descending: checking it
            # proves every row distinct without keeping the rows.
            last: tuple[Any, uuid.UUID] | None = None
            started = time.perf_counter()
            async with contextlib.aclosing(store.iter_sessions(flt)) as walk:
                async for session in walk:
                    seen += 1
                    key = (session.updated_at, parse_id("ses", session.id))
                    out_of_order += last is not None and not key < last
                    last = key
                    if seen % _every(expected) == 0:
                        samples.append((seen, round(_rss_mib(), 1)))
            seconds = time.perf_counter() - started
            after = _peak_mib()
    return _report(
        "iter_sessions",
        seen,
        seen - out_of_order,
        expected,
        page_size,
        seconds,
        (before, after, rss_start),
        samples,
    )


async def _page_messages(
    url: str, session_id: str, expected: int, page_size: int
) -> dict[str, Any]:
    async with cortex.connect(url, pool_size=1) as store:
        with use_scope(LONG_SCOPE):
            await store.list_messages(session_id, limit=page_size)  # warm-up
            gc.collect()
            before, rss_start = _peak_mib(), _rss_mib()
            samples: list[tuple[int, float]] = []
            seen, after_seq, gaps = 0, 0, 0
            started = time.perf_counter()
            while True:
                page = await store.list_messages(session_id, after_seq=after_seq, limit=page_size)
                if not page:
                    break
                for message in page:
                    gaps += message.seq != after_seq + 1
                    after_seq = message.seq
                    seen += 1
                    if seen % _every(expected) == 0:
                        samples.append((seen, round(_rss_mib(), 1)))
            seconds = time.perf_counter() - started
            after = _peak_mib()
    return _report(
        "list_messages",
        seen,
        seen - gaps,
        expected,
        page_size,
        seconds,
        (before, after, rss_start),
        samples,
    )


def _report(
    walk: str,
    seen: int,
    distinct: int,
    expected: int,
    page_size: int,
    seconds: float,
    memory: tuple[float, float, float],
    samples: list[tuple[int, float]],
) -> dict[str, Any]:
    """One walk's figures: rows, time, and peak RSS before and after (MiB)."""
    before, after, rss_start = memory
    return {
        "walk": walk,
        "rows": seen,
        "distinct": distinct,
        "expected": expected,
        "page_size": page_size,
        "seconds": round(seconds, 1),
        "rows_per_s": round(seen / seconds) if seconds else None,
        "peak_before_mib": round(before, 1),
        "peak_after_mib": round(after, 1),
        "rss_start_mib": round(rss_start, 1),
        "rss_samples_mib": samples,
    }


async def _long_session(db: BenchDatabase, messages: int) -> str:
    """A session of ``messages`` 200-byte messages: created by cortex, filled set-based."""
    async with cortex.connect(db.app_url, pool_size=1) as store:
        with use_scope(LONG_SCOPE):
            session = await store.create_session("bench", title="a long chat")
    sid = parse_id("ses", session.id)
    conn = await asyncpg.connect(db.owner_url)  # a superuser: exempt from row-level security
    try:
        async with conn.transaction():
            await conn.execute(
                """
                INSERT INTO messages (tenant_id, id, session_id, seq, role, content,
                                      metadata_json, created_at)
                SELECT $1, gen_random_uuid(), $2, g,
                       CASE WHEN g % 2 = 1 THEN 'user' ELSE 'assistant' END,
                       left(md5(g::text) || repeat(' the quick brown fox', 10), 200),
                       '{}', now() - ($3 - g) * interval '1 millisecond'
                FROM generate_series(1, $3::int) AS g
                """,
                LONG_SCOPE.split("/", 1)[0],
                sid,
                messages,
            )
            await conn.execute(
                "UPDATE sessions SET message_count = $2::int, updated_at = now(),"
                " last_message = left(md5($2::int::text) || repeat(' the quick brown fox', 10), 200)"
                " WHERE id = $1",
                sid,
                messages,
            )
        await conn.execute("VACUUM ANALYZE messages")
        check = await conn.fetchrow(
            "SELECT s.message_count, count(m.seq), max(m.seq) FROM sessions s"
            " JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id"
            " WHERE s.id = $1 GROUP BY s.message_count",
            sid,
        )
    finally:
        await conn.close()
    count, rows, top = check if check is not None else (0, 0, 0)
    if not count == rows == top == messages:
        raise RuntimeError(f"long session: count {count}, rows {rows}, max seq {top}")
    return session.id


async def _child(args: list[str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.memory",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the measuring process failed:\n{err.decode()}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    started = time.perf_counter()
    await seed(
        db.owner_url,
        sessions=p.sessions,
        messages_per_session=0,
        tenant=TENANT,
        progress=p.progress,
    )
    seeded = time.perf_counter() - started
    started = time.perf_counter()
    long_id = await _long_session(db, p.messages)
    filled = time.perf_counter() - started
    print(
        f"  seeded {p.sessions:,} sessions in {seeded:.0f} s;"
        f" {p.messages:,} messages in one session in {filled:.0f} s"
    )
    results = [
        await _child(["--child-walk", db.app_url, str(p.sessions), str(p.page_size)]),
        await _child(["--child-page", db.app_url, long_id, str(p.messages), str(p.page_size)]),
    ]
    results[0]["seed_seconds"] = round(seeded, 1)
    results[1]["fill_seconds"] = round(filled, 1)
    ok = True
    for r in results:
        r["target_mib"] = TARGET_MB
        r["under_target"] = r["peak_after_mib"] < TARGET_MB
        r["growth_mib"] = round(r["peak_after_mib"] - r["peak_before_mib"], 1)
        complete = r["rows"] == r["distinct"] == r["expected"]
        ok = ok and complete
        print(
            f"  {r['walk']:<14} {r['rows']:>9,} rows in {r['seconds']} s (pages of {r['page_size']}):"
            f" peak RSS {r['peak_before_mib']} MiB before, {r['peak_after_mib']} MiB after"
            f" (+{r['growth_mib']}); RSS along the walk: "
            + ", ".join(f"{mib:.0f}" for _, mib in r["rss_samples_mib"])
        )
        if not complete:
            print(
                f"!!! INVARIANT BROKEN: {r['walk']} yielded {r['rows']} rows,"
                f" {r['distinct']} distinct, of {r['expected']}"
            )
    return results, ok


def main(argv: list[str] | None = None) -> int:
    """The measuring child (the parent is ``python -m benchmarks memory``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    parser.add_argument("--child-walk", nargs=3, metavar=("URL", "EXPECTED", "PAGE"))
    parser.add_argument("--child-page", nargs=4, metavar=("URL", "SESSION", "EXPECTED", "PAGE"))
    args = parser.parse_args(argv)
    if args.child_walk:
        url, expected, page = args.child_walk
        result = asyncio.run(_walk_sessions(url, int(expected), int(page)))
    elif args.child_page:
        url, session_id, expected, page = args.child_page
        result = asyncio.run(_page_messages(url, session_id, int(expected), int(page)))
    else:
        parser.error("run it as `python -m benchmarks memory`")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
