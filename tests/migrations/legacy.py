"""Helpers for migration tests: raw SQL as the owner, and the legacy release's own statements."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from tests.conftest import admin, asyncpg_dsn, with_database

T0 = datetime(2026, 7, 1, tzinfo=UTC)

# What the legacy release (schema 20260801000001) sends: it knows only these columns.
LEGACY_INSERT = (
    "INSERT INTO messages (id, agent_id, scope, role, content, created_at) "
    "VALUES (gen_random_uuid(), $1, $2, $3, $4, $5)"
)
LEGACY_READ = (
    "SELECT id, role, content, created_at FROM messages "
    "WHERE agent_id = $1 AND scope = $2 ORDER BY created_at, id"
)


def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def execute(url: str, *statements: str) -> None:
    asyncio.run(admin(url, *statements))


def current(url: str) -> list[str]:
    return [r["version_num"] for r in fetch(url, "SELECT version_num FROM alembic_version")]


def insert_legacy(url: str, rows: Sequence[tuple[str, str, str, str]], *, start: int = 0) -> None:
    """Insert legacy messages (agent_id, scope, role, content) as the legacy release does.

    They are a minute apart, from ``start`` minutes after T0.
    """

    async def run() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.executemany(
                LEGACY_INSERT,
                [
                    (a, s, r, c, T0 + timedelta(minutes=start + i))
                    for i, (a, s, r, c) in enumerate(rows)
                ],
            )
        finally:
            await conn.close()

    asyncio.run(run())


@contextmanager
def plain_owner_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A new database owned by a role that is neither superuser nor BYPASSRLS.

    FORCE ROW LEVEL SECURITY holds such an owner too. Yields the owner's URL
    and a superuser's URL of the same database; both go afterwards.
    """
    suffix = uuid.uuid4().hex[:8]
    owner, name = f"cortex_owner_{suffix}", f"cortex_o_{suffix}"
    execute(server_url, f'CREATE ROLE "{owner}" LOGIN', f'CREATE DATABASE "{name}" OWNER "{owner}"')
    try:
        yield with_database(server_url, name, user=owner), with_database(server_url, name)
    finally:
        execute(
            server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'DROP ROLE "{owner}"'
        )
