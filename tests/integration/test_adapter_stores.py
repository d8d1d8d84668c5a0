"""The store an adapter builds on a URL: opened as ``connect()`` opens one, shared, released.

Adapters on one URL with equal pool options share one store (one engine,
one pool) per event loop, never across loops; ``close()`` releases an
adapter's share and the last one disposes the engine. Real PostgreSQL, as
the application role; connections are counted in ``pg_stat_activity`` by a
unique ``application_name``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import asyncpg
import pytest

import cortex
from tests.conftest import CITUS_URL, Database, with_query

pytest.importorskip("agents")
pytest.importorskip("google.adk")

from agents import TResponseInputItem
from google.adk.events.event import Event

from cortex.integrations.adk import CortexSessionService
from cortex.integrations.openai_agents import CortexSession

pytestmark = pytest.mark.citus


def item(content: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": content})


def named(database: Database) -> tuple[str, str]:
    """The app URL under an application name no other test uses, and that name."""
    name = f"adapters-{uuid.uuid4().hex[:10]}"
    return with_query(database.app_url, f"application_name={name}"), name


async def connections(owner_conn: asyncpg.Connection, name: str, *, expect: int) -> int:
    """Connections open under ``name``, once they reach ``expect`` (closing ones take a moment)."""
    count = -1
    for _ in range(100):
        count = await owner_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
        if count == expect:
            break
        await asyncio.sleep(0.05)
    return int(count)


async def test_adapters_on_one_url_share_one_store(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    url, name = named(database)
    sessions = [
        CortexSession(f"s{i}", url, scope=tenant, pool_size=1, max_overflow=0) for i in range(20)
    ]
    service = CortexSessionService(url, scope=tenant, pool_size=1, max_overflow=0)
    await asyncio.gather(*(s.add_items([item(f"m{i}")]) for i, s in enumerate(sessions)))
    await service.create_session(app_name="app", user_id="u", session_id="s")
    store = sessions[0].store
    assert {id(s.store) for s in sessions} == {id(store)}
    assert service.store is store
    assert store.routines > 0  # the migrated database's routines: one round trip per call
    assert store.distributed == (CITUS_URL is not None)
    assert not store.bypasses_row_level_security
    assert await connections(owner_conn, name, expect=1) == 1
    other = CortexSession("s0", url, scope=tenant)  # other pool options: a store of its own
    assert [m["content"] for m in cast(list[dict[str, Any]], await other.get_items())] == ["m0"]
    assert other.store is not store
    await other.close()
    for s in sessions:
        await s.close()
    assert await sessions[0].get_items() == [item("m0")]  # a closed adapter opens again
    await sessions[0].close()
    assert await connections(owner_conn, name, expect=1) == 1  # the service holds it still
    await service.close()
    assert await connections(owner_conn, name, expect=0) == 0


async def test_the_store_is_there_once_opened(database: Database, tenant: str) -> None:
    session = CortexSession("s", database.app_url, scope=tenant)
    with pytest.raises(cortex.InvalidInput, match="open"):
        session.store  # noqa: B018  (nothing is opened in the constructor)
    store = await session.open()
    assert session.store is store
    await session.close()
    async with CortexSessionService(database.app_url, scope=tenant) as service:
        assert service.store.routines > 0  # entering opens it
    with pytest.raises(cortex.InvalidInput, match="database URL"):
        CortexSessionService("mysql://x@y/z")  # a bad URL is refused at construction


async def test_a_superuser_url_warns_as_connect_does(
    database: Database, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cortex"):
        async with CortexSessionService(database.owner_url, scope=tenant) as service:
            session = await service.create_session(app_name="app", user_id="u")
            await service.append_event(session, Event(author="user"))
    assert any("row-level security does not apply" in r.getMessage() for r in caplog.records)


def test_one_adapter_on_two_event_loops(database: Database, tenant: str) -> None:
    url, _ = named(database)
    shared = CortexSession("loops", url, scope=tenant, pool_size=1)  # built outside any loop
    barrier = threading.Barrier(2)
    stores: list[object] = []  # the stores themselves: a freed one's id may be reused
    errors: list[BaseException] = []

    def worker(text: str) -> None:
        async def run() -> None:
            try:
                barrier.wait()
                await asyncio.wait_for(shared.add_items([item(text)]), timeout=30)
                stores.append(shared.store)
            finally:
                await shared.close()  # this loop's share

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(stores) == 2
    assert stores[0] is not stores[1]  # a store per loop, never one across them

    async def read() -> list[TResponseInputItem]:
        try:
            return await shared.get_items()
        finally:
            await shared.close()

    assert sorted(str(i) for i in asyncio.run(read())) == sorted(
        str(item(t)) for t in ("one", "two")
    )


async def test_a_failed_or_cancelled_open_is_tried_again(
    database: Database, blank_db: str, tenant: str
) -> None:
    unmigrated = CortexSession("s", blank_db, scope=tenant)
    for _ in range(2):  # not remembered: each call tries again
        with pytest.raises(cortex.SchemaMismatch):
            await unmigrated.get_items()
    await unmigrated.close()
    url, _ = named(database)
    session = CortexSession("s", url, scope=tenant)
    first = asyncio.create_task(session.add_items([item("cancelled")]))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await session.add_items([item("kept")])
    assert [cast(dict[str, Any], i)["content"] for i in await session.get_items()][-1] == "kept"
    await session.close()


async def test_bad_input_is_refused_before_the_store_opens(tenant: str) -> None:
    nowhere = "postgresql://nobody@127.0.0.1:1/nothing"  # nothing listens: opening would fail
    service = CortexSessionService(nowhere, scope=tenant)
    session = CortexSession("s", nowhere, scope=tenant)
    bad: Any = 5
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: service.create_session(app_name=bad, user_id="u"),
        lambda: service.create_session(app_name="app", user_id="u", state=bad),
        lambda: service.get_session(app_name="app", user_id=bad, session_id="s"),
        lambda: service.get_session(app_name="app", user_id="u", session_id="s", config=bad),
        lambda: service.list_sessions(app_name=bad),
        lambda: service.delete_session(app_name="app", user_id="u", session_id=bad),
        lambda: service.get_user_state(app_name="app", user_id=bad),
        lambda: service.append_event(bad, Event(author="user")),
        lambda: session.add_items([bad]),
        lambda: session.get_items(limit=cast(Any, "3")),
    ]
    for call in calls:
        with pytest.raises(cortex.InvalidInput):
            await call()
    with pytest.raises(cortex.DatabaseUnavailable):
        await session.get_items()
    await service.close()
    await session.close()
