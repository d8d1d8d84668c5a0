"""SQL for the operator surface: pending inputs, abort and interrupt markers, inspection.

Plain ``async def`` functions taking ``(conn, scope, ...)``; no commits. State
is never derived by reading history: ``pending_inputs`` rows and the
``sessions`` flags are written in the same transaction as the messages and
markers that change them, and ``sessions.state`` is a generated column.
"""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

from cortex._db.executor import Tx
from cortex._filters import depth_class, path_clause, scope_params, visible
from cortex._schemas import validate_response
from cortex._sessions import SESSION_COLUMNS, lock_session_id, row_to_session, select_session
from cortex._tables import messages, pending_inputs, session_markers, sessions
from cortex.errors import AlreadyAborted, Conflict, NotFound, SessionAborted
from cortex.ids import SESSION_PREFIX, format_id
from cortex.models import (
    Message,
    PendingInput,
    RequestedInput,
    Session,
    SessionDetail,
    SessionState,
)
from cortex.scope import Scope

__all__ = [
    "abort",
    "check_answer",
    "check_resumable",
    "clear_interrupted",
    "inspect",
    "mark_interrupted",
    "pending_schemas",
    "record_inputs",
]

ABORTED: Final = "aborted"
INTERRUPTED: Final = "interrupted"


def _text(name: str) -> sa.BindParameter[str]:
    return sa.bindparam(name, type_=sa.Text())


def _sid() -> sa.BindParameter[uuid.UUID]:
    return sa.bindparam("target_id", type_=UUID(as_uuid=True))


def _same_session(table: sa.Table) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.tenant_id == _text("scope_tenant"), table.c.session_id == _sid())


@cache
def _record_statement(depth: int) -> sa.Update:
    """Insert the batch's open questions, delete what its answers resolve, recount.

    One statement. Sibling CTEs cannot see each other's rows, so questions
    answered inside the same batch are dropped in Python before binding;
    the DELETE then only meets questions from earlier appends. An answer
    resolves only questions raised before it (``raised_seq < seq``).
    """
    asked = (
        sa.func.unnest(
            sa.bindparam("q_seqs", type_=ARRAY(sa.Integer())),
            sa.bindparam("q_ids", type_=ARRAY(sa.Text())),
            sa.bindparam("q_messages", type_=ARRAY(sa.Text())),
            sa.bindparam("q_authors", type_=ARRAY(sa.Text())),
            sa.bindparam("q_schemas", type_=ARRAY(sa.Text())),
            sa.bindparam("q_payloads", type_=ARRAY(sa.Text())),
        )
        .table_valued(
            sa.column("seq", sa.Integer()),
            sa.column("interrupt_id", sa.Text()),
            sa.column("message", sa.Text()),
            sa.column("author", sa.Text()),
            sa.column("response_schema", sa.Text()),
            sa.column("payload", sa.Text()),
            name="asked",
        )
        .render_derived()
    )
    inserted = (
        sa.insert(pending_inputs)
        .from_select(
            [
                "tenant_id",
                "session_id",
                "raised_seq",
                "interrupt_id",
                "message",
                "author",
                "raised_at",
                "response_schema",
                "payload",
            ],
            sa.select(
                _text("scope_tenant"),
                _sid(),
                asked.c.seq,
                asked.c.interrupt_id,
                asked.c.message,
                asked.c.author,
                # Not clock_timestamp(): VOLATILE, refused by Citus here.
                sa.func.statement_timestamp(),
                sa.cast(asked.c.response_schema, JSONB()),
                sa.cast(asked.c.payload, JSONB()),
            ),
        )
        .returning(pending_inputs.c.raised_seq)
        .cte("inserted")
    )
    answered = (
        sa.func.unnest(
            sa.bindparam("a_ids", type_=ARRAY(sa.Text())),
            sa.bindparam("a_seqs", type_=ARRAY(sa.Integer())),
        )
        .table_valued(
            sa.column("interrupt_id", sa.Text()), sa.column("seq", sa.Integer()), name="answered"
        )
        .render_derived()
    )
    resolved = (
        sa.delete(pending_inputs)
        .where(
            _same_session(pending_inputs),
            pending_inputs.c.interrupt_id == answered.c.interrupt_id,
            pending_inputs.c.raised_seq < answered.c.seq,
        )
        .returning(pending_inputs.c.raised_seq)
        .cte("resolved")
    )
    delta = (
        sa.select(sa.func.count()).select_from(inserted).scalar_subquery()
        - sa.select(sa.func.count()).select_from(resolved).scalar_subquery()
    )
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _sid())
        .values(pending_count=sessions.c.pending_count + delta)
        .add_cte(inserted)
        .add_cte(resolved)
    )


async def _record_routed(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    questions: list[tuple[int, RequestedInput, str]],
    answered: list[str],
) -> None:
    """:func:`_record_statement`'s work as router statements, for Citus.

    Citus runs the one-statement form (data-modifying CTEs, ``INSERT ...
    SELECT`` from ``unnest``) through the coordinator. Here: the answers'
    DELETE, then the questions' ``INSERT ... VALUES``, then the counter,
    each routed to the tenant's shard. Every pending question the DELETE can
    meet was raised by an earlier append, so before any answer of this batch
    (``raised_seq < seq`` holds for all of them); the batch's own questions
    are inserted after it, and those it answers itself were dropped already.
    """
    same = {"scope_tenant": scope.tenant, "target_id": session_id}
    delta = 0
    if answered:
        resolved = await conn.execute(_resolve_statement(), {**same, "a_ids": answered})
        delta -= len(resolved.all())
    for start in range(0, len(questions), _QUESTION_ROWS):
        chunk = questions[start : start + _QUESTION_ROWS]
        values: dict[str, Any] = dict(same)
        for j, (seq, asked, author) in enumerate(chunk):
            values[f"q_seq_{j}"] = seq
            values[f"q_id_{j}"] = asked.interrupt_id
            values[f"q_message_{j}"] = asked.message
            values[f"q_author_{j}"] = author
            values[f"q_schema_{j}"] = _json_or_none(asked.response_schema)
            values[f"q_payload_{j}"] = _json_or_none(asked.payload)
        await conn.execute(_ask_statement(len(chunk)), values)
        delta += len(chunk)
    if delta:
        params = {**scope_params(scope), "target_id": session_id, "pending_delta": delta}
        await conn.execute(_pending_delta_statement(depth_class(scope)), params)


# Questions per INSERT ... VALUES on Citus (one statement shape per count).
_QUESTION_ROWS: Final = 8


@cache
def _resolve_statement() -> ReturningDelete[*tuple[Any, ...]]:
    return (
        sa.delete(pending_inputs)
        .where(
            _same_session(pending_inputs),
            pending_inputs.c.interrupt_id == sa.any_(sa.bindparam("a_ids", type_=ARRAY(sa.Text()))),
        )
        .returning(pending_inputs.c.raised_seq)
    )


@cache
def _ask_statement(count: int) -> sa.Insert:
    rows = [
        {
            "tenant_id": _text("scope_tenant"),
            "session_id": _sid(),
            "raised_seq": sa.bindparam(f"q_seq_{j}", type_=sa.Integer()),
            "interrupt_id": _text(f"q_id_{j}"),
            "message": _text(f"q_message_{j}"),
            "author": _text(f"q_author_{j}"),
            # Not clock_timestamp(): VOLATILE, refused by Citus here.
            "raised_at": sa.func.statement_timestamp(),
            "response_schema": sa.cast(_text(f"q_schema_{j}"), JSONB()),
            "payload": sa.cast(_text(f"q_payload_{j}"), JSONB()),
        }
        for j in range(count)
    ]
    return sa.insert(pending_inputs).values(rows)


@cache
def _pending_delta_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _sid())
        .values(
            pending_count=sessions.c.pending_count
            + sa.bindparam("pending_delta", type_=sa.Integer())
        )
    )


def _json_or_none(value: Any) -> str | None:
    import json

    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def record_inputs(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    stored: list[Message],
    *,
    distributed: bool = False,
) -> None:
    """Keep pending_inputs and pending_count current for messages just appended.

    Runs in the append's transaction, after the append statement took the
    session's row lock, so concurrent appends to the session see each other's
    questions and answers in order. ``distributed`` (Citus): as router
    statements (:func:`_record_routed`).
    """
    answers = [(m.seq, answer.id) for m in stored for answer in m.function_responses]
    questions = [
        (m.seq, asked, m.author)
        for m in stored
        for asked in m.requested_inputs
        if not any(a_id == asked.interrupt_id and a_seq > m.seq for a_seq, a_id in answers)
    ]
    if not questions and not answers:
        return
    if distributed:
        await _record_routed(conn, scope, session_id, questions, [a_id for _, a_id in answers])
        return
    params = {
        **scope_params(scope),
        "target_id": session_id,
        "q_seqs": [seq for seq, _, _ in questions],
        "q_ids": [q.interrupt_id for _, q, _ in questions],
        "q_messages": [q.message for _, q, _ in questions],
        "q_authors": [author for _, _, author in questions],
        "q_schemas": [_json_or_none(q.response_schema) for _, q, _ in questions],
        "q_payloads": [_json_or_none(q.payload) for _, q, _ in questions],
        "a_ids": [a_id for _, a_id in answers],
        "a_seqs": [seq for seq, _ in answers],
    }
    await conn.execute(_record_statement(depth_class(scope)), params)


@cache
def _markers_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    return sa.select(session_markers.c.kind, session_markers.c.reason).where(
        path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
        session_markers.c.session_id == _sid(),
    )


@cache
def _pending_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(pending_inputs)
        .where(_same_session(pending_inputs))
        .order_by(pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id)
    )


def _pending(row: Any) -> PendingInput:
    return PendingInput.model_construct(
        interrupt_id=row.interrupt_id,
        message=row.message,
        author=row.author,
        raised_at=row.raised_at,
        raised_seq=row.raised_seq,
        response_schema=row.response_schema,
        payload=row.payload,
    )


async def inspect(conn: Tx, scope: Scope, session_id: uuid.UUID) -> SessionDetail:
    """The session with its state, pending inputs and marker reasons.

    Raises:
        NotFound: the session is not visible.
    """
    session = await select_session(conn, scope, session_id)
    params = {**scope_params(scope), "target_id": session_id}
    reasons = {
        row.kind: row.reason
        for row in await conn.execute(_markers_statement(depth_class(scope)), params)
    }
    pending = (
        []
        if session.state is SessionState.ABORTED
        else [_pending(row) for row in await conn.execute(_pending_statement(), params)]
    )
    return SessionDetail.model_construct(
        session=session,
        state=session.state,
        pending=pending,
        abort_reason=reasons.get(ABORTED),
        interrupt_reason=reasons.get(INTERRUPTED),
    )


def _marker_insert(kind: str) -> Any:
    return pg_insert(session_markers).values(
        tenant_id=_text("scope_tenant"),
        session_id=_sid(),
        kind=kind,
        scope=_text("marker_scope"),
        reason=_text("reason"),
        marked_at=sa.func.statement_timestamp(),  # not VOLATILE clock_timestamp(): Citus
    )


@cache
def _abort_statements(depth: int) -> tuple[Any, sa.Delete, sa.Update]:
    marker = _marker_insert(ABORTED).on_conflict_do_nothing().returning(session_markers.c.kind)
    clear = sa.delete(pending_inputs).where(_same_session(pending_inputs))
    flag = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _sid())
        .values(is_aborted=True, pending_count=0)
        .returning(*SESSION_COLUMNS)
    )
    return marker, clear, flag


async def abort(conn: Tx, scope: Scope, session_id: uuid.UUID, reason: str) -> Session:
    """Write the durable abort marker; pending inputs are cleared.

    Raises:
        NotFound: the session is not visible.
        AlreadyAborted: the session already carries the marker.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.state is SessionState.ABORTED:
        raise AlreadyAborted(f"session {format_id(SESSION_PREFIX, session_id)} is already aborted")
    marker, clear, flag = _abort_statements(depth_class(scope))
    params = {**scope_params(scope), "target_id": session_id}
    marker_params = {**params, "marker_scope": str(session.scope), "reason": reason}
    if (await conn.execute(marker, marker_params)).first() is None:
        raise AlreadyAborted(f"session {format_id(SESSION_PREFIX, session_id)} is already aborted")
    await conn.execute(clear, params)
    return row_to_session((await conn.execute(flag, params)).one())


@cache
def _interrupt_statements(depth: int) -> tuple[Any, Any, sa.Update, sa.Delete, sa.Update]:
    upsert = _marker_insert(INTERRUPTED)
    excluded = upsert.excluded
    replace = {"reason": excluded.reason, "scope": excluded.scope, "marked_at": excluded.marked_at}
    keys = [session_markers.c.tenant_id, session_markers.c.session_id, session_markers.c.kind]
    # On a visible session the marker always takes the session's scope.
    mark = upsert.on_conflict_do_update(index_elements=keys, set_=replace)
    # A parked marker replaces only a parked marker the caller can see: one
    # scope never overwrites (or moves) a marker another scope parked.
    park = upsert.on_conflict_do_update(
        index_elements=keys,
        set_=replace,
        where=path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
    ).returning(session_markers.c.kind)
    flag = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _sid())
        .values(is_interrupted=True)
        .returning(sessions.c.scope)
    )
    remove = sa.delete(session_markers).where(
        path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
        session_markers.c.session_id == _sid(),
        session_markers.c.kind == INTERRUPTED,
    )
    unflag = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _sid(), sessions.c.is_interrupted)
        .values(is_interrupted=False)
    )
    return mark, park, flag, remove, unflag


@cache
def _probe_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The session with this id anywhere in the tenant, and whether the scope sees it."""
    return sa.select(sessions.c.scope, visible(depth).label("is_visible")).where(
        sessions.c.tenant_id == _text("scope_tenant"), sessions.c.id == _sid()
    )


async def _probe(conn: Tx, scope: Scope, session_id: uuid.UUID, params: dict[str, Any]) -> bool:
    """Serialise marker writes on this id, then say whether a visible session holds it.

    The advisory lock is the one :func:`cortex._sessions.insert_session` takes
    for a caller-chosen id, so a marker parked while its session is being
    created is seen by the create or sees the session, never neither. The
    probe runs after the lock, so its snapshot includes whatever the lock
    holder committed.

    Raises:
        NotFound: a session with this id exists in the tenant but outside the
            scope: acting on it from here would reach into another scope.
    """
    await lock_session_id(conn, scope, session_id)
    row = (await conn.execute(_probe_statement(depth_class(scope)), params)).first()
    if row is None:
        return False
    if not row.is_visible:
        raise _not_found(session_id)
    return True


def _not_found(session_id: uuid.UUID) -> NotFound:
    return NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")


async def mark_interrupted(conn: Tx, scope: Scope, session_id: uuid.UUID, reason: str) -> None:
    """Set (or overwrite) the interrupt marker.

    If the session is visible, the marker takes the session's scope and shows
    at once. If no session has this id, it is parked at the current exact
    scope and shows when a session with this id is created there.

    Concurrency: the session's row lock is taken (by the flag update) before
    the marker is written, so a concurrent ``delete_session`` either runs
    first (this call then raises NotFound and writes nothing) or waits and
    removes the marker with the session.

    Raises:
        NotFound: the session exists outside the scope, or was deleted meanwhile.
        Conflict: another scope parked a marker for this id, which no session has yet.
    """
    depth = depth_class(scope)
    params: dict[str, Any] = {**scope_params(scope), "target_id": session_id}
    mark, park, flag, _, _ = _interrupt_statements(depth)
    if await _probe(conn, scope, session_id, params):
        flagged = (await conn.execute(flag, params)).first()
        if flagged is None:  # deleted between the probe and the row lock
            raise _not_found(session_id)
        await conn.execute(mark, {**params, "reason": reason, "marker_scope": flagged.scope})
        return
    parked_params = {**params, "reason": reason, "marker_scope": str(scope)}
    parked = (await conn.execute(park, parked_params)).first()
    if parked is None:
        sid = format_id(SESSION_PREFIX, session_id)
        raise Conflict(f"session id {sid} carries a marker another scope parked")


async def clear_interrupted(conn: Tx, scope: Scope, session_id: uuid.UUID) -> None:
    """Remove the interrupt marker visible from ``scope``; a no-op if there is none.

    Raises:
        NotFound: the session exists outside the scope.
    """
    depth = depth_class(scope)
    params = {**scope_params(scope), "target_id": session_id}
    _, _, _, remove, unflag = _interrupt_statements(depth)
    if await _probe(conn, scope, session_id, params):
        await conn.execute(unflag, params)
    await conn.execute(remove, params)


@cache
def _asked_before_statement() -> sa.Select[tuple[bool]]:
    return sa.select(
        sa.exists().where(
            messages.c.tenant_id == _text("scope_tenant"),
            messages.c.session_id == _sid(),
            sa.or_(
                messages.c.requested_input["interrupt_id"].astext == _text("interrupt_id"),
                # A message's further questions (revision 20261201000013).
                # Qualified: the variadic "any" built-ins lose to any exact signature.
                messages.c.more_requested_inputs.contains(
                    sa.func.pg_catalog.jsonb_build_array(
                        sa.func.pg_catalog.jsonb_build_object("interrupt_id", _text("interrupt_id"))
                    )
                ),
            ),
        )
    )


@cache
def _pending_by_id_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(pending_inputs)
        .where(
            _same_session(pending_inputs), pending_inputs.c.interrupt_id == _text("interrupt_id")
        )
        .order_by(pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id)
    )


async def pending_schemas(
    conn: Tx, scope: Scope, session_id: uuid.UUID, interrupt_id: str
) -> dict[int, Any]:
    """The response schemas of the questions ``interrupt_id`` would answer, by raised seq.

    Read without locking anything, so ``resume`` can check the answer before
    it takes the session's row lock (and outside any transaction).

    Raises:
        NotFound: the session is not visible.
    """
    await select_session(conn, scope, session_id)
    params = {**scope_params(scope), "target_id": session_id, "interrupt_id": interrupt_id}
    rows = (await conn.execute(_pending_by_id_statement(), params)).all()
    return {row.raised_seq: row.response_schema for row in rows}


def check_answer(response: Any, schemas: dict[int, Any]) -> None:
    """Validate ``response`` against each schema (bounded work: cortex._schemas).

    Raises:
        InvalidInput: naming the failing path.
    """
    for schema in schemas.values():
        if schema is not None:
            validate_response(response, schema)


async def check_resumable(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    interrupt_id: str,
    response: Any,
    *,
    checked: dict[int, Any],
) -> None:
    """Check, under the session's row lock, that ``response`` may answer ``interrupt_id``.

    The lock serialises concurrent resumes of one session: the second sees
    the first one's answer and gets Conflict. ``checked`` holds the schemas
    the answer was already validated against before the lock (by raised
    seq); only a question raised since then is validated here.

    Raises:
        NotFound: the session is not visible, or never asked ``interrupt_id``.
        SessionAborted: the session carries an abort marker.
        Conflict: the interrupt was already answered.
        InvalidInput: ``response`` fails the question's response schema.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.state is SessionState.ABORTED:
        raise SessionAborted(f"session {format_id(SESSION_PREFIX, session_id)} was aborted")
    params = {**scope_params(scope), "target_id": session_id, "interrupt_id": interrupt_id}
    pending = (await conn.execute(_pending_by_id_statement(), params)).all()
    if not pending:
        if (await conn.execute(_asked_before_statement(), params)).scalar_one():
            raise Conflict(f"interrupt {interrupt_id!r} was already answered")
        raise NotFound(f"no pending input {interrupt_id!r} in this session")
    check_answer(
        response, {r.raised_seq: r.response_schema for r in pending if r.raised_seq not in checked}
    )
