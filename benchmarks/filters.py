"""Scenario ``filters``: listing pages filtered by metadata and by time, at scale.

Seeds N sessions (default 1,000,000; ``benchmarks.seed`` with
``metadata=True``) across 100 tenants (org0 holds 20 %), each with about 110
bytes of metadata of which ``{"channel": "web"}`` matches ~1 % of every
tenant, ``updated_at`` over 90 days and ``created_at`` 0-7 days before it.
Then measures p50/p95 of pages of 50 (and a count) through
``list_sessions``/``count_sessions`` and through raw asyncpg running the same
SQL, both as the application role under row-level security, beside the
unfiltered page. Not part of ``all``: it seeds its own data set, or measures
again the one an earlier run kept (``--keep``, then ``--database NAME``).
The floor runs the listing statement alone: for a metadata filter that is
the walk that checks each row, without the candidates the store looks up
first (revision 20261205000026), so the two sides compare the two plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

import cortex
from benchmarks._common import BenchDatabase, Result
from benchmarks.listing import Query, measure, tenant_size
from benchmarks.seed import ANCHOR, seed
from cortex import ListFilter, use_scope

WEB = {"channel": "web"}


@dataclass(frozen=True)
class Params:
    sessions: int = 1_000_000
    repeats: int = 200  # timed calls per side per query
    blocks: int = 4
    # Timed calls per side of a count of the filtered tenant, which reads every
    # session of it (0: no count).
    count_repeats: int = 20


def queries(p: Params) -> list[Query]:
    week_ago = ANCHOR - timedelta(days=7)
    month_ago = ANCHOR - timedelta(days=30)
    two_keys = {"channel": "web", "customer": {"region": "eu-west", "tier": "gold"}}
    out = [
        Query("page: tenant org0, no filter", "org0", ListFilter()),
        Query("page: tenant org0, metadata 1 %", "org0", ListFilter(metadata=WEB)),
        Query(
            "page: tenant org0, metadata 1 % + agent",
            "org0",
            ListFilter(metadata=WEB, agent_id="agent-1"),
        ),
        Query("page: project org0/proj1, metadata 1 %", "org0/proj1", ListFilter(metadata=WEB)),
        Query(
            "page: user org0/proj1/user7, metadata 1 %",
            "org0/proj1/user7",
            ListFilter(metadata=WEB),
        ),
        Query("page: tenant org0, 2 keys 0.1 %", "org0", ListFilter(metadata=two_keys)),
        Query(
            "page: tenant org0, metadata ~25 %", "org0", ListFilter(metadata={"channel": "email"})
        ),
        Query("page: tenant org0, updated last 7 days", "org0", ListFilter(updated_after=week_ago)),
        Query(
            "page: tenant org0, updated 30-23 days ago",
            "org0",
            ListFilter(updated_after=month_ago, updated_before=month_ago + timedelta(days=7)),
        ),
        Query(
            "page: tenant org0, created 30-23 days ago",
            "org0",
            ListFilter(created_after=month_ago, created_before=month_ago + timedelta(days=7)),
        ),
        Query(
            "page: tenant org0, metadata 1 % + updated 30 d",
            "org0",
            ListFilter(metadata=WEB, updated_after=month_ago),
        ),
        Query("page: tenant org5, metadata 1 %", "org5", ListFilter(metadata=WEB)),
    ]
    if p.count_repeats:
        out.append(
            Query(
                "count: tenant org0, metadata 1 %",
                "org0",
                ListFilter(metadata=WEB),
                count=True,
                repeats=p.count_repeats,
            )
        )
    return out


async def run(db: BenchDatabase, p: Params) -> tuple[list[Result], bool]:
    started = time.perf_counter()
    if await tenant_size(db.owner_url, "org0"):
        print("  measuring the kept database's sessions again (not seeded)")
    else:
        await seed(db.owner_url, sessions=p.sessions, metadata=True)
        print(f"  seeded {p.sessions:,} sessions in {time.perf_counter() - started:.0f} s")
    org0 = await tenant_size(db.owner_url, "org0")
    print(f"  org0 holds {org0:,} sessions")
    results = await measure(db, queries(p), repeats=p.repeats, blocks=p.blocks)
    return results, await _found_what_the_seed_made(db)


async def _found_what_the_seed_made(db: BenchDatabase) -> bool:
    """The invariant: the filtered listing and count agree with the seeded rows, read as the owner."""
    conn = await asyncpg.connect(db.owner_url)
    try:
        seeded = int(
            await conn.fetchval(
                "SELECT count(*) FROM sessions"
                " WHERE tenant_id = 'org0' AND metadata_json ->> 'channel' = 'web'"
            )
        )
    finally:
        await conn.close()
    async with cortex.connect(db.app_url, pool_size=1, max_overflow=0) as store:
        with use_scope("org0"):
            page = await store.list_sessions(ListFilter(metadata=WEB, limit=1000))
            counted = await store.count_sessions(ListFilter(metadata=WEB))
    ok = (
        seeded > 0
        and counted == seeded
        and len(page) == min(1000, seeded)
        and all(s.metadata.get("channel") == "web" for s in page)
    )
    print(f"  org0: {seeded:,} sessions seeded with channel web, {counted:,} counted: ok={ok}")
    return ok
