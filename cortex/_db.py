"""The transaction runner: the only way the store touches the database.

:func:`run_transaction` runs one transaction per call, the tenant bound for
row-level security with a transaction-local ``SET LOCAL`` (propagated to
Citus workers), rollback unless
the body returns, bounded retries of serialization failures and deadlocks,
and every driver error translated to a :class:`~cortex.errors.CortexError`.
The functions it runs never commit. Statements run through
:class:`cortex._executor.Tx`; engines come from :mod:`cortex._engine`.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import CancelledError
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, NamedTuple, TypeVar

import anyio
import asyncpg
from sqlalchemy.exc import MissingGreenlet
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool, PoolProxiedConnection, QueuePool
from sqlalchemy.util import greenlet_spawn

from cortex._engine import CHECKOUTS
from cortex._executor import NeedsTransaction, Routines, Row, Tx
from cortex._tables import TENANT_SETTING
from cortex.errors import (
    RETRYABLE_SQLSTATES,
    CortexError,
    DatabaseError,
    DatabaseUnavailable,
    sqlstate_of,
    translate,
    translate_errors,
)
from cortex.scope import Scope

__all__ = [
    "MAX_ATTEMPTS",
    "STALE_ERRORS",
    "Checkout",
    "Finished",
    "RetryTransaction",
    "begin_sql",
    "checkout",
    "discard_transaction",
    "finish",
    "release",
    "run_to_completion",
    "run_transaction",
]

log = logging.getLogger("cortex")

# Serialization failures and deadlocks are retried this many times in all; the
# backoff doubles from 5 ms so that two colliding transactions fall apart.
MAX_ATTEMPTS: Final = 5
_BACKOFF_SECONDS: Final = 0.005

T = TypeVar("T")


class _StaleConnection(Exception):
    """The connection failed before the transaction began; nothing was written.

    ``fresh``: the pool had just opened it, so a retry would only open another.
    """

    def __init__(self, *, fresh: bool) -> None:
        super().__init__("the connection failed at BEGIN")
        self.fresh = fresh


class Finished(Exception):
    """Not a failure: the transaction is done and is to be rolled back (a read-only snapshot)."""


class RetryTransaction(Exception):
    """Raised by a transaction body to be run again from the start on a new snapshot."""


async def run_transaction(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    *,
    custom_plans: bool = False,
    routines: Routines | None = None,
) -> T:
    """Run ``body`` in one transaction bound to ``scope``'s tenant; commit if it returns.

    ``routines`` (a body that writes with at most one statement): no
    transaction around the body; each statement is its own, through its
    installed routine in one round trip (cortex._routines), else in a
    transaction of its own. Its cancellation is that of one statement: a
    caller cancelled while the statement runs may find it committed, as
    when a cancel meets COMMIT.

    Concurrency: a serialization failure or deadlock rolls back and runs the
    whole body again (at most :data:`MAX_ATTEMPTS` times), so ``body`` must
    have no side effects outside the database. A pooled connection the server
    closed while it sat idle is dropped and the call runs on the next one,
    without using up those attempts, until a newly opened connection fails.

    Cancellation (an anyio cancel scope, ``task.cancel()``, any number of
    times): the caller gets its cancellation. The call either committed
    completely (the cancel arrived while COMMIT was in flight, which then
    completes) or wrote nothing, and the connection returns to the pool only
    when the server reports it outside any transaction; otherwise it is
    closed. A cancelled wait for a pooled connection returns at once.

    Raises:
        CortexError: every database-layer failure, translated, cause chained.
    """
    delay = _BACKOFF_SECONDS
    attempt = 1
    while True:
        try:
            with translate_errors():
                if routines is not None:
                    try:
                        return await _autocommit(engine, scope, body, custom_plans, routines)
                    except NeedsTransaction:
                        # Two statements without their routine: nothing ran;
                        # the same body, in a transaction.
                        routines = None
                return await _attempt(engine, scope, body, custom_plans)
        except _StaleConnection as exc:
            # Nothing was sent but BEGIN: safe to run again. Each stale pooled
            # connection is invalidated on the way out, so this ends when the
            # pool has handed out its dead ones; a new connection failing too
            # means the server is unreachable.
            if exc.fresh:
                mapped = translate(exc.__cause__) if exc.__cause__ is not None else None
                raise (mapped or DatabaseUnavailable("no usable database connection")) from (
                    exc.__cause__
                )
            log.debug("pooled connection was dead; retrying on the next one")
            continue
        except DatabaseError as exc:
            state = sqlstate_of(exc.__cause__) if exc.__cause__ is not None else None
            if state not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                raise
        except RetryTransaction:
            if attempt == MAX_ATTEMPTS:
                raise DatabaseError(
                    f"gave up after {MAX_ATTEMPTS} attempts: the transaction kept colliding"
                ) from None
        log.debug("retrying transaction (attempt %d)", attempt + 1)
        attempt += 1
        await anyio.sleep(delay)
        delay *= 2


def begin_sql(scope: Scope, *, custom_plans: bool, snapshot: bool = False) -> str:
    """BEGIN with the tenant binding, as one simple-protocol message.

    ``snapshot``: a REPEATABLE READ READ ONLY transaction (cortex._snapshot).
    """
    # One round trip: BEGIN and the tenant binding together (a bind parameter
    # would need the extended protocol and a second round trip). The tenant
    # is a validated scope segment ([A-Za-z0-9._:-], no quote), so the
    # literal cannot break out; quotes are doubled regardless.
    #
    # SET LOCAL, not set_config(): on a Citus coordinator,
    # citus.propagate_set_commands = 'local' makes the coordinator replay the
    # transaction's SET LOCALs on every worker connection it opens, so the
    # policies on the shards see the tenant too; set_config() is never
    # propagated. On plain PostgreSQL citus.* is an unreserved placeholder:
    # the first SET LOCAL is a no-op there. Both end with the transaction, so
    # a pooled connection (or a PgBouncer server connection in transaction
    # mode) never carries a tenant into the next transaction.
    tenant = scope.tenant.replace("'", "''")
    begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if snapshot else "BEGIN"
    sql = (
        f"{begin}; SET LOCAL citus.propagate_set_commands = 'local';"
        f" SET LOCAL {TENANT_SETTING} = '{tenant}'"
    )
    if custom_plans:
        # Searches: a term's selectivity decides the plan (a rare term wants
        # the trigram index, a common one the listing index), so a plan
        # cached for one term is wrong for the next (docs/query-plans.md, P4).
        sql += "; SET LOCAL plan_cache_mode = force_custom_plan"
    return sql


# What asyncpg raises before sending anything on a connection that is closed
# or mid-protocol (ConnectionDoesNotExistError, a subclass, may come after).
_NOT_SENT: Final = (asyncpg.InterfaceError, asyncpg.InternalClientError)

# What a connection the server closed while it sat in the pool raises at BEGIN.
STALE_ERRORS: Final = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


async def _attempt(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    custom_plans: bool,
) -> T:
    conn, driver, fresh, _, _ = await checkout(engine)
    # From here every path ends in release (through _commit or
    # discard_transaction), run to completion in a task of its own: a cancel
    # that lands during the rollback (asyncio can cancel a task twice) must
    # not send the connection back to the pool inside a transaction.
    try:
        # Row-level security reads the tenant setting; it lives until
        # COMMIT/ROLLBACK only, so a pooled connection never carries a
        # tenant into its next checkout.
        try:
            await driver.execute(begin_sql(scope, custom_plans=custom_plans))
        except STALE_ERRORS as exc:
            # A pooled connection the server closed while it sat idle (a
            # restart, an idle timeout, a managed database reaping it).
            raise _StaleConnection(fresh=fresh) from exc
        result = await body(Tx(driver))
    except BaseException as failure:
        await run_to_completion(discard_transaction(conn, driver, failure))
        raise
    await run_to_completion(_commit(conn, driver))
    return result


async def _autocommit(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    custom_plans: bool,
    routines: Routines,
) -> T:
    held = await checkout(engine)
    conn, driver, fresh = held.conn, held.driver, held.fresh
    if driver.is_closed():
        # The server closed it while it sat in the pool; nothing was sent.
        await run_to_completion(release(conn, driver, trusted=False))
        raise _StaleConnection(fresh=fresh)

    async def own_transaction(sql: str, args: list[Any]) -> list[Row]:
        await driver.execute(begin_sql(scope, custom_plans=custom_plans))
        rows: list[Row] = await driver.fetch(sql, *args, record_class=Row)
        await driver.execute("COMMIT")
        return rows

    tx = Tx(driver, routines, own_transaction)
    try:
        result = await body(tx)
    except _NOT_SENT as failure:
        if tx.completed or isinstance(failure, asyncpg.ConnectionDoesNotExistError):
            await run_to_completion(discard_transaction(conn, driver, failure))
            raise
        # asyncpg refused to send the first statement on a connection the
        # server had closed (or left mid-protocol): nothing ran, run it again.
        await run_to_completion(release(conn, driver, trusted=False))
        raise _StaleConnection(fresh=fresh) from failure
    except (CortexError, NeedsTransaction) as failure:
        # Raised by cortex between statements (NotFound, Conflict): the
        # protocol is idle, and outside any transaction unless a fallback
        # transaction failed half-way.
        if driver.is_in_transaction() or driver.is_closed():
            await run_to_completion(discard_transaction(conn, driver, failure))
        else:
            await finish(held)
        raise
    except BaseException as failure:
        await run_to_completion(discard_transaction(conn, driver, failure))
        raise
    await finish(held)
    return result


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
    never does. Two greenlet hops were a fifth of a call's client CPU
    (docs/benchmarks.md).
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


async def _commit(conn: PoolProxiedConnection, driver: asyncpg.Connection) -> None:
    try:
        await driver.execute("COMMIT")
    except BaseException as failure:
        await discard_transaction(conn, driver, failure)
        raise
    await release(conn, driver, trusted=True)


async def discard_transaction(
    conn: PoolProxiedConnection, driver: asyncpg.Connection, failure: BaseException
) -> None:
    """Roll back after ``failure``, then release the connection (see :func:`release`).

    An error PostgreSQL reported (or one cortex raised, or a cancellation,
    which asyncpg recovers from by cancelling the statement on the server)
    leaves the protocol in order: ROLLBACK. Anything else (a lost socket, a
    client-side protocol error) means its state is unknown: no ROLLBACK, the
    connection is closed. ROLLBACK is sent unconditionally on the first path
    because after a cancelled statement the client-side transaction status
    lags the server's until asyncpg has settled the cancel, which it does
    before sending the ROLLBACK.
    """
    orderly = isinstance(
        failure, asyncpg.PostgresError | CortexError | RetryTransaction | CancelledError | Finished
    ) and not isinstance(failure, asyncpg.PostgresConnectionError)
    rolled_back = False
    if orderly and not driver.is_closed():
        try:
            await driver.execute("ROLLBACK")
        except Exception:  # the driver may raise anything on a dying socket
            log.debug("rollback failed; dropping the connection", exc_info=True)
        else:
            rolled_back = True
    await release(conn, driver, trusted=rolled_back)


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
