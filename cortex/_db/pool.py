"""Connections out of the pool and back: checkout, finish, release, cleanups run to completion.

A store's pool holds its idle connections for cortex's calls, which take
one and give it back with no I/O and no greenlet; any other checkout runs
through SQLAlchemy's pool in a task of its own that a cancelled caller
abandons. A
connection is kept or goes back to the pool only when it is known to be
outside any transaction; otherwise it is closed. :mod:`cortex._db.transaction` runs the
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
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import AsyncAdaptedQueuePool, Pool, PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from cortex._db.engine import CHECKOUTS
from cortex.errors import DatabaseUnavailable

__all__ = [
    "Checkout",
    "HoldingPool",
    "checkout",
    "drop_held_on_disconnect",
    "finish",
    "holding_options",
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


class HoldingPool(AsyncAdaptedQueuePool):
    """SQLAlchemy's asyncio queue pool, whose idle connections cortex may hold between calls.

    cortex's calls take and give back a held connection in plain Python, with
    no greenlet and no I/O; SQLAlchemy's own checkout and return each need a
    greenlet hop. Any checkout through the pool first gets a held connection
    back, so nothing else using the engine waits on one, and the pool's
    counters report held connections as checked in.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[tuple[PoolProxiedConnection, asyncpg.Connection]] = []
        self.waiting = 0  # checkouts inside connect(), which a returning call must not starve

    def connect(self) -> PoolProxiedConnection:
        if self.held:
            self.held.pop()[0].close()  # into the queue, for this checkout
        self.waiting += 1
        try:
            return super().connect()
        finally:
            self.waiting -= 1

    def hold(self, conn: PoolProxiedConnection, driver: asyncpg.Connection) -> bool:
        """Keep ``conn`` (outside any transaction) for the next call, if nothing waits for it."""
        if self.waiting or len(self.held) + super().checkedin() >= self.size():
            return False
        self.held.append((conn, driver))
        return True

    def release_held(self) -> list[PoolProxiedConnection]:
        released = [conn for conn, _ in self.held]
        self.held.clear()
        return released

    def dispose(self) -> None:
        for conn in self.release_held():
            conn.close()  # checked in, so the pool's dispose closes it
        super().dispose()

    def checkedin(self) -> int:
        return super().checkedin() + len(self.held)

    def checkedout(self) -> int:
        return super().checkedout() - len(self.held)


# SQLAlchemy names a pool's logger after its class's module: under sqlalchemy.pool,
# echo_pool and the sqlalchemy.pool logger cover this pool as they do their own.
HoldingPool.__module__ = "sqlalchemy.pool"


def holding_options(pool_options: dict[str, Any]) -> dict[str, Any]:
    """``pool_options`` with :class:`HoldingPool`, unless they ask for work at checkout.

    Pre-ping and recycling act in SQLAlchemy's checkout, which a held
    connection skips; another pool class is the caller's choice.
    """
    if (
        pool_options.get("pool_pre_ping")
        or pool_options.get("pool_recycle", -1) >= 0
        or "poolclass" in pool_options
        or "pool" in pool_options
        or "creator" in pool_options
    ):
        return pool_options
    return {**pool_options, "poolclass": HoldingPool}


def drop_held_on_disconnect(engine: AsyncEngine) -> None:
    """Close held connections when SQLAlchemy sees a disconnect, as it does its pool's."""
    event.listen(engine.sync_engine, "handle_error", _on_error)


def _on_error(context: ExceptionContext) -> None:
    pool = context.engine.pool if context.engine is not None else None
    if (
        context.is_disconnect
        and context.invalidate_pool_on_disconnect
        and isinstance(pool, HoldingPool)
    ):
        for conn in pool.release_held():
            _background(_discard(conn))


async def _discard(conn: PoolProxiedConnection) -> None:
    await greenlet_spawn(conn.invalidate)
    await greenlet_spawn(conn.close)


async def checkout(engine: AsyncEngine) -> Checkout:
    """A pooled connection, its asyncpg connection, and whether the pool just opened it.

    A connection cortex holds idle and that is still open is taken at once,
    with no I/O and no await. Any other checkout goes through SQLAlchemy's
    pool, which may open a connection, so it runs in a task of its own and is
    never cancelled: cancelling it mid-handshake would tear down a half-open
    connection. The caller, though, is free to leave: a cancelled caller
    returns at once, and the checkout it abandoned puts its connection
    straight back into the pool when it arrives.
    """
    pool = engine.sync_engine.pool
    if isinstance(pool, HoldingPool):
        while pool.held:
            conn, driver = pool.held.pop()
            if not driver.is_closed():
                return Checkout(conn, driver, False, engine, pool)
            # The server closed it while it sat idle: its pool slot is freed first.
            await run_to_completion(_discard(conn))
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
    """Return a connection after a call that completed: held for the next call, pooled, or closed.

    A connection outside any transaction is held by the pool for the next
    call (no I/O) when nothing waits for it (:class:`HoldingPool`); anything
    else runs to completion whatever cancels the caller.
    """
    conn, driver, pool = checkout.conn, checkout.driver, checkout.pool
    if (
        isinstance(pool, HoldingPool)
        and checkout.engine.sync_engine.pool is pool
        and not driver.is_closed()
        and not driver.is_in_transaction()
        and pool.hold(conn, driver)
    ):
        return
    await run_to_completion(release(conn, driver, trusted=True))


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
