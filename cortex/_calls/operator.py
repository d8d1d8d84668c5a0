"""Calls of the operator surface: pending inputs, abort and interrupt markers, inspection.

Plain ``async def`` functions taking ``(conn, scope, ...)``; no commits; their
statements are built in cortex._sql.operator. State
is never derived by reading history: ``pending_inputs`` rows and the
``sessions`` flags are written in the same transaction as the messages and
markers that change them, and ``sessions.state`` is a generated column.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cortex._calls.rows import row_to_pending, row_to_session
from cortex._calls.sessions import lock_session_id, not_found, select_session
from cortex._db.executor import Tx
from cortex._schemas import validate_response
from cortex._sql import operator as sql
from cortex._sql.operator import ABORTED, INTERRUPTED, QUESTION_ROWS
from cortex._sql.params import (
    A_IDS,
    A_SEQS,
    INTERRUPT_ID,
    MARKER_SCOPE,
    PENDING_COUNT,
    PENDING_DELTA,
    Q_AUTHOR,
    Q_AUTHORS,
    Q_ID,
    Q_IDS,
    Q_MESSAGE,
    Q_MESSAGES,
    Q_PAYLOAD,
    Q_PAYLOADS,
    Q_RAISED_AT,
    Q_SCHEMA,
    Q_SCHEMAS,
    Q_SEQ,
    Q_SEQS,
    REASON,
    SCOPE_TENANT,
    TARGET_ID,
    THROUGH_SEQ,
    TO_SEQ,
    row_name,
)
from cortex._sql.predicates import depth_class, scope_params
from cortex.errors import AlreadyAborted, Conflict, NotFound, SessionAborted
from cortex.ids import SESSION_PREFIX, format_id
from cortex.models import (
    Message,
    RequestedInput,
    Session,
    SessionDetail,
    SessionState,
)
from cortex.scope import Scope

__all__ = [
    "Asked",
    "abort",
    "answers_after",
    "ask_again",
    "check_answer",
    "check_resumable",
    "clear_interrupted",
    "inspect",
    "mark_interrupted",
    "pending_schemas",
    "pending_through",
    "raised_times",
    "record_inputs",
    "set_pending_count",
    "unask_after",
]


async def _record_routed(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    questions: list[tuple[int, RequestedInput, str]],
    answered: list[str],
) -> None:
    """:func:`cortex._sql.operator.record_statement`'s work as router statements, for Citus.

    Citus runs the one-statement form (data-modifying CTEs, ``INSERT ...
    SELECT`` from ``unnest``) through the coordinator. Here: the answers'
    DELETE, then the questions' ``INSERT ... VALUES``, then the counter,
    each routed to the tenant's shard. Every pending question the DELETE can
    meet was raised by an earlier append, so before any answer of this batch
    (``raised_seq < seq`` holds for all of them); the batch's own questions
    are inserted after it, and those it answers itself were dropped already.
    """
    same = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
    delta = 0
    if answered:
        resolved = await conn.execute(sql.delete_answered_statement(), {**same, A_IDS: answered})
        delta -= len(resolved.all())
    for start in range(0, len(questions), QUESTION_ROWS):
        chunk = questions[start : start + QUESTION_ROWS]
        values: dict[str, Any] = dict(same)
        for j, (seq, asked, author) in enumerate(chunk):
            values[row_name(Q_SEQ, j)] = seq
            values[row_name(Q_ID, j)] = asked.interrupt_id
            values[row_name(Q_MESSAGE, j)] = asked.message
            values[row_name(Q_AUTHOR, j)] = author
            values[row_name(Q_SCHEMA, j)] = _json_or_none(asked.response_schema)
            values[row_name(Q_PAYLOAD, j)] = _json_or_none(asked.payload)
        await conn.execute(sql.ask_statement(len(chunk)), values)
        delta += len(chunk)
    if delta:
        params = {**scope_params(scope), TARGET_ID: session_id, PENDING_DELTA: delta}
        await conn.execute(sql.pending_delta_statement(depth_class(scope)), params)


def _json_or_none(value: Any) -> str | None:
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
        TARGET_ID: session_id,
        Q_SEQS: [seq for seq, _, _ in questions],
        Q_IDS: [q.interrupt_id for _, q, _ in questions],
        Q_MESSAGES: [q.message for _, q, _ in questions],
        Q_AUTHORS: [author for _, _, author in questions],
        Q_SCHEMAS: [_json_or_none(q.response_schema) for _, q, _ in questions],
        Q_PAYLOADS: [_json_or_none(q.payload) for _, q, _ in questions],
        A_IDS: [a_id for _, a_id in answers],
        A_SEQS: [seq for seq, _ in answers],
    }
    await conn.execute(sql.record_statement(depth_class(scope)), params)


async def inspect(conn: Tx, scope: Scope, session_id: uuid.UUID) -> SessionDetail:
    """The session with its state, pending inputs and marker reasons.

    Raises:
        NotFound: the session is not visible.
    """
    session = await select_session(conn, scope, session_id)
    params = {**scope_params(scope), TARGET_ID: session_id}
    reasons = {
        row.kind: row.reason
        for row in await conn.execute(sql.markers_statement(depth_class(scope)), params)
    }
    pending = (
        []
        if session.state is SessionState.ABORTED
        else [row_to_pending(row) for row in await conn.execute(sql.pending_statement(), params)]
    )
    return SessionDetail.model_construct(
        session=session,
        state=session.state,
        pending=pending,
        abort_reason=reasons.get(ABORTED),
        interrupt_reason=reasons.get(INTERRUPTED),
    )


async def abort(conn: Tx, scope: Scope, session_id: uuid.UUID, reason: str) -> Session:
    """Write the durable abort marker; pending inputs are cleared.

    Raises:
        NotFound: the session is not visible.
        AlreadyAborted: the session already carries the marker.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.state is SessionState.ABORTED:
        raise AlreadyAborted(f"session {format_id(SESSION_PREFIX, session_id)} is already aborted")
    marker, clear, flag = sql.abort_statements(depth_class(scope))
    params = {**scope_params(scope), TARGET_ID: session_id}
    marker_params = {**params, MARKER_SCOPE: str(session.scope), REASON: reason}
    if (await conn.execute(marker, marker_params)).first() is None:
        raise AlreadyAborted(f"session {format_id(SESSION_PREFIX, session_id)} is already aborted")
    await conn.execute(clear, params)
    return row_to_session((await conn.execute(flag, params)).one())


async def _probe(conn: Tx, scope: Scope, session_id: uuid.UUID, params: dict[str, Any]) -> bool:
    """Serialise marker writes on this id, then say whether a visible session holds it.

    The advisory lock is the one :func:`cortex._calls.sessions.insert_session` takes
    for a caller-chosen id, so a marker parked while its session is being
    created is seen by the create or sees the session, never neither. The
    probe runs after the lock, so its snapshot includes whatever the lock
    holder committed.

    Raises:
        NotFound: a session with this id exists in the tenant but outside the
            scope: acting on it from here would reach into another scope.
    """
    await lock_session_id(conn, scope, session_id)
    row = (await conn.execute(sql.probe_statement(depth_class(scope)), params)).first()
    if row is None:
        return False
    if not row.is_visible:
        raise not_found(session_id)
    return True


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
    params: dict[str, Any] = {**scope_params(scope), TARGET_ID: session_id}
    mark, park, flag, _, _ = sql.interrupt_statements(depth)
    if await _probe(conn, scope, session_id, params):
        flagged = (await conn.execute(flag, params)).first()
        if flagged is None:  # deleted between the probe and the row lock
            raise not_found(session_id)
        await conn.execute(mark, {**params, REASON: reason, MARKER_SCOPE: flagged.scope})
        return
    parked_params = {**params, REASON: reason, MARKER_SCOPE: str(scope)}
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
    params = {**scope_params(scope), TARGET_ID: session_id}
    _, _, _, remove, unflag = sql.interrupt_statements(depth)
    if await _probe(conn, scope, session_id, params):
        await conn.execute(unflag, params)
    await conn.execute(remove, params)


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
    params = {**scope_params(scope), TARGET_ID: session_id, INTERRUPT_ID: interrupt_id}
    rows = (await conn.execute(sql.pending_by_id_statement(), params)).all()
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
    params = {**scope_params(scope), TARGET_ID: session_id, INTERRUPT_ID: interrupt_id}
    pending = (await conn.execute(sql.pending_by_id_statement(), params)).all()
    if not pending:
        if (await conn.execute(sql.asked_before_statement(), params)).scalar_one():
            raise Conflict(f"interrupt {interrupt_id!r} was already answered")
        raise NotFound(f"no pending input {interrupt_id!r} in this session")
    check_answer(
        response, {r.raised_seq: r.response_schema for r in pending if r.raised_seq not in checked}
    )


# --- pending inputs of a fork, and after a rewind ------------------------------------


@dataclass(frozen=True)
class Asked:
    """A question pending at a position of a transcript, with the time its message was appended."""

    seq: int
    question: RequestedInput
    author: str
    asked_at: datetime


def _answer_ids(row: Any) -> list[str]:
    ids = [] if row.answer_id is None else [row.answer_id]
    return ids + [i for i in (row.more_answer_ids or []) if isinstance(i, str)]


async def pending_through(
    conn: Tx, scope: Scope, session_id: uuid.UUID, through: int
) -> list[Asked]:
    """The questions of messages 1 to ``through`` that no later message in that range answers.

    What the transcript cut at ``through`` leaves pending, as the appends
    decided it (:func:`record_inputs`): an answer resolves every question of
    its id asked before it, and none asked in or after its own message.
    """
    params = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id, THROUGH_SEQ: through}
    rows = (await conn.execute(sql.questions_statement(), params)).all()
    answered: dict[str, int] = {}
    for row in rows:
        for answer in _answer_ids(row):
            answered[answer] = row.seq  # rows come in seq order: the last answer stays
    pending = []
    for row in rows:
        asked = [] if row.requested_input is None else [row.requested_input]
        asked += row.more_requested_inputs or []
        for question in asked:
            if answered.get(question["interrupt_id"], 0) <= row.seq:
                pending.append(
                    Asked(
                        row.seq,
                        RequestedInput.model_construct(**question),
                        row.author,
                        row.created_at,
                    )
                )
    return pending


async def answers_after(conn: Tx, scope: Scope, session_id: uuid.UUID, to_seq: int) -> bool:
    """Whether a message after ``to_seq`` answers a question: a rewind to it may re-open one."""
    params = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id, TO_SEQ: to_seq}
    return bool((await conn.execute(sql.answered_after_statement(), params)).first())


async def raised_times(
    conn: Tx, scope: Scope, session_id: uuid.UUID
) -> dict[tuple[int, str], datetime]:
    """When each pending input of a session was raised, by (raised seq, interrupt id)."""
    params = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
    rows = await conn.execute(sql.pending_statement(), params)
    return {(row.raised_seq, row.interrupt_id): row.raised_at for row in rows}


async def ask_again(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    asked: list[Asked],
    raised_at: dict[tuple[int, str], datetime] | None = None,
) -> int:
    """Write ``asked`` as pending inputs of the session; how many were not pending already.

    Each is raised at ``raised_at``'s time for it (the source's, for a
    fork), else when its message was appended. Router statements of
    :data:`cortex._sql.operator.QUESTION_ROWS` rows.
    """
    times = raised_at or {}
    inserted = 0
    for start in range(0, len(asked), QUESTION_ROWS):
        chunk = asked[start : start + QUESTION_ROWS]
        values: dict[str, Any] = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
        for j, one in enumerate(chunk):
            question = one.question
            values[row_name(Q_SEQ, j)] = one.seq
            values[row_name(Q_ID, j)] = question.interrupt_id
            values[row_name(Q_MESSAGE, j)] = question.message
            values[row_name(Q_AUTHOR, j)] = one.author
            values[row_name(Q_RAISED_AT, j)] = times.get(
                (one.seq, question.interrupt_id), one.asked_at
            )
            values[row_name(Q_SCHEMA, j)] = _json_or_none(question.response_schema)
            values[row_name(Q_PAYLOAD, j)] = _json_or_none(question.payload)
        inserted += len((await conn.execute(sql.ask_again_statement(len(chunk)), values)).all())
    return inserted


async def unask_after(conn: Tx, scope: Scope, session_id: uuid.UUID, to_seq: int) -> int:
    """Delete the pending inputs asked after ``to_seq``; how many there were."""
    params = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id, TO_SEQ: to_seq}
    return len((await conn.execute(sql.unask_after_statement(), params)).all())


async def set_pending_count(conn: Tx, scope: Scope, session_id: uuid.UUID, count: int) -> None:
    params = {**scope_params(scope), TARGET_ID: session_id, PENDING_COUNT: count}
    await conn.execute(sql.pending_count_statement(depth_class(scope)), params)
