"""A read-only snapshot transaction held across the pages of one iteration.

:func:`read_snapshot` checks out one pooled connection, opens
``REPEATABLE READ READ ONLY`` with the tenant bound, and runs each page's
statement in that one snapshot until the walk ends, is closed, or is garbage
collected. Every page then sees the same committed state: a session that gets
a message during the walk keeps its place in the order the walk follows.
Read-only repeatable-read transactions never fail serialization, so there is
nothing to retry after the first statement. This module runs reads only:
nothing here writes or commits data.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import anyio
import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cortex._executor import Tx
from cortex._tables import TENANT_SETTING
from cortex.errors import DatabaseUnavailable, translate_errors
from cortex.scope import Scope

__all__ = ["Snapshot", "read_snapshot"]

log = logging.getLogger("cortex")

T = TypeVar("T")

# A pooled connection the server closed while idle fails at BEGIN; nothing
# was read yet, so a fresh connection is tried, this many times in all.
_CONNECT_ATTEMPTS: Final = 5


class Snapshot:
    """The open snapshot: run page statements in it."""

    def __init__(self, driver: asyncpg.Connection) -> None:
        self._tx = Tx(driver)

    async def run(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """Run one read in the snapshot; database errors come out translated.

        Raises:
            CortexError: every database-layer failure, cause chained.
        """
        with translate_errors():
            return await body(self._tx)


def _begin_sql(scope: Scope, *, custom_plans: bool) -> str:
    # The tenant is a validated scope segment ([A-Za-z0-9._:-]); quotes are
    # doubled regardless. The setting is transaction-local, as in cortex._db.
    tenant = scope.tenant.replace("'", "''")
    sql = (
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;"
        f" SELECT set_config('{TENANT_SETTING}', '{tenant}', true)"
    )
    if custom_plans:
        sql += "; SET LOCAL plan_cache_mode = force_custom_plan"
    return sql


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, asyncpg.Connection):
        raise DatabaseUnavailable("the pooled connection has no live asyncpg connection")
    return raw


async def _open(
    engine: AsyncEngine, scope: Scope, custom_plans: bool
) -> tuple[AsyncConnection, asyncpg.Connection]:
    for attempt in range(1, _CONNECT_ATTEMPTS + 1):
        with translate_errors():
            with anyio.CancelScope(shield=True):  # see cortex._db: no half-open checkout
                conn = await engine.connect()
            try:
                driver = await _driver(conn)
                await driver.execute(_begin_sql(scope, custom_plans=custom_plans))
            except (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                OSError,
            ):
                await _drop(conn)
                if attempt == _CONNECT_ATTEMPTS:
                    raise DatabaseUnavailable("no usable database connection") from None
                log.debug("pooled connection was dead; opening the snapshot on a new one")
                continue
            except BaseException:
                await _drop(conn)
                raise
            return conn, driver
    raise AssertionError("unreachable")  # pragma: no cover


async def _drop(conn: AsyncConnection) -> None:
    """Take a connection whose state is unknown out of the pool."""
    with anyio.CancelScope(shield=True):
        try:
            await conn.invalidate()
        except Exception:  # the pool drops it either way
            log.debug("invalidate failed", exc_info=True)
        try:
            await conn.close()
        except Exception:
            log.debug("close failed", exc_info=True)


async def _close(conn: AsyncConnection, driver: asyncpg.Connection) -> None:
    """End the snapshot; the connection goes back to the pool only if it is outside a transaction."""
    with anyio.CancelScope(shield=True):
        try:
            if not driver.is_closed():
                await driver.execute("ROLLBACK")  # read only: nothing to keep
            clean = not driver.is_closed() and not driver.is_in_transaction()
        except BaseException:  # a second cancellation, a dying socket: trust nothing
            clean = False
        if not clean:
            await _drop(conn)
            return
        try:
            await conn.close()
        except Exception:
            log.debug("close failed", exc_info=True)


@asynccontextmanager
async def read_snapshot(
    engine: AsyncEngine, scope: Scope, *, custom_plans: bool = False
) -> AsyncIterator[Snapshot]:
    """Hold one REPEATABLE READ READ ONLY transaction, tenant bound, for the block.

    Exit (normal, error, cancellation, or the generator around it being
    closed or collected) rolls back and returns the connection to the pool,
    or discards it if its state cannot be confirmed.

    Raises:
        DatabaseUnavailable: no connection could begin the snapshot.
    """
    conn, driver = await _open(engine, scope, custom_plans)
    try:
        yield Snapshot(driver)
    finally:
        await _close(conn, driver)
