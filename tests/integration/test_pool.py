"""The pool's fast path: an idle connection taken and given back without a greenlet hop.

SQLAlchemy's asyncio pool runs every checkout and return in a greenlet, so
that it may await the network; taking an idle connection and putting a clean
one back never does (cortex._db.pool._take_idle, _resets_quietly). These tests
hold both halves: the fast path is the one taken, and whatever still needs
I/O (a dropped connection's slot, a connection left in a transaction)
takes the greenlet path and works as before.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings

import asyncpg
import pytest
import sqlalchemy as sa

import cortex
from cortex import NewMessage, use_scope
from tests.conftest import Database, store_url

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20]


async def test_a_call_on_an_idle_connection_takes_no_greenlet_hop(
    database: Database, tenant: str, hops: list[str]
) -> None:
    async with cortex.connect(store_url(database), pool_size=2, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")  # opens the connection: greenlet path
            del hops[:]
            for _ in range(3):
                await store.append_message(s.id, NewMessage("user", "hi"))
                assert (await store.get_session(s.id)).id == s.id
                assert len(await store.list_sessions()) == 1
            assert hops == []
        # Every connection went back into the pool.
        assert store._engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_dropped_connection_is_opened_again_through_the_greenlet_path(
    database: Database, owner_conn: asyncpg.Connection, tenant: str, hops: list[str]
) -> None:
    async with cortex.connect(store_url(database), pool_size=1, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        pool = store._engine.sync_engine.pool
        # The server ends the pooled connection while it sits idle.
        ended = await owner_conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE usename = $1 AND pid <> pg_backend_pid()",
            database.app_role,
        )
        assert ended == 1
        await asyncio.sleep(0.2)  # asyncpg sees the socket close
        del hops[:]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no coroutine left un-awaited by the fast path
            with use_scope(tenant):
                assert (await store.get_session(s.id)).id == s.id
                # The dropped slot was dropped through the pool and opened again in a greenlet.
                assert hops == ["invalidate", "close", "connect"]
                del hops[:]
                assert (await store.get_session(s.id)).id == s.id
                assert hops == []  # and the next call is back on the fast path
            gc.collect()
        assert pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_checkout_waiting_on_the_pool_gets_the_connection_a_call_returns(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    # The only connection is busy in a blocked call when another user of the
    # engine starts waiting for it: when the call ends, the waiter gets it
    # rather than the pool holding it idle until the waiter times out.
    async with cortex.connect(
        store_url(database), pool_size=1, max_overflow=0, pool_timeout=5
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        await owner_conn.execute("BEGIN")
        # By tenant, so Citus routes the lock to one shard.
        await owner_conn.execute("SELECT 1 FROM sessions WHERE tenant_id = $1 FOR UPDATE", tenant)
        try:
            with use_scope(tenant):
                blocked = asyncio.ensure_future(
                    store.append_message(s.id, NewMessage("user", "blocked"))
                )
                await asyncio.sleep(0.3)

            async def health_check() -> int:
                async with store.engine.connect() as conn:
                    return int(await conn.scalar(sa.text("SELECT 1")))

            waiter = asyncio.ensure_future(health_check())
            await asyncio.sleep(0.3)
            assert not waiter.done()
        finally:
            await owner_conn.execute("ROLLBACK")
        await blocked
        assert await asyncio.wait_for(waiter, 3) == 1
        assert store.engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_another_user_of_the_engine_gets_a_held_connection_at_once(
    database: Database, tenant: str
) -> None:
    async with cortex.connect(
        store_url(database), pool_size=1, max_overflow=0, pool_timeout=2
    ) as store:
        with use_scope(tenant):
            await store.create_session("bot")  # the pool's one connection, now held
        pool = store.engine.sync_engine.pool
        assert (pool.checkedin(), pool.checkedout()) == (1, 0)  # type: ignore[attr-defined]
        async with store.engine.connect() as conn:
            assert await conn.scalar(sa.text("SELECT 1")) == 1
        with use_scope(tenant):
            assert len(await store.list_sessions()) == 1


async def test_closing_the_store_closes_the_connections_it_held(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    async with cortex.connect(store_url(database), pool_size=3, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            await asyncio.gather(*(store.get_session(s.id) for _ in range(3)))
        assert store.engine.sync_engine.pool.checkedin() == 3  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no connection left for the garbage collector
        gc.collect()
    for _ in range(50):
        left = await owner_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", database.app_role
        )
        if left == 0:
            break
        await asyncio.sleep(0.05)
    assert left == 0


async def test_the_pool_logs_under_sqlalchemy_not_cortex(
    database: Database, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cortex"):
        async with cortex.connect(store_url(database)) as store:
            with use_scope(tenant):
                await store.create_session("bot")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("cortex")] == []
