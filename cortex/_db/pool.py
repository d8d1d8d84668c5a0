"""Connections out of the pool and back: checkout, finish, release, cleanups run to completion.

A checkout of an idle, live connection takes no I/O and no greenlet; any
other runs in a task of its own that a cancelled caller abandons. A
connection goes back to the pool only when it is known to be outside any
transaction; otherwise it is closed. :mod:`cortex._db.transaction` runs the
transactions on these connections.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import CancelledError
from collections.abc import Coroutine
from typing import Any, NamedTuple

import anyio
import asyncpg
from sqlalchemy.exc import MissingGreenlet
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool, PoolProxiedConnection, QueuePool
from sqlalchemy.util import greenlet_spawn

from cortex._db.engine import CHECKOUTS
from cortex.errors import DatabaseUnavailable

__all__ = [
    "Checkout",
    "checkout",
    "finish",
    "release",
    "run_to_completion",
]

log = logging.getLogger("cortex")


class Checkout(NamedTuple):
    conn: PoolProxiedConnection  # the pool's handle on the connection
    driver: asyncpg.Connection
    fresh: bool  # the pool opened it for this checkout
    engine: AsyncEngine
    pool: Pool  # the engine's pool when the checkout began


async def checkout(engine: AsyncEngine) -> Checkout:
    """A pooled connection, its asyncpg connection, and whether the pool just opened it.

    An idle connection that is open and current is taken at once, with no
    I/O and no await (:func:`_next_idle_is_live`). Any other checkout may
    open a connection, so it runs in a task of its own and is never
    cancelled: cancelling it mid-handshake would tear down a half-open
    connection (asyncpg then reports a lost connection on a future nobody
    awaits). The caller, though,
    is free to leave: a cancelled caller returns at once, and the checkout it
    abandoned puts its connection straight back into the pool when it arrives.
    """
    pool = engine.sync_engine.pool
    if _idle_waiting(pool) and _next_idle_is_live(pool):
        # An idle connection that is open and current: taken with no I/O, so
        # nothing can interrupt the checkout half-way, and without a greenlet.
        taken = _take_idle(pool)
        if taken is not None:
            return await _checked(engine, pool, taken)
    task = asyncio.ensure_future(_open(engine))
    # Held until it ends: asyncio keeps only a weak reference to a task, and
    # once its caller has left, a checkout collected mid-connect would close
    # its half-open socket from a finalizer.
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    try:
        return await asyncio.shield(task)
    except CancelledError:
        # The checkout may even have finished already: _abandon runs either way.
        task.add_done_callback(_abandon)
        raise


def _idle_waiting(pool: Pool) -> bool:
    """Whether a checkout takes an idle connection without touching the network.

    True for cortex's queue pool holding an idle connection, without a
    pre-ping or recycling (either may send or reconnect at checkout).
    """
    return (
        isinstance(pool, QueuePool)
        and pool.checkedin() > 0
        and getattr(pool, "_pre_ping", True) is False
        and getattr(pool, "_recycle", 0) < 0
    )


def _next_idle_is_live(pool: Pool) -> bool:
    """Whether the idle connection the pool hands out next is open and current.

    Then taking it needs no I/O. SQLAlchemy reopens a slot at checkout when
    its connection was dropped (by cortex, or by SQLAlchemy itself on a
    disconnect or a garbage-collected checkout) or predates an invalidation
    of the pool or of the slot; that reconnect must run in a greenlet, in
    the checkout's own task. This reads the record at the head of the pool's
    queue (the tail with ``use_lifo``) and the times
    ``_ConnectionRecord.get_connection`` compares; anything it does not
    recognise (another pool or queue class) counts as not live.
    """
    adapted = getattr(pool, "_pool", None)
    queue = getattr(adapted, "_queue", None)
    waiting = getattr(queue, "_queue", None)
    if not isinstance(queue, asyncio.Queue) or not waiting:
        return False
    record = waiting[-1] if isinstance(queue, asyncio.LifoQueue) else waiting[0]
    started = getattr(record, "starttime", None)
    invalidated = getattr(pool, "_invalidate_time", None)
    soft = getattr(record, "_soft_invalidate_time", None)
    return (
        getattr(record, "dbapi_connection", None) is not None
        and isinstance(started, int | float)
        and isinstance(invalidated, int | float)
        and isinstance(soft, int | float)
        and invalidated <= started
        and soft <= started
    )


def _take_idle(pool: Pool) -> PoolProxiedConnection | None:
    """The live idle connection :func:`_next_idle_is_live` saw, checked out without a greenlet.

    SQLAlchemy's asyncio pool runs a checkout in a greenlet so that it may
    await the network; taking an open, current connection from its queue
    never does, so the greenlet's cost is saved (docs/benchmarks.md).
    """
    try:
        return pool.connect()
    except MissingGreenlet:  # never expected: SQLAlchemy puts the slot back
        log.debug("an idle checkout needed I/O", exc_info=True)
        return None


def _returns_quietly(pool: Pool) -> bool:
    """Whether a clean connection goes back into the pool without I/O (no overflow to close)."""
    return isinstance(pool, QueuePool) and pool.checkedin() < pool.size()


async def _open(engine: AsyncEngine) -> Checkout:
    # The pool itself, not engine.connect(): no Connection object and one
    # greenlet hop instead of two (cortex sends nothing through SQLAlchemy).
    pool = engine.sync_engine.pool
    return await _checked(engine, pool, await greenlet_spawn(pool.connect))


async def _checked(engine: AsyncEngine, pool: Pool, conn: PoolProxiedConnection) -> Checkout:
    """The checkout of ``conn``, which the pool just handed out; it is given back if unusable."""
    try:
        driver = _driver(conn.driver_connection)
    except BaseException:
        await greenlet_spawn(conn.invalidate)
        await greenlet_spawn(conn.close)
        raise
    # No count (an engine not built by make_engine): treat it as new, so a
    # failing BEGIN is reported rather than retried.
    return Checkout(conn, driver, conn.info.get(CHECKOUTS, 1) == 1, engine, pool)


async def finish(checkout: Checkout) -> None:
    """Return a connection after a call that completed: to the pool if idle, else closed.

    Inline (no task) when that cannot suspend: an idle connection going back
    into a pool with room for it, which touches no network; otherwise run
    to completion, whatever cancels the caller.
    """
    conn, driver = checkout.conn, checkout.driver
    if (
        not driver.is_closed()
        and not driver.is_in_transaction()
        and _returns_quietly(checkout.pool)
        and checkout.engine.sync_engine.pool is checkout.pool
    ):
        if _resets_quietly(conn):
            # The reset is a no-op and the slot is free: no I/O, no greenlet.
            conn.close()
        else:
            await greenlet_spawn(conn.close)
        return
    await run_to_completion(release(conn, driver, trusted=True))


def _resets_quietly(conn: PoolProxiedConnection) -> bool:
    """Whether checking ``conn`` in resets it without I/O: SQLAlchemy began no transaction on it.

    The pool's reset-on-return rolls back through SQLAlchemy's asyncpg adapter,
    which only awaits the driver when it began a transaction itself; cortex
    sends its own BEGIN and COMMIT, so it never has.
    """
    adapted = conn.dbapi_connection
    return (
        adapted is not None
        and getattr(adapted, "_transaction", True) is None
        and getattr(adapted, "_started", False) is False
    )


def _driver(driver: Any) -> asyncpg.Connection:
    if not isinstance(driver, asyncpg.Connection):
        raise DatabaseUnavailable("the pooled connection has no live asyncpg connection")
    return driver


def _abandon(task: asyncio.Future[Checkout]) -> None:
    """Give an abandoned checkout's connection back; nothing was sent on it."""
    if task.cancelled():  # only the event loop shutting down cancels it
        return
    if (error := task.exception()) is not None:
        log.debug("abandoned checkout failed", exc_info=error)
        return
    _background(_give_back(task.result()))


async def _give_back(checkout: Checkout) -> None:
    if checkout.engine.sync_engine.pool is not checkout.pool:
        # The engine was disposed meanwhile (the store closed): a connection
        # checked in to the old pool would stay open with nobody to close it.
        await greenlet_spawn(checkout.conn.invalidate)
    await greenlet_spawn(checkout.conn.close)


# Cleanups still running after their caller was interrupted by something other
# than a cancellation: held here so the event loop does not drop them.
_BACKGROUND: set[asyncio.Future[Any]] = set()


def _background(coro: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_settled)


def _settled(task: asyncio.Future[Any]) -> None:
    _BACKGROUND.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.debug("background cleanup failed", exc_info=error)


async def run_to_completion(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run ``cleanup`` to its end whatever cancels the caller, then deliver the cancellation.

    The anyio shield stops anyio cancel scopes; it cannot stop
    ``task.cancel()``, which asyncio code (``asyncio.timeout``, TaskGroup
    teardown, a second cancel of the same task) calls directly. So the
    cleanup runs in a task of its own, which no cancellation of the caller
    reaches, and the caller waits for it, absorbing every cancel meanwhile
    and re-raising the last one afterwards (so ``asyncio.timeout`` and task
    groups still see theirs).
    """
    task = asyncio.ensure_future(cleanup)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    cancelled: CancelledError | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                # Unlike awaiting the task, wait() never cancels it.
                await asyncio.wait((task,))
            except CancelledError as exc:
                cancelled = exc  # the caller's: keep waiting, deliver it afterwards
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # read it, so asyncio does not log it: the cancellation wins
        raise cancelled
    task.result()  # the cleanup's own error, if any


async def release(
    conn: PoolProxiedConnection, driver: asyncpg.Connection, *, trusted: bool
) -> None:
    """Return the connection to the pool if it is known to be outside any transaction; else close it.

    ``trusted``: the last statement cortex sent on it (COMMIT or ROLLBACK)
    completed, so the protocol is idle and asyncpg's transaction status is
    the one the server reported in its last ReadyForQuery. Under AUTOCOMMIT
    the pool's reset-on-return sends nothing, so this check is the only thing
    that keeps an open transaction (and its locks, and its uncommitted rows)
    from reaching the next checkout.
    """
    if trusted and not driver.is_closed() and not driver.is_in_transaction():
        await greenlet_spawn(conn.close)
        return
    try:
        driver.terminate()
    except Exception:  # already gone
        log.debug("terminate failed", exc_info=True)
    try:
        await greenlet_spawn(conn.invalidate)
        await greenlet_spawn(conn.close)
    except Exception:  # the pool drops it either way
        log.debug("invalidate failed", exc_info=True)
