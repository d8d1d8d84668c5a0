"""Failures surface as CortexError, write nothing, and leave the pool healthy."""

from __future__ import annotations

import random

import anyio
import asyncpg
import pytest
import sqlalchemy as sa

import cortex
from cortex import (
    DatabaseError,
    DatabaseUnavailable,
    NewMessage,
    OperationTimeout,
    SchemaMismatch,
    Scope,
    use_scope,
)
from cortex._db.executor import Tx
from cortex._db.transaction import MAX_ATTEMPTS, run_transaction
from tests.conftest import Database, admin, on_local_port, with_database
from tests.faults import row_locked, stored_counts, wait_until_no_backends
from tests.figures import record

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]


async def _healthy(store: cortex.Store, tenant: str, session_id: str, times: int = 5) -> None:
    with use_scope(tenant):
        for _ in range(times):
            await store.append_message(session_id, NewMessage("user", "after"))


async def test_unreachable_server(database: Database) -> None:
    url = on_local_port(database.app_url, 1)  # nothing listens there
    with pytest.raises(DatabaseUnavailable) as info:
        async with cortex.connect(url):
            pass
    assert info.value.__cause__ is not None


async def test_missing_database_is_an_error(database: Database) -> None:
    with pytest.raises(DatabaseUnavailable, match="does not exist"):
        async with cortex.connect(with_database(database.app_url, "no_such_db_cortex")):
            pass


async def test_unmigrated_database_is_schema_mismatch(server_url: str) -> None:
    name = "cortex_t_empty_" + Scope.parse("a").tenant + str(id(server_url))[-6:]
    await admin(server_url, f'CREATE DATABASE "{name}"')
    try:
        with pytest.raises(SchemaMismatch, match="cortex db upgrade"):
            async with cortex.connect(with_database(server_url, name)):
                pass
    finally:
        await admin(server_url, f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_pool_exhaustion_is_a_clear_error(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    async with cortex.connect(
        database.app_url, pool_size=1, max_overflow=0, pool_timeout=0.3
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            async with anyio.create_task_group() as tg, row_locked(owner_conn, tenant):
                tg.start_soon(store.append_message, s.id, NewMessage("user", "queued"))
                await anyio.sleep(0.1)
                with pytest.raises(DatabaseUnavailable, match="pool"):
                    await store.get_session(s.id)
                record("faults: pool exhaustion")
        assert await stored_counts(owner_conn, tenant) == (1, 1)
        await _healthy(store, tenant, s.id)


async def test_statement_timeout(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    async with cortex.connect(
        database.app_url, connect_args={"server_settings": {"statement_timeout": "200"}}
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            async with row_locked(owner_conn, tenant):
                with pytest.raises(OperationTimeout):
                    await store.append_message(s.id, NewMessage("user", "late"))
                record("faults: statement timeouts")
        assert await stored_counts(owner_conn, tenant) == (0, 0)
        await _healthy(store, tenant, s.id)
        assert await stored_counts(owner_conn, tenant) == (5, 5)


async def test_backend_killed_mid_transaction(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    async with cortex.connect(database.app_url, pool_size=2) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        async with row_locked(owner_conn, tenant):

            async def killer() -> None:
                await anyio.sleep(0.2)
                await owner_conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = $1 AND wait_event_type = 'Lock'",
                    database.app_role,
                )

            failures: list[BaseException] = []

            async def doomed() -> None:
                with use_scope(tenant):
                    try:
                        await store.append_message(s.id, NewMessage("user", "doomed"))
                    except cortex.CortexError as exc:
                        failures.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                tg.start_soon(doomed)
            assert len(failures) == 1
            assert isinstance(failures[0], DatabaseUnavailable)
            assert not isinstance(failures[0].__cause__, cortex.CortexError)
        assert await stored_counts(owner_conn, tenant) == (0, 0)
        await _healthy(store, tenant, s.id, times=10)


async def test_cancelled_callers_write_nothing_and_pool_stays_clean(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    async with cortex.connect(database.app_url, pool_size=1, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            for delay in (0.0, 0.001, 0.01, 0.05):
                async with row_locked(owner_conn, tenant):
                    with anyio.move_on_after(0.1 + delay) as scope:
                        await store.append_message(s.id, NewMessage("user", "cancelled"))
                    assert scope.cancelled_caught
            assert await stored_counts(owner_conn, tenant) == (0, 0)
            # Cancel at random points of unblocked appends: each either fully lands or not at all.
            for i in range(60):
                with anyio.move_on_after(random.uniform(0, 0.006) if i % 2 else i * 0.0002):
                    await store.append_message(s.id, NewMessage("user", "maybe"))
                record("faults: callers cancelled at random points")
        count, rows = await stored_counts(owner_conn, tenant)
        assert count == rows
        # No pooled connection sits inside an open or failed transaction.
        stuck = await owner_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 "
            "AND state IN ('idle in transaction', 'idle in transaction (aborted)')",
            database.app_role,
        )
        assert stuck == 0
        await _healthy(store, tenant, s.id, times=10)
        assert (await stored_counts(owner_conn, tenant))[1] == rows + 10


async def test_serialization_failures_are_retried(store: cortex.Store) -> None:
    attempts = 0

    async def flaky(conn: Tx) -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            await conn.execute(
                sa.text("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$")
            )
        return "ok"

    assert await run_transaction(store.engine, Scope("t"), flaky) == "ok"
    assert attempts == 3

    attempts = 0

    async def hopeless(conn: Tx) -> None:
        nonlocal attempts
        attempts += 1
        await conn.execute(
            sa.text("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40P01'; END $$")
        )

    with pytest.raises(DatabaseError):
        await run_transaction(store.engine, Scope("t"), hopeless)
    assert attempts == MAX_ATTEMPTS


async def test_real_deadlock_is_retried(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        a = await store.create_session("bot")
        b = await store.create_session("bot")
    gate = anyio.Event()
    arrived = 0

    def body(first: str, second: str):  # type: ignore[no-untyped-def]  # small local closure
        async def run(conn: Tx) -> None:
            nonlocal arrived
            stmt = sa.text(
                "UPDATE sessions SET title = title || '.' WHERE tenant_id = :t AND id = :id"
            )
            from cortex.ids import parse_id

            await conn.execute(stmt, {"t": tenant, "id": parse_id("ses", first)})
            arrived += 1
            if arrived == 2:
                gate.set()
            with anyio.move_on_after(0.5):
                await gate.wait()
            await conn.execute(stmt, {"t": tenant, "id": parse_id("ses", second)})

        return run

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_transaction, store.engine, Scope(tenant), body(a.id, b.id))
        tg.start_soon(run_transaction, store.engine, Scope(tenant), body(b.id, a.id))
    with use_scope(tenant):
        titles = sorted(
            [(await store.get_session(a.id)).title, (await store.get_session(b.id)).title]
        )
    assert titles == ["..", ".."]


async def test_backends_killed_during_concurrent_appends(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    acked: list[str] = []
    failures: list[BaseException] = []
    kills = 0
    async with cortex.connect(database.app_url, pool_size=6) as store:
        with use_scope(tenant):
            sessions = [(await store.create_session("bot")).id for _ in range(4)]
        stop = anyio.Event()

        async def writer(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                text = f"{w}-{n}"
                try:
                    with use_scope(tenant):
                        await store.append_message(sessions[n % 4], NewMessage("user", text))
                    acked.append(text)
                except cortex.CortexError as exc:
                    failures.append(exc)

        async def killer() -> None:
            nonlocal kills
            for _ in range(25):
                await anyio.sleep(0.04)
                kills += await owner_conn.fetchval(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 2) AS k",
                    database.app_role,
                )
            stop.set()

        async with anyio.create_task_group() as tg:
            for w in range(6):
                tg.start_soon(writer, w)
            tg.start_soon(killer)
        with use_scope(tenant):
            for sid in sessions:  # still serving
                await store.append_message(sid, NewMessage("user", "after"))
    assert kills > 10
    assert failures, "no append was hit: the test injected nothing"
    record("faults: backends killed during concurrent appends", kills)
    record("writes acknowledged under faults", len(acked))
    assert all(isinstance(f, cortex.CortexError) for f in failures)
    stored = {
        r[0]
        for r in await owner_conn.fetch("SELECT content FROM messages WHERE tenant_id = $1", tenant)
    }
    lost = [t for t in acked if t not in stored]
    record("acknowledged writes lost", len(lost))
    assert lost == []
    count, rows = await stored_counts(owner_conn, tenant)
    assert count == rows
    gaps = await owner_conn.fetchval(
        "SELECT count(*) FROM (SELECT session_id FROM messages WHERE tenant_id = $1 "
        "GROUP BY session_id HAVING max(seq) <> count(*) OR count(DISTINCT seq) <> count(*)) AS g",
        tenant,
    )
    assert gaps == 0


async def _fill_pool(store: cortex.Store, size: int) -> None:
    """Open ``size`` pooled connections at once, then leave them idle in the pool."""
    conns = [await store.engine.connect() for _ in range(size)]
    for conn in conns:
        await conn.get_raw_connection()
    for conn in conns:
        await conn.close()


@pytest.mark.parametrize("pool_size", [1, 2, 5, 8])
@pytest.mark.parametrize("reaper", ["terminate", "idle_session_timeout"])
@pytest.mark.parametrize("pre_ping", [True, False])
async def test_idle_connections_reaped_by_the_server(
    database: Database,
    tenant: str,
    owner_conn: asyncpg.Connection,
    pre_ping: bool,
    reaper: str,
    pool_size: int,
) -> None:
    # What a managed PostgreSQL does to connections idle through a long agent
    # turn: every pooled connection is gone, and the pool (FIFO) hands out
    # the dead ones one after another.
    settings = {"idle_session_timeout": "300"} if reaper == "idle_session_timeout" else {}
    async with cortex.connect(
        database.app_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=pre_ping,
        connect_args={"server_settings": settings},
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        await _fill_pool(store, pool_size)
        if reaper == "terminate":
            await owner_conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                database.app_role,
            )
        await wait_until_no_backends(owner_conn, database.app_role)
        with use_scope(tenant):
            # With the ping, the pool replaces each dead connection at
            # checkout; without it, cortex sees BEGIN fail (nothing written
            # yet) and runs the call again on the next connection, until a
            # new one. Either way: no error.
            await store.append_message(s.id, NewMessage("user", "after the reaping"))
            assert (await store.get_session(s.id)).message_count == 1
            record("faults: idle pooled connections reaped by the server")


async def test_reaped_pool_and_no_new_connection_is_a_clear_error(
    database: Database, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    # Replacing dead pooled connections ends where a new connection fails.
    async with cortex.connect(database.app_url, pool_size=5, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        await _fill_pool(store, 5)
        await owner_conn.execute(f'ALTER ROLE "{database.app_role}" NOLOGIN')
        try:
            await owner_conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                database.app_role,
            )
            await wait_until_no_backends(owner_conn, database.app_role)
            with use_scope(tenant), pytest.raises(DatabaseUnavailable, match="login"):
                await store.get_session(s.id)
        finally:
            await owner_conn.execute(f'ALTER ROLE "{database.app_role}" LOGIN')
        with use_scope(tenant):
            assert (await store.get_session(s.id)).message_count == 0
