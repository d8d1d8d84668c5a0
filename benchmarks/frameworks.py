"""Scenario ``frameworks``: the adapters beside the frameworks' own PostgreSQL stores.

Same server, same database, same driver (asyncpg), the same operations, in
interleaved blocks: Google ADK's ``DatabaseSessionService`` beside
``cortex.integrations.adk.CortexSessionService``, and the Agents SDK's
``SQLAlchemySession`` beside ``cortex.integrations.openai_agents.CortexSession``.
Here "floor" is the framework's own store, so the ratio is cortex's
throughput over the peer's (above 1: cortex is faster).

The peers create their own tables (ADK's are named ``sessions`` and
``events`` too), so they live in schema ``peers`` of the same database and
connect as its owner (a superuser: no row-level security to pay for);
cortex connects as the application role, with row-level security on.
Needs the ``peers`` extra.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import asyncpg
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.sessions.database_session_service import DatabaseSessionService
from google.adk.sessions.session import Session as AdkSession
from google.genai import types
from sqlalchemy.ext.asyncio import create_async_engine

import cortex
from benchmarks._common import (
    BenchDatabase,
    Result,
    Side,
    alternate,
    print_result,
    throughput_ratio,
    timed_workers,
)
from benchmarks.append import check_invariants
from cortex._db.engine import normalise_url
from cortex.integrations.adk import CortexSessionService
from cortex.integrations.openai_agents import CortexSession

TENANT = "bench"
APP = "bench-app"


@dataclass(frozen=True)
class Params:
    n: int = 2000
    concurrency: int = 8
    sessions_per_user: int = 50
    events_per_session: int = 5
    blocks: int = 4


def asyncpg_url(url: str) -> str:
    return normalise_url(url).render_as_string(hide_password=False)


# The peers' tables live in their own schema of the benchmark database.
PEER_CONNECT: Final = {"server_settings": {"search_path": "peers"}}


async def peer_schema(owner_url: str) -> None:
    conn = await asyncpg.connect(owner_url)
    try:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS peers")
    finally:
        await conn.close()


def adk_event(i: int, text: str | None = None) -> Event:
    """An ADK event carrying ``text`` (default: a short sentence naming ``i``)."""
    text = text or f"event {i}: the quick brown fox jumps over the lazy dog"
    return Event(
        author="user" if i % 2 else "agent",
        invocation_id=f"inv-{i}",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
    )


async def _seed_user(service: BaseSessionService, user: str, p: Params) -> None:
    for s in range(p.sessions_per_user):
        session = await service.create_session(app_name=APP, user_id=user, session_id=f"s{s}")
        for e in range(p.events_per_session):
            await service.append_event(session, adk_event(e))


_ADK_FLOOR = "floor = ADK DatabaseSessionService"
_AGENTS_FLOOR = "floor = Agents SDK SQLAlchemySession"


async def _measure(
    label: str, op_for: Any, *, p: Params, per_worker: int, results: list[Result], floor: str
) -> None:
    """One operation, cortex's adapter beside the framework's own store, in alternating blocks."""
    cortex_side, peer_side = Side(), Side()

    async def cortex_block() -> None:
        await timed_workers(cortex_side, p.concurrency, per_worker, op_for("cortex"))

    async def peer_block() -> None:
        await timed_workers(peer_side, p.concurrency, per_worker, op_for("peer"))

    await alternate(p.blocks // 2 or 1, cortex_block, peer_block)
    result = Result(
        label,
        cortex_side.summary(),
        peer_side.summary(),
        throughput_ratio(cortex_side, peer_side),
        floor,
    )
    print_result(result)
    results.append(result)


async def _adk(db: BenchDatabase, p: Params, results: list[Result]) -> None:
    store_cm = cortex.connect(db.app_url, pool_size=p.concurrency, max_overflow=0)
    store = await store_cm.__aenter__()
    ours = CortexSessionService(store, scope=TENANT)
    await peer_schema(db.owner_url)
    theirs = DatabaseSessionService(
        asyncpg_url(db.owner_url),
        pool_size=p.concurrency,
        max_overflow=0,
        connect_args=PEER_CONNECT,
    )
    try:
        per_worker = max(1, p.n // p.concurrency // (p.blocks // 2 or 1))
        sides = {"cortex": ours, "peer": theirs}
        # One session per worker and side for appends (no stale-writer clashes).
        sessions: dict[str, list[AdkSession]] = {}
        for name, service in sides.items():
            sessions[name] = [
                await service.create_session(app_name=APP, user_id=f"w{w}")
                for w in range(p.concurrency)
            ]
            await _seed_user(service, "lister", p)
        counter = itertools.count()

        def append_op(name: str) -> Any:
            async def op(w: int, i: int) -> int:
                await sides[name].append_event(sessions[name][w], adk_event(next(counter)))
                return 1

            return op

        def list_op(name: str) -> Any:
            async def op(w: int, i: int) -> int:
                listed = await sides[name].list_sessions(app_name=APP, user_id="lister")
                return len(listed.sessions)

            return op

        def get_op(name: str) -> Any:
            async def op(w: int, i: int) -> int:
                got = await sides[name].get_session(
                    app_name=APP, user_id="lister", session_id=f"s{i % p.sessions_per_user}"
                )
                return 0 if got is None else len(got.events)

            return op

        measure = partial(_measure, p=p, per_worker=per_worker, results=results, floor=_ADK_FLOOR)
        await measure("adk append_event", append_op)
        await measure(f"adk list_sessions ({p.sessions_per_user} of a user)", list_op)
        await measure(f"adk get_session ({p.events_per_session} events)", get_op)
    finally:
        await theirs.close()
        await store_cm.__aexit__(None, None, None)


async def _agents(db: BenchDatabase, p: Params, results: list[Result]) -> None:
    store_cm = cortex.connect(db.app_url, pool_size=p.concurrency, max_overflow=0)
    store = await store_cm.__aenter__()
    await peer_schema(db.owner_url)
    engine = create_async_engine(
        asyncpg_url(db.owner_url), pool_size=p.concurrency, connect_args=PEER_CONNECT
    )
    try:
        await SQLAlchemySession("setup", engine=engine, create_tables=True).get_items()
        per_worker = max(1, p.n // p.concurrency // (p.blocks // 2 or 1))
        ours = [CortexSession(f"w{w}", store, scope=TENANT) for w in range(p.concurrency)]
        theirs = [SQLAlchemySession(f"w{w}", engine=engine) for w in range(p.concurrency)]
        everyone: list[Any] = [*ours, *theirs]
        item: Any = {"role": "user", "content": "the quick brown fox jumps over the lazy dog"}
        for session in everyone:
            await session.add_items([item] * 20)
        sides: dict[str, list[Any]] = {"cortex": ours, "peer": theirs}

        def add_op(name: str) -> Any:
            async def op(w: int, i: int) -> int:
                await sides[name][w].add_items([item])
                return 1

            return op

        def get_op(name: str) -> Any:
            async def op(w: int, i: int) -> int:
                return len(await sides[name][w].get_items(limit=20))

            return op

        measure = partial(
            _measure, p=p, per_worker=per_worker, results=results, floor=_AGENTS_FLOOR
        )
        await measure("agents add_items (1 item)", add_op)
        await measure("agents get_items (newest 20)", get_op)
    finally:
        await engine.dispose()
        await store_cm.__aexit__(None, None, None)


async def run(db: BenchDatabase, p: Params) -> tuple[list[Result], bool]:
    results: list[Result] = []
    await _adk(db, p, results)
    await _agents(db, p, results)
    # Counters equal rows and seq is gap-free in every cortex session.
    return results, not await check_invariants(db.owner_url)
