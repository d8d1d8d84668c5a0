"""What one cortex statement did, read from its transaction's own statistics: counted, not timed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from cortex._db.executor import Tx
from cortex._db.transaction import begin_sql
from cortex.scope import Scope


async def counted(
    app_conn: asyncpg.Connection, scope: Scope, call: Callable[[Tx], Awaitable[Any]], probe: str
) -> int:
    """Run ``call`` as the application role bound to ``scope``, then ``probe`` in the same transaction.

    ``probe`` is one query of a transaction-level statistic (for instance
    ``pg_stat_get_xact_blocks_fetched``), which sees what ``call`` did and
    nothing else; the transaction is rolled back.
    """
    await app_conn.execute(begin_sql(scope, custom_plans=False))
    try:
        await call(Tx(app_conn))
        return int(await app_conn.fetchval(probe))
    finally:
        await app_conn.execute("ROLLBACK")
