"""Helpers for the fault tests: a held row lock, what is really stored, what the server sees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg


@asynccontextmanager
async def row_locked(owner_conn: asyncpg.Connection, tenant: str) -> AsyncIterator[None]:
    """Hold the tenant's session rows locked, so an append blocks on them."""
    tx = owner_conn.transaction()
    await tx.start()
    await owner_conn.execute("SELECT 1 FROM sessions WHERE tenant_id = $1 FOR UPDATE", tenant)
    try:
        yield
    finally:
        await tx.rollback()


async def stored_counts(owner_conn: asyncpg.Connection, tenant: str) -> tuple[int, int]:
    """The tenant's summed ``message_count`` and its number of message rows."""
    count = await owner_conn.fetchval(
        "SELECT coalesce(sum(message_count), 0) FROM sessions WHERE tenant_id = $1", tenant
    )
    rows = await owner_conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant)
    return int(count), int(rows)


async def stuck_in_transaction(watch_conn: asyncpg.Connection, role: str) -> int:
    """Connections of ``role`` sitting idle inside an open or failed transaction."""
    return int(
        await watch_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 "
            "AND state IN ('idle in transaction', 'idle in transaction (aborted)')",
            role,
        )
    )


async def wait_for_lock_waiter(watch_conn: asyncpg.Connection, role: str) -> None:
    """Return once a backend of ``role`` waits on a lock.

    ``watch_conn`` must not be inside a transaction: pg_stat_activity is a
    snapshot taken once per transaction.
    """
    for _ in range(5000):  # a backend that waits on a lock shows within milliseconds
        if await watch_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'",
            role,
        ):
            return
        await anyio.sleep(0.002)
    raise AssertionError(f"no backend of {role} ever waited on a lock")


async def wait_until_no_backends(watch_conn: asyncpg.Connection, role: str) -> None:
    """Return once the server has no connection of ``role`` left."""
    for _ in range(500):
        if not await watch_conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role
        ):
            return
        await anyio.sleep(0.02)
    raise AssertionError(f"connections of {role} were never reaped")
