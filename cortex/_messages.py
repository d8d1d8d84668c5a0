"""SQL for messages: the one-statement append and the read by position.

Plain ``async def`` functions taking ``(conn, scope, ...)``; no commits.
"""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any, Final, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from cortex._executor import Row, Tx
from cortex._filters import depth_class, scope_params, visible
from cortex._operator import record_inputs
from cortex._sessions import SESSION_COLUMNS, row_to_session, select_session
from cortex._tables import messages, sessions
from cortex.errors import NotFound
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, format_id, new_uuid
from cortex.models import (
    FunctionResponse,
    Message,
    NewMessage,
    RequestedInput,
    Session,
    check_json,
    from_database,
)
from cortex.scope import Scope

__all__ = [
    "SessionHistory",
    "append_messages",
    "list_messages",
    "recent_messages",
    "row_to_message",
    "select_session_with_messages",
]

_MESSAGE_COLUMNS: Final = (
    messages.c.id,
    messages.c.session_id,
    messages.c.seq,
    messages.c.role,
    messages.c.content,
    messages.c.author,
    messages.c.requested_input,
    messages.c.function_response,
    messages.c.metadata,
    messages.c.created_at,
)


def row_to_message(row: Row) -> Message:
    """Build the public model from a row selected with the message columns."""
    requested, response = row["requested_input"], row["function_response"]
    return from_database(
        Message,
        {
            "id": format_id(MESSAGE_PREFIX, row["id"]),
            "session_id": format_id(SESSION_PREFIX, row["session_id"]),
            "seq": row["seq"],
            "role": row["role"],
            "content": row["content"],
            "author": row["author"],
            "requested_input": (
                None if requested is None else RequestedInput.model_construct(**requested)
            ),
            "function_response": (
                None if response is None else FunctionResponse.model_construct(**response)
            ),
            "metadata": row["metadata"],
            "created_at": row["created_at"],
        },
    )


def _json_or_none(value: RequestedInput | FunctionResponse | None, field: str) -> str | None:
    return None if value is None else check_json(value.model_dump(mode="json"), field)


def _array(name: str, item: sa.types.TypeEngine[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=ARRAY(item))


@cache
def _append_statement(depth: int) -> sa.Insert:
    """One statement: raise the counter under the row lock, then insert the rows.

    The UPDATE runs first (a data-modifying CTE) and takes the session's row
    lock; concurrent appends to the same session queue on it. The new
    ``message_count`` it returns numbers the batch, so ``seq`` is gap-free and
    the count equals the rows in every committed state. One round trip: the
    lock is held for one statement plus COMMIT, not across client round trips
    (postgres-design.md, Q4: 2.5x the throughput of INSERT-then-UPDATE on a
    hot session). If the session is not visible the UPDATE matches nothing
    and so does the INSERT.
    """
    n = sa.bindparam("batch_size", type_=sa.Integer())
    touched = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .values(
            message_count=sessions.c.message_count + n,
            last_message=sa.bindparam("preview", type_=sa.Text()),
            # greatest(): appends queue on the row lock, so a later statement
            # must never move updated_at backwards.
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.clock_timestamp()),
        )
        .returning(
            sessions.c.tenant_id, sessions.c.id, sessions.c.message_count, sessions.c.updated_at
        )
        .cte("touched")
    )
    rows = (
        sa.func.unnest(
            _array("m_ids", UUID(as_uuid=True)),
            _array("m_roles", sa.Text()),
            _array("m_contents", sa.Text()),
            _array("m_authors", sa.Text()),
            _array("m_requested", sa.Text()),
            _array("m_responses", sa.Text()),
            _array("m_metadata", sa.Text()),
        )
        .table_valued(
            sa.column("id", UUID(as_uuid=True)),
            sa.column("role", sa.Text()),
            sa.column("content", sa.Text()),
            sa.column("author", sa.Text()),
            sa.column("requested", sa.Text()),
            sa.column("response", sa.Text()),
            sa.column("meta", sa.Text()),
            with_ordinality="ord",
            name="batch",
        )
        .render_derived()
    )
    source = sa.select(
        touched.c.tenant_id,
        rows.c.id,
        touched.c.id,
        touched.c.message_count - n + rows.c.ord,
        rows.c.role,
        rows.c.content,
        rows.c.author,
        sa.cast(rows.c.requested, JSONB()),
        sa.cast(rows.c.response, JSONB()),
        sa.cast(rows.c.meta, JSONB()),
        touched.c.updated_at,
    ).select_from(touched.join(rows, sa.true()))
    return (
        sa.insert(messages)
        .from_select(
            [
                "tenant_id",
                "id",
                "session_id",
                "seq",
                "role",
                "content",
                "author",
                "requested_input",
                "function_response",
                "metadata",
                "created_at",
            ],
            source,
        )
        .returning(*_MESSAGE_COLUMNS)
        .add_cte(touched)
    )


def _append_params(scope: Scope, session_id: uuid.UUID, batch: list[NewMessage]) -> dict[str, Any]:
    return {
        **scope_params(scope),
        "target_id": session_id,
        "batch_size": len(batch),
        "preview": batch[-1].preview(),
        "m_ids": [new_uuid() for _ in batch],
        "m_roles": [m.role for m in batch],
        "m_contents": [m.content for m in batch],
        "m_authors": [m.author for m in batch],
        "m_requested": [_json_or_none(m.requested_input, "requested_input") for m in batch],
        "m_responses": [_json_or_none(m.function_response, "function_response") for m in batch],
        "m_metadata": [check_json(m.metadata, "metadata") for m in batch],
    }


@cache
def _list_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(*_MESSAGE_COLUMNS)
        .join(
            sessions,
            sa.and_(
                sessions.c.tenant_id == messages.c.tenant_id,
                sessions.c.id == messages.c.session_id,
            ),
        )
        .where(
            visible(depth),
            sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
            messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
            messages.c.seq > sa.bindparam("after_seq", type_=sa.Integer()),
        )
        .order_by(messages.c.seq)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )


async def append_messages(
    conn: Tx, scope: Scope, session_id: uuid.UUID, batch: list[NewMessage]
) -> list[Message]:
    """Append ``batch`` to a visible session in one statement.

    Raises:
        NotFound: when the session is not visible (nothing is written).
    """
    stmt = _append_statement(depth_class(scope))
    rows = (await conn.execute(stmt, _append_params(scope, session_id, batch))).all()
    if not rows:
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")
    stored = sorted((row_to_message(row) for row in rows), key=lambda m: m.seq)
    # Questions and answers change operator state; plain messages (the hot
    # path) cost no second statement.
    if any(m.requested_input is not None or m.function_response is not None for m in batch):
        await record_inputs(conn, scope, session_id, stored)
    return stored


async def list_messages(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, after_seq: int, limit: int
) -> list[Message]:
    """Messages of a visible session with ``seq > after_seq``, by seq.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {
        **scope_params(scope),
        "target_id": session_id,
        "after_seq": after_seq,
        "limit": limit,
    }
    rows = (await conn.execute(_list_statement(depth_class(scope)), params)).all()
    if not rows:
        # An empty page and an invisible session look alike; tell them apart.
        await select_session(conn, scope, session_id)
    return [row_to_message(row) for row in rows]


# --- reading a conversation back ------------------------------------------------

# seq is an integer column; "before the end" is this bound, so one statement
# shape serves the newest page and every older one.
SEQ_END: Final = 2**31 - 1


class SessionHistory(NamedTuple):
    """A session and its newest messages, read from one snapshot."""

    session: Session
    messages: list[Message]


@cache
def _recent_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The newest ``limit`` messages with ``seq < before_seq``, newest first.

    A backward scan of ``uq_messages_session_seq (tenant_id, session_id,
    seq)`` that stops after the page: the cost of a page does not depend on
    how long the conversation is or how far back the page lies.
    """
    return (
        sa.select(*_MESSAGE_COLUMNS)
        .join(
            sessions,
            sa.and_(
                sessions.c.tenant_id == messages.c.tenant_id,
                sessions.c.id == messages.c.session_id,
            ),
        )
        .where(
            visible(depth),
            sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
            messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
            messages.c.seq < sa.bindparam("before_seq", type_=sa.Integer()),
        )
        .order_by(messages.c.seq.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )


@cache
def _history_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The session's columns, each row joined to one of its newest messages (or none).

    One statement is one snapshot under READ COMMITTED, so the counter and the
    messages agree even while appends commit between two reads. Message
    columns are labelled ``m_…`` beside the session's own.
    """
    recent = (
        sa.select(*_MESSAGE_COLUMNS)
        .where(
            messages.c.tenant_id == sessions.c.tenant_id,
            messages.c.session_id == sessions.c.id,
        )
        .order_by(messages.c.seq.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer()))
        .lateral("recent")
    )
    return (
        sa.select(*SESSION_COLUMNS, *(c.label(f"m_{c.name}") for c in recent.c))
        .select_from(sessions.outerjoin(recent, sa.true()))
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .order_by(recent.c.seq)
    )


async def recent_messages(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, before_seq: int, limit: int
) -> list[Message]:
    """The newest ``limit`` messages with ``seq < before_seq``, in ``seq`` order.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {
        **scope_params(scope),
        "target_id": session_id,
        "before_seq": before_seq,
        "limit": limit,
    }
    rows = (await conn.execute(_recent_statement(depth_class(scope)), params)).all()
    if not rows:
        # An empty page and an invisible session look alike; tell them apart.
        await select_session(conn, scope, session_id)
    return [row_to_message(row) for row in reversed(rows)]


def _labelled_message(row: Row) -> Message:
    """Build a message from the ``m_…`` columns of :func:`_history_statement`."""
    requested, response = row["m_requested_input"], row["m_function_response"]
    return from_database(
        Message,
        {
            "id": format_id(MESSAGE_PREFIX, row["m_id"]),
            "session_id": format_id(SESSION_PREFIX, row["m_session_id"]),
            "seq": row["m_seq"],
            "role": row["m_role"],
            "content": row["m_content"],
            "author": row["m_author"],
            "requested_input": (
                None if requested is None else RequestedInput.model_construct(**requested)
            ),
            "function_response": (
                None if response is None else FunctionResponse.model_construct(**response)
            ),
            "metadata": row["m_metadata"],
            "created_at": row["m_created_at"],
        },
    )


async def select_session_with_messages(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, limit: int
) -> SessionHistory:
    """A visible session and its newest ``limit`` messages in ``seq`` order, in one statement.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {**scope_params(scope), "target_id": session_id, "limit": limit}
    rows = (await conn.execute(_history_statement(depth_class(scope)), params)).all()
    if not rows:
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")
    history = [_labelled_message(row) for row in rows if row["m_id"] is not None]
    return SessionHistory(row_to_session(rows[0]), history)
