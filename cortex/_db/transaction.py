"""The transaction runner: the only way the store touches the database.

:func:`run_transaction` runs one transaction per call, the tenant bound for
row-level security with a transaction-local ``SET LOCAL`` (propagated to
Citus workers), rollback unless
the body returns, bounded retries of serialization failures and deadlocks,
and every driver error translated to a :class:`~cortex.errors.CortexError`.
The functions it runs never commit. Statements run through
:class:`cortex._db.executor.Tx`; connections come from :mod:`cortex._db.pool`,
engines from :mod:`cortex._db.engine`.
"""

from __future__ import annotations

import logging
from asyncio import CancelledError
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from cortex._db.executor import NeedsTransaction, Routines, Row, Tx
from cortex._db.pool import Checkout, checkout, finish, release, run_to_completion
from cortex._sql.tables import TENANT_SETTING
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
    "Finished",
    "RetryTransaction",
    "begin_sql",
    "discard_transaction",
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
    installed routine in one round trip (cortex._db.routines), else in a
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

    ``snapshot``: a REPEATABLE READ READ ONLY transaction (cortex._db.snapshot).
    """
    # A literal, not a bind, keeps it one round trip: the tenant is a validated
    # scope segment (no quote), and quotes are doubled regardless.
    # SET LOCAL, not set_config(), because Citus replays SET LOCALs on its worker
    # connections (docs/citus.md, "The tenant binding"); both end with the transaction.
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
    held = await checkout(engine)
    conn, driver, fresh = held.conn, held.driver, held.fresh
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
    await run_to_completion(_commit(held))
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


async def _commit(held: Checkout) -> None:
    try:
        await held.driver.execute("COMMIT")
    except BaseException as failure:
        await discard_transaction(held.conn, held.driver, failure)
        raise
    await finish(held)


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
