"""SQL for sessions: insert, select, update, delete, list, count, defaults.

Plain ``async def`` functions taking ``(conn, scope, ...)``. They never commit
and never open transactions: :func:`cortex._db.run_transaction` owns that.
Every statement gets its tenant and scope condition from cortex._filters.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from cortex._db import RetryTransaction
from cortex._filters import after_cursor, exact_clause, page, session_predicate, visible
from cortex._tables import sessions
from cortex.errors import Conflict, NotFound, constraint_of
from cortex.ids import SESSION_PREFIX, format_id, new_uuid
from cortex.models import ListFilter, Session
from cortex.scope import Scope

__all__ = [
    "SESSION_COLUMNS",
    "count_sessions",
    "delete_session",
    "insert_session",
    "resolve_default",
    "row_to_session",
    "select_page",
    "select_session",
    "set_default",
    "update_session",
]

# What a Session is read from; tenant_id, scope_depth and scope_l2 are derived
# from scope and stay internal.
SESSION_COLUMNS: Final = (
    sessions.c.id,
    sessions.c.agent_id,
    sessions.c.scope,
    sessions.c.title,
    sessions.c.metadata,
    sessions.c.message_count,
    sessions.c.last_message,
    sessions.c.is_default,
    sessions.c.backfilled_by,
    sessions.c.created_at,
    sessions.c.updated_at,
)

_UQ_DEFAULT: Final = "uq_sessions_default"


def row_to_session(row: sa.Row[*tuple[Any, ...]]) -> Session:
    """Build the public model from a row selected with SESSION_COLUMNS."""
    return Session.model_construct(
        id=format_id(SESSION_PREFIX, row.id),
        agent_id=row.agent_id,
        scope=Scope.parse(row.scope),
        title=row.title,
        metadata=row.metadata,
        message_count=row.message_count,
        last_message=row.last_message,
        is_default=row.is_default,
        backfilled_by=row.backfilled_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def json_value(text: str) -> sa.ColumnElement[Any]:
    """Bind JSON text already validated and serialised by cortex.models as jsonb."""
    return sa.cast(sa.literal(text, sa.Text()), JSONB())


def scope_columns(scope: Scope) -> dict[str, Any]:
    """The columns derived from a session's scope, written once at insert."""
    return {
        "tenant_id": scope.tenant,
        "scope": str(scope),
        "scope_depth": scope.depth,
        "scope_l2": scope.prefix(2) if scope.depth >= 2 else None,
    }


async def insert_session(
    conn: AsyncConnection,
    scope: Scope,
    *,
    session_id: uuid.UUID,
    agent_id: str,
    title: str,
    metadata_json: str,
    is_default: bool,
) -> Session:
    """Insert a session at exactly ``scope``.

    Raises:
        Conflict: the id is taken in this tenant, or (agent, scope) already has a default.
    """
    stmt = (
        sa.insert(sessions)
        .values(
            id=session_id,
            agent_id=agent_id,
            title=title,
            metadata=json_value(metadata_json),
            is_default=is_default,
            **scope_columns(scope),
        )
        .returning(*SESSION_COLUMNS)
    )
    try:
        row = (await conn.execute(stmt)).one()
    except IntegrityError as exc:
        if constraint_of(exc) == _UQ_DEFAULT:
            raise Conflict(f"agent {agent_id!r} already has a default session in {scope}") from exc
        raise Conflict(
            f"session id {format_id(SESSION_PREFIX, session_id)} is already taken"
        ) from exc
    return row_to_session(row)


async def select_session(
    conn: AsyncConnection, scope: Scope, session_id: uuid.UUID, *, for_update: bool = False
) -> Session:
    """The session if it is visible from ``scope``.

    Raises:
        NotFound: missing or outside the scope (indistinguishable on purpose).
    """
    stmt = sa.select(*SESSION_COLUMNS).where(visible(scope), sessions.c.id == session_id)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")
    return row_to_session(row)


async def update_session(
    conn: AsyncConnection, scope: Scope, session_id: uuid.UUID, *, title: str, metadata_json: str
) -> Session:
    """Write the host-owned columns (title, metadata) and move updated_at; nothing else.

    Raises:
        NotFound: when the session is not visible.
    """
    stmt = (
        sa.update(sessions)
        .where(visible(scope), sessions.c.id == session_id)
        .values(
            title=title,
            metadata=json_value(metadata_json),
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.clock_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )
    row = (await conn.execute(stmt)).first()
    if row is None:
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")
    return row_to_session(row)


async def delete_session(conn: AsyncConnection, scope: Scope, session_id: uuid.UUID) -> None:
    """Delete a visible session; its messages go with it (ON DELETE CASCADE).

    Raises:
        NotFound: when the session is not visible.
    """
    stmt = (
        sa.delete(sessions)
        .where(visible(scope), sessions.c.id == session_id)
        .returning(sessions.c.id)
    )
    if (await conn.execute(stmt)).first() is None:
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")


async def select_page(
    conn: AsyncConnection,
    scope: Scope,
    flt: ListFilter,
    *,
    limit: int,
    offset: int = 0,
    after: tuple[Any, uuid.UUID] | None = None,
) -> list[Session]:
    """One page of the listing, by offset or after a keyset cursor."""
    stmt = sa.select(*SESSION_COLUMNS).where(session_predicate(scope, flt))
    if after is not None:
        stmt = stmt.where(after_cursor(*after))
    rows = (await conn.execute(page(stmt, limit=limit, offset=offset))).all()
    return [row_to_session(row) for row in rows]


async def count_sessions(conn: AsyncConnection, scope: Scope, flt: ListFilter) -> int:
    """How many sessions the listing would return without limit or offset."""
    stmt = sa.select(sa.func.count()).select_from(sessions).where(session_predicate(scope, flt))
    return int((await conn.execute(stmt)).scalar_one())


async def resolve_default(conn: AsyncConnection, scope: Scope, agent_id: str) -> Session:
    """The default session of (agent, exact scope), created if absent.

    Concurrency: ``INSERT ... ON CONFLICT DO NOTHING`` against the partial
    unique index, then a *separate* SELECT. Under READ COMMITTED the SELECT
    takes a new snapshot and so sees a default another transaction committed
    while our INSERT waited on it; a single-statement form would not (its
    snapshot predates that commit). If the winner was deleted in between,
    the transaction runs again.
    """
    insert = (
        pg_insert(sessions)
        .values(id=new_uuid(), agent_id=agent_id, is_default=True, **scope_columns(scope))
        .on_conflict_do_nothing(
            index_elements=[sessions.c.tenant_id, sessions.c.agent_id, sessions.c.scope],
            index_where=sessions.c.is_default,
        )
        .returning(*SESSION_COLUMNS)
    )
    row = (await conn.execute(insert)).first()
    if row is None:
        existing = sa.select(*SESSION_COLUMNS).where(
            exact_clause(scope), sessions.c.agent_id == agent_id, sessions.c.is_default
        )
        row = (await conn.execute(existing)).first()
    if row is None:
        raise RetryTransaction
    return row_to_session(row)


async def set_default(conn: AsyncConnection, scope: Scope, session_id: uuid.UUID) -> Session:
    """Make a visible session the default of its (agent, scope), demoting the old one.

    Concurrency: the target row is locked, then a transaction-scoped advisory
    lock on (agent, scope) serialises competing switches, so the last one
    wins instead of failing. Demote and promote run in this one transaction:
    readers see the old default or the new one, never none and never two. A
    default inserted concurrently by resolve_session makes the promote hit
    the unique index; the whole transaction then runs again.

    Raises:
        NotFound: when the session is not visible.
    """
    target = await select_session(conn, scope, session_id, for_update=True)
    if target.is_default:
        return target
    key = f"{target.agent_id} {target.scope}"  # agent ids hold no whitespace
    await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(key, 0))))
    same_thread = sa.and_(
        visible(scope),
        exact_clause(target.scope),
        sessions.c.agent_id == target.agent_id,
    )
    await conn.execute(
        sa.update(sessions)
        .where(same_thread, sessions.c.is_default, sessions.c.id != session_id)
        .values(is_default=False)
    )
    try:
        row = (
            await conn.execute(
                sa.update(sessions)
                .where(same_thread, sessions.c.id == session_id)
                .values(is_default=True)
                .returning(*SESSION_COLUMNS)
            )
        ).one()
    except IntegrityError as exc:
        if constraint_of(exc) == _UQ_DEFAULT:
            raise RetryTransaction from exc
        raise
    return row_to_session(row)
