"""Adversarial tests for the pool fast path (cortex._db.pool) and the routines' generic plans.

Attacks on the first form of the fast path (commit bb90e23), which counted
the slots cortex dropped. Each block says what it found:

    FOUND  - failed on that commit; fixed since (cortex._db.pool._next_idle_is_live
             reads the record the pool hands out next, and every checkout that
             may reconnect runs in its own shielded task)
    HOLDS  - passed; kept as a regression test for a claim that held
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope
from cortex._db import pool as db_pool
from tests.conftest import Database, asyncpg_dsn, on_unix_socket, store_url
from tests.figures import record
from tests.proxy import commit_drop_proxy

# The pool subclasses SQLAlchemy's: every SQLAlchemy the pins allow must hold these.
pytestmark = pytest.mark.sqlalchemy20


@contextlib.asynccontextmanager
async def _loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Every context the event loop's exception handler receives inside the block.

    Collected (after a garbage collection) instead of reaching the test
    runner's handler, so the test can tell them apart.
    """
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(before)


def _orphaned_tls_probe(context: dict[str, Any]) -> bool:
    """asyncpg's SSL probe future, failed by a connection lost before the server answered.

    asyncpg's bug, not cortex's (asyncpg 0.32.0, the newest; see
    :func:`test_asyncpg_still_orphans_its_cancel_request_probe`). A cancelled
    query makes asyncpg open a second connection for the CancelRequest, which
    with ``sslmode=prefer`` sends an SSLRequest first; when the query's own
    connection is then lost (the storm's kills), asyncpg's cleanup cancels
    that CancelRequest task. If the cancel lands inside
    ``loop.create_connection()`` after the socket connected, asyncio closes
    the transport and the probe's future fails with nobody to read it. Seen
    in 5% of storms (7 of 140 runs, each traced to this path). Harmless: the
    socket is closed; only the log line is spurious.
    """
    exc = context.get("exception")
    return (
        context.get("message") == "Future exception was never retrieved"
        and isinstance(exc, ConnectionError)
        and str(exc) == "unexpected connection_lost() call"
    )


class _Caught:
    def __init__(self) -> None:
        self.items: list[str] = []


@contextlib.contextmanager
def _catching() -> Iterator[_Caught]:
    """Every "coroutine ... was never awaited" RuntimeWarning raised inside the block.

    Entered in the test body (pytest's own catch_warnings wraps each phase
    separately, so a fixture's would be overridden); also records the
    unraisable-hook path, where such a warning turned into an error ends up.
    """
    caught = _Caught()
    hook = sys.unraisablehook

    def unraisable(info: Any) -> None:
        caught.items.append(f"unraisable: {info.exc_value!r}")

    sys.unraisablehook = unraisable
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            yield caught
            gc.collect()
        caught.items.extend(str(w.message) for w in seen if "never awaited" in str(w.message))
    finally:
        sys.unraisablehook = hook


def _pool(store: cortex.Store) -> Any:
    return store._engine.sync_engine.pool


async def _app_backends(owner: asyncpg.Connection, role: str) -> list[asyncpg.Record]:
    return await owner.fetch(
        "SELECT pid, state, backend_xid, xact_start FROM pg_stat_activity"
        " WHERE usename = $1 AND pid <> pg_backend_pid()",
        role,
    )


# --------------------------------------------------------------------------------------
# FOUND: a slot SQLAlchemy (not cortex) invalidated made the fast path leave an
# un-awaited asyncpg.connect() coroutine behind.
#
# _take_idle calls pool.connect() outside a greenlet. When the idle record had
# no live DBAPI connection that cortex had not counted as dropped, SQLAlchemy
# reconnects: AsyncAdapt_asyncpg_dbapi.connect() builds
# ``await_(create(dbapi, asyncpg.connect(...)))``; await_ sees no greenlet and
# closes the *outer* create() coroutine, never the inner asyncpg.connect()
# coroutine, which is garbage collected un-awaited ("coroutine 'connect' was
# never awaited", an error under filterwarnings=error). The call itself
# succeeds through the greenlet fallback.
#
# Ways the pool gets such a slot without cortex's release(): pool-wide
# invalidation (invalidate_pool_on_disconnect, when any SQLAlchemy Connection on
# the engine -- check_schema, _installed_routines, a user's engine given to
# Store(engine) -- sees a disconnect), a reset failure in _finalize_fairy, a
# Connection.invalidate(), GC cleanup of a fairy.
# --------------------------------------------------------------------------------------


async def test_slot_invalidated_by_sqlalchemy_leaves_no_unawaited_coroutine(
    database: Database, tenant: str, hops: list[str]
) -> None:
    with _catching() as unawaited:
        async with cortex.connect(store_url(database), pool_size=1, max_overflow=0) as store:
            with use_scope(tenant):
                s = await store.create_session("bot")
            # SQLAlchemy invalidates the slot itself (cortex._db.pool never hears of it).
            async with store._engine.connect() as conn:
                await conn.invalidate()
            del hops[:]
            with use_scope(tenant):
                assert (await store.get_session(s.id)).id == s.id
                assert (await store.get_session(s.id)).id == s.id
            assert _pool(store).checkedout() == 0
    assert unawaited.items == [], unawaited.items


async def test_pool_wide_invalidation_on_disconnect_leaves_no_unawaited_coroutine(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    with _catching() as unawaited:
        import sqlalchemy as sa

        async with cortex.connect(store_url(database), pool_size=2, max_overflow=0) as store:
            with use_scope(tenant):
                s = await store.create_session("bot")
                # Two idle connections in the pool.
                await asyncio.gather(store.get_session(s.id), store.get_session(s.id))
            assert _pool(store).checkedin() == 2
            # Some SQLAlchemy user of the same engine sees its connection killed:
            # SQLAlchemy invalidates the whole pool (invalidate_pool_on_disconnect).
            async with store._engine.connect() as conn:
                pid = await conn.scalar(sa.text("SELECT pg_backend_pid()"))
                await owner_conn.execute("SELECT pg_terminate_backend($1)", pid)
                await asyncio.sleep(0.1)
                with pytest.raises(sa.exc.DBAPIError) as raised:
                    await conn.execute(sa.text("SELECT 1"))
                assert raised.value.connection_invalidated
            with use_scope(tenant):
                for _ in range(3):
                    assert (await store.get_session(s.id)).id == s.id
            assert _pool(store).checkedout() == 0
    assert unawaited.items == [], unawaited.items


# --------------------------------------------------------------------------------------
# FOUND (performance, not correctness): the count of dropped slots over-counted,
# and the fast path was then off for the life of the pool.
#
# The count went down only when the *idle* branch of checkout() handed out a
# fresh connection. A dropped slot can be reopened elsewhere: by a caller that
# was waiting for the exhausted pool (the non-idle branch), or never at all (an
# overflow connection dropped while the queue is full is discarded, not queued).
# The counter then stays > 0 and every later checkout takes the greenlet path
# (the 78 -> 24 us win is gone, silently, after one fault under load).
# --------------------------------------------------------------------------------------


async def test_a_drop_reopened_by_a_waiter_does_not_disable_the_fast_path(
    database: Database, owner_conn: asyncpg.Connection, tenant: str, hops: list[str]
) -> None:
    async with cortex.connect(store_url(database), pool_size=1, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            await store.append_message(s.id, NewMessage("user", "hi"))
        pool = _pool(store)
        # The session row is locked, so the next append waits on the server
        # holding the only pooled connection.
        await owner_conn.execute("BEGIN")
        await owner_conn.execute("SELECT 1 FROM sessions FOR UPDATE")
        try:
            with use_scope(tenant):
                blocked = asyncio.ensure_future(
                    store.append_message(s.id, NewMessage("user", "blocked"))
                )
                await asyncio.sleep(0.3)
                waiter = asyncio.ensure_future(store.get_session(s.id))  # waits for the pool
                await asyncio.sleep(0.1)
                assert not waiter.done()
                # An operator (or a failover) kills the busy backend.
                await owner_conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE usename = $1 AND wait_event_type = 'Lock'",
                    database.app_role,
                )
                with pytest.raises(cortex.CortexError):
                    await blocked
                assert (await waiter).id == s.id
        finally:
            await owner_conn.execute("ROLLBACK")
        with use_scope(tenant):
            await store.get_session(s.id)
            del hops[:]
            for _ in range(3):
                assert (await store.get_session(s.id)).id == s.id
        assert pool.checkedout() == 0
        assert hops == [], hops


async def test_a_dropped_overflow_connection_does_not_disable_the_fast_path(
    database: Database, tenant: str, hops: list[str]
) -> None:
    async with cortex.connect(store_url(database), pool_size=1, max_overflow=1) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        engine = store._engine
        pool = _pool(store)
        first = await db_pool.checkout(engine)
        second = await db_pool.checkout(engine)  # an overflow connection
        await db_pool.finish(first)  # the pool's one slot is idle again
        # The overflow connection dropped (cancelled mid-statement, server
        # error, lost socket...): the queue is full, so the pool discards it.
        await db_pool.release(second.conn, second.driver, trusted=False)
        with use_scope(tenant):
            # The dropped slot went back into the queue, which the pool's one
            # held connection leaves room for: one call reopens it.
            await store.get_session(s.id)
            await store.get_session(s.id)
            del hops[:]
            for _ in range(3):
                assert (await store.get_session(s.id)).id == s.id
        assert pool.checkedout() == 0
        assert hops == [], hops


# --------------------------------------------------------------------------------------
# HOLDS: pre-ping and recycling keep the greenlet path (they may do I/O at checkout).
# --------------------------------------------------------------------------------------


async def test_pre_ping_and_recycle_never_take_the_fast_path(
    database: Database, tenant: str, hops: list[str]
) -> None:
    for options in ({"pool_pre_ping": True}, {"pool_recycle": 3600}):
        async with cortex.connect(
            store_url(database), pool_size=1, max_overflow=0, **options
        ) as store:
            with use_scope(tenant):
                s = await store.create_session("bot")
                del hops[:]
                await store.get_session(s.id)
            assert "connect" in hops


async def test_pre_ping_replaces_a_connection_the_server_ended(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    with _catching() as unawaited:
        async with cortex.connect(
            store_url(database), pool_size=1, max_overflow=0, pool_pre_ping=True
        ) as store:
            with use_scope(tenant):
                s = await store.create_session("bot")
            await owner_conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                database.app_role,
            )
            await asyncio.sleep(0.2)
            with use_scope(tenant):
                assert (await store.get_session(s.id)).id == s.id
            assert _pool(store).checkedout() == 0
    assert unawaited.items == []


# --------------------------------------------------------------------------------------
# FOUND (pre-existing: fails on 851f4ed too; same root cause as
# test_cancel_while_a_dropped_slot_reconnects, the anyio runner reports the
# loop's "Future exception was never retrieved" ConnectionError('unexpected
# connection_lost() call')). Storms of cancellations and backend kills, pool_size=1 / overflow; no
# connection leaks, none goes back in a transaction, no un-awaited coroutine,
# calls after the storm all succeed.
# --------------------------------------------------------------------------------------


async def test_cancel_and_kill_storm_leaves_a_clean_pool(
    database: Database,
    owner_conn: asyncpg.Connection,
    tenant: str,
) -> None:
    async with _loop_errors() as errors:
        await _storm(database, owner_conn, tenant)
    orphans = [c for c in errors if _orphaned_tls_probe(c)]
    record("faults: asyncpg SSL probes orphaned by a lost connection", len(orphans))
    assert [c for c in errors if not _orphaned_tls_probe(c)] == []


async def test_asyncpg_still_orphans_its_cancel_request_probe(database: Database) -> None:
    """The upstream bug the storm tolerates, reproduced without cortex: a canary.

    A running query is cancelled, then its connection is terminated a few
    loop iterations later, at each of 0 to 12: asyncpg's cleanup cancels its
    own CancelRequest task, and at one of those moments the probe's future
    is left failed. When this test fails, asyncpg has fixed it: remove the
    tolerance from test_cancel_and_kill_storm_leaves_a_clean_pool.

    The probe is the SSLRequest asyncpg sends first on TCP; on a unix socket
    it sends none (asyncpg.connect_utils._cancel), so there is nothing to
    orphan. A server reached on a socket (the embedded one listens on nothing
    else) is reached here through a plain TCP forwarder, never armed: the
    client's side, where the bug lives, is then the TCP one it is on a real
    deployment.
    """
    async with contextlib.AsyncExitStack() as stack:
        dsn = asyncpg_dsn(database.owner_url)
        if on_unix_socket(dsn):
            forwarder = await stack.enter_async_context(commit_drop_proxy(dsn))
            dsn = asyncpg_dsn(forwarder.client_url(dsn))
        errors = await stack.enter_async_context(_loop_errors())
        for k in range(13):
            conn = await asyncpg.connect(dsn)
            query = asyncio.ensure_future(conn.execute("SELECT pg_sleep(0.5)"))
            await asyncio.sleep(0.02)  # running on the server
            query.cancel()  # asyncpg opens a CancelRequest connection
            for _ in range(k):
                await asyncio.sleep(0)
            conn.terminate()  # its cleanup cancels the CancelRequest task
            with contextlib.suppress(BaseException):
                await query
            del query, conn
            for _ in range(5):
                await asyncio.sleep(0)
            gc.collect()
    assert [c for c in errors if not _orphaned_tls_probe(c)] == []
    assert [c for c in errors if _orphaned_tls_probe(c)] != [], (
        f"asyncpg {asyncpg.__version__} no longer orphans its CancelRequest probe: remove"
        " the storm's tolerance (_orphaned_tls_probe) and this canary"
    )


async def _storm(database: Database, owner_conn: asyncpg.Connection, tenant: str) -> None:
    for overflow in (0, 2):
        with _catching() as unawaited:
            rng = random.Random(19 + overflow)
            async with cortex.connect(
                store_url(database), pool_size=1, max_overflow=overflow
            ) as store:
                with use_scope(tenant):
                    s = await store.create_session("bot")

                    async def one(i: int) -> None:
                        kind = i % 4
                        if kind == 0:
                            await store.append_message(s.id, NewMessage("user", f"m{i}"))  # noqa: B023
                        elif kind == 1:
                            await store.get_session(s.id)  # noqa: B023
                        elif kind == 2:
                            await store.list_sessions()
                        else:
                            await store.list_messages(s.id)  # noqa: B023

                    async def killer() -> None:
                        for _ in range(6):
                            await asyncio.sleep(rng.uniform(0.005, 0.05))  # noqa: B023
                            await owner_conn.execute(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                " WHERE usename = $1 AND pid <> pg_backend_pid()",
                                database.app_role,
                            )

                    kill = asyncio.ensure_future(killer())
                    for _ in range(6):
                        tasks = [asyncio.ensure_future(one(i)) for i in range(24)]
                        for t in tasks:
                            if rng.random() < 0.4:
                                await asyncio.sleep(rng.uniform(0, 0.003))
                                t.cancel()
                        for t in tasks:
                            if rng.random() < 0.2:
                                t.cancel()
                        results = await asyncio.gather(*tasks, return_exceptions=True)
                        for r in results:
                            assert r is None or isinstance(
                                r, asyncio.CancelledError | cortex.CortexError
                            ), repr(r)
                        # asyncio.timeout around a call, too
                        for _ in range(5):
                            try:
                                async with asyncio.timeout(rng.uniform(0, 0.004)):
                                    await one(rng.randrange(4))
                            except (TimeoutError, cortex.CortexError):
                                pass
                    await kill
                    await asyncio.sleep(0.2)
                    # After the storm every call works, first time.
                    for i in range(8):
                        await one(i)
                pool = _pool(store)
                assert pool.checkedout() == 0
                for _ in range(20):
                    if not db_pool._BACKGROUND:
                        break
                    await asyncio.sleep(0.05)
                rows = await _app_backends(owner_conn, database.app_role)
                assert all(r["state"] == "idle" and r["xact_start"] is None for r in rows), rows
                assert len(rows) <= 1 + overflow
        assert unawaited.items == [], unawaited.items


# --------------------------------------------------------------------------------------
# HOLDS: store.close() while calls are in flight.
# --------------------------------------------------------------------------------------


async def test_close_with_calls_in_flight(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    with _catching() as unawaited:
        tasks: list[asyncio.Future[Any]] = []
        async with cortex.connect(store_url(database), pool_size=1, max_overflow=1) as store:
            with use_scope(tenant):
                s = await store.create_session("bot")
                tasks = [
                    asyncio.ensure_future(store.append_message(s.id, NewMessage("user", str(i))))
                    for i in range(20)
                ]
                await asyncio.sleep(0.005)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            assert not isinstance(r, BaseException) or isinstance(r, cortex.CortexError), repr(r)
        for _ in range(40):
            if not db_pool._BACKGROUND:
                break
            await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0.2)
        rows = await _app_backends(owner_conn, database.app_role)
        assert all(r["xact_start"] is None for r in rows), rows
    assert unawaited.items == [], unawaited.items


# --------------------------------------------------------------------------------------
# HOLDS: a routine's SET plan_cache_mode never outlives the call, on the same
# session: after a call, after a call that fails, inside a transaction, and
# without clobbering a transaction's SET LOCAL (a search's force_custom_plan).
# --------------------------------------------------------------------------------------


async def test_routine_setting_does_not_outlive_the_call(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    async with cortex.connect(store_url(database)) as store:
        if store.distributed:
            pytest.skip("no SET clause on Citus")
        with use_scope(f"{tenant}/team/user"):
            await store.create_session("bot")
        routines = store._routines
        assert routines
    names = await owner_conn.fetch(
        r"SELECT p.oid::regprocedure::text AS sig, p.pronargs FROM pg_proc AS p"
        r" WHERE p.proname LIKE 'cortex\_r\_%'"
    )
    assert names
    conn = await asyncpg.connect(asyncpg_dsn(database.app_url))
    try:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
        for call in routines.values():
            # A call with all-NULL arguments: either runs or errors; neither may leak.
            nargs = call.count("$")
            for in_tx in (False, True):
                if in_tx:
                    await conn.execute(
                        f"BEGIN; SET LOCAL cortex.tenant = '{tenant}';"
                        " SET LOCAL plan_cache_mode = force_custom_plan"
                    )
                try:
                    await conn.execute("SAVEPOINT a" if in_tx else "SELECT 1")
                    try:
                        await conn.fetch(call, *([None] * nargs))
                    except asyncpg.PostgresError:
                        if in_tx:
                            await conn.execute("ROLLBACK TO SAVEPOINT a")
                    expected = "force_custom_plan" if in_tx else "auto"
                    assert await conn.fetchval("SHOW plan_cache_mode") == expected, call
                finally:
                    if in_tx:
                        await conn.execute("COMMIT")
                assert await conn.fetchval("SHOW plan_cache_mode") == "auto", call
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------
# FOUND (older than the fast path: failed on 851f4ed too).
# Cancellation while a dropped slot is reopened. checkout()'s idle branch awaited
# _open() without a task or shield, though reopening a dropped slot is network
# I/O: a cancel landed mid-handshake. Every checkout that may reconnect now runs
# in its own shielded task.
# Checks: no un-awaited coroutine, nothing reported to the loop's exception
# handler, no leaked connection, and the next call works.
# --------------------------------------------------------------------------------------


async def test_cancel_while_a_dropped_slot_reconnects(
    database: Database, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    with _catching() as unawaited:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        previous = loop.get_exception_handler()
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        try:
            async with cortex.connect(store_url(database), pool_size=1, max_overflow=0) as store:
                with use_scope(tenant):
                    s = await store.create_session("bot")
                pool = _pool(store)
                for i in range(30):
                    # Drop the pooled connection through cortex (the server ends it).
                    await owner_conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                        database.app_role,
                    )
                    await asyncio.sleep(0.05)
                    with use_scope(tenant):
                        try:
                            async with asyncio.timeout(0.0005 * (i % 10)):
                                await store.get_session(s.id)
                        except (TimeoutError, cortex.CortexError):
                            pass
                        assert (await store.get_session(s.id)).id == s.id
                    assert pool.checkedout() == 0
                await asyncio.sleep(0.2)
                gc.collect()
                await asyncio.sleep(0.1)
                rows = await _app_backends(owner_conn, database.app_role)
                assert len(rows) <= 1, rows
        finally:
            loop.set_exception_handler(previous)
        assert reported == [], [str(r.get("message")) + repr(r.get("exception")) for r in reported]
    assert unawaited.items == [], unawaited.items


# --------------------------------------------------------------------------------------
# A checkout a cancelled caller left opening stays referenced until it ends:
# asyncio keeps only weak references to tasks, and a task collected mid-connect
# closes its half-open socket from a finalizer (asyncpg then reports a lost
# connection on a future nobody awaits).
# --------------------------------------------------------------------------------------


async def test_an_abandoned_checkout_is_held_until_it_ends(
    database: Database, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening = asyncio.Event()
    real_open = db_pool._open

    async def slow_open(engine: Any) -> Any:
        opening.set()
        await asyncio.sleep(0.1)
        return await real_open(engine)

    monkeypatch.setattr(db_pool, "_open", slow_open)
    async with cortex.connect(store_url(database), pool_size=1, max_overflow=0) as store:
        await store.engine.dispose()  # no idle connection: the next call opens one
        with use_scope(tenant):
            call = asyncio.ensure_future(store.list_sessions())
            await opening.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        assert [t for t in db_pool._BACKGROUND if not t.done()], "the open is not held"
        gc.collect()
        for _ in range(40):
            if not db_pool._BACKGROUND:
                break
            await asyncio.sleep(0.05)
        assert not db_pool._BACKGROUND
        # The abandoned connection went back into the pool, and works.
        assert _pool(store).checkedin() == 1
        with use_scope(tenant):
            assert await store.list_sessions() == []
