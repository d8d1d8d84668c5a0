"""Cancellation: a cancelled call wrote all or nothing, and leaves no connection inside a transaction.

asyncio can cancel a task more than once (``task.cancel()`` twice, an
``asyncio.timeout`` and an outer cancel, a TaskGroup tearing down), and the
second cancel can land while cortex is rolling back after the first. These
tests land it there on purpose: one pooled connection, an append blocked on a
row lock held elsewhere, two cancels a fraction of a millisecond apart, the
lock released at once so the blocked statement completes before asyncpg's
cancel request reaches the server. Whatever happens, the next call on that
pooled connection, from another tenant, must not commit the cancelled append.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import NewMessage, Scope, use_scope
from cortex._db.engine import driver_dsn
from cortex._db.executor import Tx
from cortex._db.transaction import run_transaction
from cortex.ids import format_id, new_uuid
from tests.conftest import Database
from tests.faults import row_locked, stored_counts, stuck_in_transaction, wait_for_lock_waiter
from tests.figures import record

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

# The gap between the two cancels: long enough for the first to reach
# cortex's rollback, short enough that asyncpg's cancel request (a new TCP
# connection to the server) has not completed yet.
_GAP = 0.0005

# Iterations of each double-cancel storm (``make reliability`` runs more).
STORM_ITERATIONS = int(os.environ.get("CORTEX_CANCEL_STORM", "100"))


@pytest.fixture
async def watch_conn(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection outside any transaction, for watching pg_stat_activity."""
    conn = await asyncpg.connect(driver_dsn(database.owner_url))
    try:
        yield conn
    finally:
        await conn.close()


Call = Callable[[], Awaitable[Any]]


async def _double_cancel(
    how: str, call: Call, blocked: Callable[[], Awaitable[None]]
) -> asyncio.Task[None]:
    """Start ``call`` in a task, wait for ``blocked``, cancel the task twice as ``how`` says.

    The second cancel follows the first by :data:`_GAP`; the task is returned
    unawaited.
    """
    loop = asyncio.get_running_loop()
    holder: dict[str, Any] = {}

    async def with_timeout() -> None:
        async with asyncio.timeout(None) as timeout:
            holder["timeout"] = timeout
            await call()

    async def in_taskgroup() -> None:
        # A per-call deadline inside a TaskGroup child: the deadline fires,
        # then the group, its host cancelled, cancels the child again.
        async with asyncio.TaskGroup() as tg:
            tg.create_task(with_timeout())

    async def in_anyio_scope() -> None:
        with anyio.CancelScope() as scope:
            holder["scope"] = scope
            await call()

    async def plain() -> None:
        await call()

    runner = {
        "task-cancel-twice": plain,
        "timeout-then-cancel": with_timeout,
        "taskgroup-teardown": in_taskgroup,
        "anyio-scope-then-cancel": in_anyio_scope,
    }[how]
    task = asyncio.create_task(runner())
    await blocked()
    if how in ("timeout-then-cancel", "taskgroup-teardown"):
        holder["timeout"].reschedule(loop.time())  # fires on the next loop iteration
        await asyncio.sleep(0)
    elif how == "anyio-scope-then-cancel":
        holder["scope"].cancel()
    else:
        task.cancel()
    await asyncio.sleep(_GAP)
    task.cancel()
    return task


async def _victim_and_bystander(
    store: cortex.Store, tenant: str, other_tenant: str
) -> tuple[str, str]:
    with use_scope(tenant):
        victim = await store.create_session("bot")
    with use_scope(other_tenant):
        bystander = await store.create_session("bot")
    return victim.id, bystander.id


MODES = [
    "task-cancel-twice",
    "timeout-then-cancel",
    "taskgroup-teardown",
    "anyio-scope-then-cancel",
]


@pytest.mark.parametrize("call", ["transaction", "one statement"])
@pytest.mark.parametrize("how", MODES)
async def test_a_cancelled_append_is_never_committed_by_the_next_call(
    database: Database,
    tenant: str,
    other_tenant: str,
    owner_conn: asyncpg.Connection,
    watch_conn: asyncpg.Connection,
    how: str,
    call: str,
) -> None:
    # A message with an id makes the append a transaction (look up, then
    # write); without one it is one autocommit statement through its routine.
    async with cortex.connect(database.app_url, pool_size=1, max_overflow=0) as store:
        victim_id, bystander_id = await _victim_and_bystander(store, tenant, other_tenant)

        async def cancelled_append() -> None:
            with use_scope(tenant):
                message_id = format_id("msg", new_uuid()) if call == "transaction" else None
                await store.append_message(
                    victim_id, NewMessage("user", "cancelled", id=message_id)
                )

        for _ in range(5):
            async with row_locked(owner_conn, tenant):
                task = await _double_cancel(
                    how,
                    cancelled_append,
                    lambda: wait_for_lock_waiter(watch_conn, database.app_role),
                )
            # The lock is gone: the blocked UPDATE may now complete on the
            # server before asyncpg's cancel request arrives.
            with pytest.raises(asyncio.CancelledError):
                await task
            # Same pooled connection (pool_size=1), another tenant.
            with use_scope(other_tenant):
                await store.append_message(bystander_id, NewMessage("user", "unrelated"))
            record("cancellation: double cancels during a blocked append")
        count, rows = await stored_counts(owner_conn, tenant)
        if call == "transaction":
            # Rolled back: the cancel landed before COMMIT was sent.
            assert (count, rows) == (0, 0)
        else:
            # One statement: the lock was released before asyncpg's cancel
            # request arrived, so each append may have committed, in full.
            assert count == rows <= 5
        assert await stored_counts(owner_conn, other_tenant) == (5, 5)
        assert await stuck_in_transaction(watch_conn, database.app_role) == 0


STORM_FLAVOURS = ["asyncio", "anyio", "mixed"]


@pytest.mark.slow
@pytest.mark.parametrize("flavour", STORM_FLAVOURS)
async def test_double_cancel_storm(
    database: Database,
    tenant: str,
    other_tenant: str,
    owner_conn: asyncpg.Connection,
    watch_conn: asyncpg.Connection,
    flavour: str,
) -> None:
    """Double cancels at random offsets while another tenant works on the same small pool.

    ``asyncio``: ``task.cancel()`` twice; ``anyio``: an inner and an outer
    cancel scope; ``mixed``: a cancel scope, then ``task.cancel()``. Every
    other iteration holds the row lock the append needs and releases it right
    after the second cancel.
    """
    rng = random.Random()
    iterations = STORM_ITERATIONS
    failures: list[BaseException] = []
    bystander_calls = 0
    acked: list[str] = []
    cancelled: list[str] = []
    async with cortex.connect(database.app_url, pool_size=2, max_overflow=0) as store:
        victim_id, bystander_id = await _victim_and_bystander(store, tenant, other_tenant)
        stop = anyio.Event()

        async def bystander() -> None:
            nonlocal bystander_calls
            while not stop.is_set():
                try:
                    with use_scope(other_tenant):
                        await store.append_message(bystander_id, NewMessage("user", "unrelated"))
                        await store.get_session(bystander_id)
                except cortex.CortexError as exc:
                    failures.append(exc)
                bystander_calls += 2

        async def victim(text: str, scopes: list[anyio.CancelScope]) -> None:
            with anyio.CancelScope() as outer:
                scopes.append(outer)
                with anyio.CancelScope() as inner:
                    scopes.append(inner)
                    with use_scope(tenant):
                        await store.append_message(victim_id, NewMessage("user", text))
                    acked.append(text)
                    return
            cancelled.append(text)  # an anyio scope swallowed the cancellation

        async with anyio.create_task_group() as tg:
            tg.start_soon(bystander)
            for i in range(iterations):
                text = f"victim-{i}"
                scopes: list[anyio.CancelScope] = []
                locked = contextlib.AsyncExitStack()
                if i % 2:
                    await locked.enter_async_context(row_locked(owner_conn, tenant))
                async with locked:
                    task = asyncio.create_task(victim(text, scopes))
                    await asyncio.sleep(rng.uniform(0, 0.004))
                    if flavour == "asyncio":
                        task.cancel()
                    else:
                        scopes[1].cancel()
                    await asyncio.sleep(rng.uniform(0, 0.001))
                    if flavour == "anyio":
                        scopes[0].cancel()
                    else:
                        task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled.append(text)
                except cortex.CortexError as exc:  # e.g. 25P02 on a poisoned connection
                    failures.append(exc)
                record(f"cancellation storm ({flavour}): double cancels")
            stop.set()
    record(f"cancellation storm ({flavour}): cancelled calls", len(cancelled))
    record(f"cancellation storm ({flavour}): unrelated calls", bystander_calls)
    record(f"cancellation storm ({flavour}): calls failed (any tenant)", len(failures))
    stuck = await stuck_in_transaction(watch_conn, database.app_role)
    record(f"cancellation storm ({flavour}): connections left in a transaction", stuck)
    # A victim row committed by a bystander's transaction shares its xmin.
    shared = await owner_conn.fetchval(
        "SELECT count(*) FROM messages v JOIN messages b ON v.xmin = b.xmin "
        "WHERE v.tenant_id = $1 AND b.tenant_id = $2",
        tenant,
        other_tenant,
    )
    record(f"cancellation storm ({flavour}): cancelled writes committed by another call", shared)
    assert failures == []
    assert stuck == 0
    assert shared == 0
    assert cancelled, "no call was cancelled: the storm injected nothing"
    for who in (tenant, other_tenant):
        count, rows = await stored_counts(owner_conn, who)
        assert count == rows
    stored = {
        r[0]
        for r in await owner_conn.fetch("SELECT content FROM messages WHERE tenant_id = $1", tenant)
    }
    assert set(acked) <= stored


@pytest.mark.parametrize("how", ["anyio", "asyncio"])
async def test_a_cancelled_wait_for_a_pooled_connection_returns_at_once(
    database: Database,
    tenant: str,
    owner_conn: asyncpg.Connection,
    watch_conn: asyncpg.Connection,
    how: str,
) -> None:
    # pool_timeout is far beyond anything this test waits for: the call must
    # come back while the blocker still holds the pool's only connection.
    async with cortex.connect(
        database.app_url, pool_size=1, max_overflow=0, pool_timeout=30
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        pool = store.engine.sync_engine.pool

        async def blocker() -> None:
            with use_scope(tenant):
                await store.append_message(s.id, NewMessage("user", "holds the pool"))

        async def waiter() -> None:
            with use_scope(tenant):
                await store.get_session(s.id)

        async with row_locked(owner_conn, tenant):
            holding = asyncio.create_task(blocker())
            await wait_for_lock_waiter(watch_conn, database.app_role)
            if how == "anyio":
                with anyio.move_on_after(0.2) as scope:
                    await waiter()
                assert scope.cancelled_caught
            else:
                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # Back before the pool had a connection to give: the blocker
            # still holds it, its statement still waits on the lock.
            assert not holding.done()
            assert await watch_conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE usename = $1 AND wait_event_type = 'Lock'",
                database.app_role,
            )
            record("cancellation: callers cancelled while waiting for the pool")
        await holding
        # The abandoned checkout got the connection once the blocker let go,
        # and put it straight back: nothing stays checked out or half-open.
        with use_scope(tenant):
            assert (await store.get_session(s.id)).message_count == 1
        for _ in range(500):
            if pool.checkedout() == 0:  # type: ignore[attr-defined]  # QueuePool's own counter
                break
            await anyio.sleep(0.01)
        assert pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's own counter
        assert await stuck_in_transaction(watch_conn, database.app_role) == 0


async def test_cancelled_while_connecting_leaves_nothing_half_open(
    database: Database, tenant: str, watch_conn: asyncpg.Connection
) -> None:
    # Each iteration starts from an empty pool, so the checkout opens a new
    # connection, and is cancelled somewhere in that handshake (or after it).
    rng = random.Random()
    async with cortex.connect(database.app_url, pool_size=1, max_overflow=0) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
        for i in range(40):
            await store.engine.dispose()
            with use_scope(tenant), anyio.move_on_after(rng.uniform(0, 0.01) if i % 2 else 0):
                await store.get_session(s.id)
            record("cancellation: callers cancelled while a connection opened")
        pool = store.engine.sync_engine.pool
        for _ in range(500):
            if pool.checkedout() == 0:  # type: ignore[attr-defined]  # QueuePool's own counter
                break
            await anyio.sleep(0.01)
        assert pool.checkedout() == 0  # type: ignore[attr-defined]  # QueuePool's own counter
        with use_scope(tenant):
            assert (await store.get_session(s.id)).message_count == 0
        # At most the pool's one connection stays open on the server (a
        # backend whose client closed takes a moment to exit).
        for _ in range(500):
            backends = await watch_conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", database.app_role
            )
            if backends <= 1:
                break
            await anyio.sleep(0.01)
        assert backends <= 1


async def test_cancels_during_commit_let_the_commit_finish(
    database: Database, tenant: str, watch_conn: asyncpg.Connection
) -> None:
    # A deferred constraint trigger that sleeps makes COMMIT slow enough to
    # cancel the caller twice while it is in flight. The trigger, its
    # function and the table are temporary: they live on the one pooled
    # connection (pool_size=1), which the second call reads back.
    async def slow_commit(tx: Tx) -> None:
        await tx.driver.execute(
            "CREATE TEMP TABLE IF NOT EXISTS committed (x int);"
            "CREATE OR REPLACE FUNCTION pg_temp.slow() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;"
            "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON committed "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.slow();"
            "INSERT INTO committed VALUES (1)"
        )

    async def read_back(tx: Tx) -> int:
        return int(await tx.driver.fetchval("SELECT count(*) FROM committed"))

    async with cortex.connect(database.app_url, pool_size=1, max_overflow=0) as store:
        task = asyncio.create_task(run_transaction(store.engine, Scope(tenant), slow_commit))
        for _ in range(5000):  # until COMMIT runs the trigger
            if await watch_conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event = 'PgSleep'",
                database.app_role,
            ):
                break
            await asyncio.sleep(0.002)
        task.cancel()
        await asyncio.sleep(_GAP)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Committed, on a connection that went back to the pool clean.
        assert await run_transaction(store.engine, Scope(tenant), read_back) == 1
        assert await stuck_in_transaction(watch_conn, database.app_role) == 0
        record("cancellation: double cancels during COMMIT")


async def test_a_walk_cancelled_twice_ends_its_snapshot(
    database: Database, tenant: str, watch_conn: asyncpg.Connection
) -> None:
    # iter_sessions holds a snapshot transaction on its own connection; its
    # cleanup must survive a second cancel like run_transaction's does.
    async with cortex.connect(database.app_url, pool_size=1, max_overflow=0) as store:
        with use_scope(tenant):
            for _ in range(3):
                await store.create_session("bot")
        rounds = 20
        for _ in range(rounds):

            async def walk() -> None:
                with use_scope(tenant):
                    pages = store.iter_sessions(cortex.ListFilter(limit=1))
                    # aclosing: the generator ends (and its snapshot with it)
                    # as the cancellation leaves the loop, not when collected.
                    async with contextlib.aclosing(pages):
                        async for _session in pages:
                            await asyncio.sleep(0.05)  # a slow consumer: cancelled in here

            task = asyncio.ensure_future(walk())
            await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.sleep(random.uniform(0, _GAP))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert await stuck_in_transaction(watch_conn, database.app_role) == 0
            with use_scope(tenant):  # the pool's only connection is usable at once
                assert await store.count_sessions() == 3
        record("cancellation: walks cancelled twice mid-iteration", rounds)
