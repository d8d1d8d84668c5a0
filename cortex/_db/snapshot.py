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
from typing import TypeVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from cortex._db.executor import Tx
from cortex._db.pool import checkout, release, run_to_completion
from cortex._db.transaction import STALE_ERRORS, Finished, begin_sql, discard_transaction
from cortex.errors import DatabaseUnavailable, translate, translate_errors
from cortex.scope import Scope

__all__ = ["Snapshot", "read_snapshot"]

log = logging.getLogger("cortex")

T = TypeVar("T")


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


async def _open(
    engine: AsyncEngine, scope: Scope, custom_plans: bool
) -> tuple[PoolProxiedConnection, asyncpg.Connection]:
    """Check out a connection and begin the snapshot on it.

    The checkout, the stale-connection rule and every cleanup are the
    transaction runner's own (cortex._db.pool, cortex._db.transaction): a pooled connection the server
    closed while idle is dropped and the next tried, until one the pool just
    opened fails; cleanup runs to completion whatever cancels the caller, and
    a connection returns to the pool only outside any transaction.
    """
    sql = begin_sql(scope, custom_plans=custom_plans, snapshot=True)
    while True:
        with translate_errors():
            conn, driver, fresh, _, _ = await checkout(engine)
        try:
            await driver.execute(sql)
        except STALE_ERRORS as exc:
            await run_to_completion(release(conn, driver, trusted=False))
            if fresh:
                raise (
                    translate(exc) or DatabaseUnavailable("no usable database connection")
                ) from exc
            log.debug("pooled connection was dead; opening the snapshot on a new one")
            continue
        except BaseException as failure:
            await run_to_completion(discard_transaction(conn, driver, failure))
            with translate_errors():
                raise
        return conn, driver


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
        await run_to_completion(discard_transaction(conn, driver, Finished()))
