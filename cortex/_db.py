"""The transaction runner: the only way the store touches the database.

:func:`run_transaction` runs one transaction per call, the tenant bound for
row-level security with a transaction-local ``set_config``, rollback unless
the body returns, bounded retries of serialization failures and deadlocks,
and every driver error translated to a :class:`~cortex.errors.CortexError`.
The functions it runs never commit. Statements run through
:class:`cortex._executor.Tx`; engines come from :mod:`cortex._engine`.
"""

from __future__ import annotations

import logging
from asyncio import CancelledError
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import anyio
import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cortex._executor import Tx
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

__all__ = ["MAX_ATTEMPTS", "RetryTransaction", "run_transaction"]

log = logging.getLogger("cortex")

# Serialization failures and deadlocks are retried this many times in all; the
# backoff doubles from 5 ms so that two colliding transactions fall apart.
MAX_ATTEMPTS: Final = 5
_BACKOFF_SECONDS: Final = 0.005

T = TypeVar("T")


class _StaleConnection(Exception):
    """The connection failed before the transaction began; nothing was written."""


class RetryTransaction(Exception):
    """Raised by a transaction body to be run again from the start on a new snapshot."""


async def run_transaction(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    *,
    custom_plans: bool = False,
) -> T:
    """Run ``body`` in one transaction bound to ``scope``'s tenant; commit if it returns.

    Concurrency: a serialization failure or deadlock rolls back and runs the
    whole body again (at most :data:`MAX_ATTEMPTS` times), so ``body`` must
    have no side effects outside the database. Cancellation of the caller
    rolls back; cleanup and COMMIT are shielded from it, so a cancelled call
    either committed completely or wrote nothing, and the pooled connection
    is returned clean or discarded, never poisoned.

    Raises:
        CortexError: every database-layer failure, translated, cause chained.
    """
    delay = _BACKOFF_SECONDS
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with translate_errors():
                return await _attempt(engine, scope, body, custom_plans)
        except DatabaseError as exc:
            state = sqlstate_of(exc.__cause__) if exc.__cause__ is not None else None
            if state not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                raise
        except RetryTransaction:
            if attempt == MAX_ATTEMPTS:
                raise DatabaseError(
                    f"gave up after {MAX_ATTEMPTS} attempts: the transaction kept colliding"
                ) from None
        except _StaleConnection as exc:
            # Nothing was sent but BEGIN: safe to run again on a fresh connection.
            if attempt == MAX_ATTEMPTS:
                mapped = translate(exc.__cause__) if exc.__cause__ is not None else None
                raise (mapped or DatabaseUnavailable("no usable database connection")) from (
                    exc.__cause__
                )
            log.debug("pooled connection was dead; retrying on a new one")
            continue
        log.debug("retrying transaction (attempt %d)", attempt)
        await anyio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, asyncpg.Connection):
        raise DatabaseUnavailable("the pooled connection has no live asyncpg connection")
    return raw


def _begin_sql(scope: Scope, *, custom_plans: bool) -> str:
    # One simple-protocol round trip: BEGIN and the tenant binding together
    # (a bind parameter would need the extended protocol and a second round
    # trip). The tenant is a validated scope segment ([A-Za-z0-9._:-], no
    # quote), so the literal cannot break out; quotes are doubled regardless.
    tenant = scope.tenant.replace("'", "''")
    sql = f"BEGIN; SELECT set_config('{TENANT_SETTING}', '{tenant}', true)"
    if custom_plans:
        # Searches: a term's selectivity decides the plan (a rare term wants
        # the trigram index, a common one the listing index), so a plan
        # cached for one term is wrong for the next (docs/query-plans.md, P4).
        sql += "; SET LOCAL plan_cache_mode = force_custom_plan"
    return sql


async def _attempt(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    custom_plans: bool,
) -> T:
    # Checkout is shielded: cancelling it mid-handshake would tear down a
    # half-open connection (asyncpg then reports a lost connection on a
    # future nobody awaits). A cancelled caller instead waits for the
    # checkout, bounded by pool_timeout and the connect timeout, then rolls
    # back cleanly at its next await.
    with anyio.CancelScope(shield=True):
        conn = await engine.connect()
    try:
        driver = await _driver(conn)
        try:
            # Row-level security reads the tenant setting; it lives until
            # COMMIT/ROLLBACK only, so a pooled connection never carries a
            # tenant into its next checkout.
            try:
                await driver.execute(_begin_sql(scope, custom_plans=custom_plans))
            except (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                OSError,
            ) as exc:
                # A pooled connection the server closed while it sat idle (a
                # restart, an idle timeout, a managed database reaping it).
                raise _StaleConnection from exc
            result = await body(Tx(driver))
            with anyio.CancelScope(shield=True):
                await driver.execute("COMMIT")
        except BaseException as failure:
            with anyio.CancelScope(shield=True):
                await _discard_transaction(conn, driver, failure)
            raise
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()
    return result


async def _discard_transaction(
    conn: AsyncConnection, driver: asyncpg.Connection, failure: BaseException
) -> None:
    """Roll back after ``failure``; a connection that cannot be trusted leaves the pool.

    An error PostgreSQL reported (or one cortex raised, or a cancellation,
    which asyncpg recovers from) leaves the protocol in order: ROLLBACK, and
    the connection goes back to the pool. Anything else (a lost socket, a
    client-side protocol error) means its state is unknown: terminate it and
    let the pool open a new one. ROLLBACK is sent unconditionally on the first
    path because after a cancelled statement the client-side transaction
    status can lag the server's.
    """
    orderly = isinstance(
        failure, asyncpg.PostgresError | CortexError | RetryTransaction | CancelledError
    ) and not isinstance(failure, asyncpg.PostgresConnectionError)
    if orderly and not driver.is_closed():
        try:
            await driver.execute("ROLLBACK")
        except Exception:  # the driver may raise anything on a dying socket
            log.debug("rollback failed; dropping the connection", exc_info=True)
        else:
            return
    try:
        driver.terminate()
    except Exception:  # already gone
        log.debug("terminate failed", exc_info=True)
    try:
        await conn.invalidate()
    except Exception:  # the pool drops it either way
        log.debug("invalidate failed", exc_info=True)
