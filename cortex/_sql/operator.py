"""The statements of the operator surface: pending inputs, abort and interrupt markers.

Each builder is cached (functools.cache): a statement shape is built and
compiled once, then reused with new bind values (cortex._calls.operator).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSON, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningDelete

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
    THROUGH_SEQ,
    TO_SEQ,
    array_param,
    int_param,
    row_name,
    scope_tenant_param,
    target_id_param,
    text_param,
)
from cortex._sql.predicates import path_clause, visible
from cortex._sql.sessions import SESSION_COLUMNS
from cortex._sql.tables import messages, pending_inputs, session_markers, sessions

__all__ = [
    "ABORTED",
    "INTERRUPTED",
    "PENDING_COLUMNS",
    "QUESTION_ROWS",
    "abort_statements",
    "answered_after_statement",
    "ask_again_statement",
    "ask_statement",
    "asked_before_statement",
    "delete_answered_statement",
    "interrupt_statements",
    "markers_statement",
    "pending_by_id_statement",
    "pending_count_statement",
    "pending_delta_statement",
    "pending_statement",
    "probe_statement",
    "questions_statement",
    "record_statement",
    "unask_after_statement",
]

ABORTED: Final = "aborted"
INTERRUPTED: Final = "interrupted"

# Questions per INSERT ... VALUES on Citus (one statement shape per count).
QUESTION_ROWS: Final = 8


def _same_session(table: sa.Table) -> sa.ColumnElement[bool]:
    return sa.and_(
        table.c.tenant_id == scope_tenant_param(), table.c.session_id == target_id_param()
    )


@cache
def record_statement(depth: int) -> sa.Update:
    """Insert the batch's open questions, delete what its answers resolve, recount.

    One statement. Sibling CTEs cannot see each other's rows, so questions
    answered inside the same batch are dropped in Python before binding;
    the DELETE then only meets questions from earlier appends. An answer
    resolves only questions raised before it (``raised_seq < seq``).
    """
    asked = (
        sa.func.unnest(
            array_param(Q_SEQS, sa.Integer()),
            array_param(Q_IDS, sa.Text()),
            array_param(Q_MESSAGES, sa.Text()),
            array_param(Q_AUTHORS, sa.Text()),
            array_param(Q_SCHEMAS, sa.Text()),
            array_param(Q_PAYLOADS, sa.Text()),
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
                "response_schema_json",
                "payload_json",
            ],
            sa.select(
                scope_tenant_param(),
                target_id_param(),
                asked.c.seq,
                asked.c.interrupt_id,
                asked.c.message,
                asked.c.author,
                # Not clock_timestamp(): VOLATILE, refused by Citus here.
                sa.func.statement_timestamp(),
                sa.cast(asked.c.response_schema, JSONB()),
                sa.cast(asked.c.payload, JSONB()),
                # The same texts, kept as written (revision 20261205000020).
                sa.cast(asked.c.response_schema, JSON()),
                sa.cast(asked.c.payload, JSON()),
            ),
        )
        .returning(pending_inputs.c.raised_seq)
        .cte("inserted")
    )
    answered = (
        sa.func.unnest(
            array_param(A_IDS, sa.Text()),
            array_param(A_SEQS, sa.Integer()),
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
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(pending_count=sessions.c.pending_count + delta)
        .add_cte(inserted)
        .add_cte(resolved)
    )


@cache
def delete_answered_statement() -> ReturningDelete[*tuple[Any, ...]]:
    """Delete the session's pending inputs the answers ``a_ids`` resolve (Citus: a router statement)."""
    return (
        sa.delete(pending_inputs)
        .where(
            _same_session(pending_inputs),
            pending_inputs.c.interrupt_id == sa.any_(array_param(A_IDS, sa.Text())),
        )
        .returning(pending_inputs.c.raised_seq)
    )


@cache
def ask_statement(count: int) -> sa.Insert:
    """``INSERT ... VALUES`` of ``count`` pending questions, bind names suffixed by row (Citus)."""
    rows = [
        {
            "tenant_id": scope_tenant_param(),
            "session_id": target_id_param(),
            "raised_seq": int_param(row_name(Q_SEQ, j)),
            "interrupt_id": text_param(row_name(Q_ID, j)),
            "message": text_param(row_name(Q_MESSAGE, j)),
            "author": text_param(row_name(Q_AUTHOR, j)),
            # Not clock_timestamp(): VOLATILE, refused by Citus here.
            "raised_at": sa.func.statement_timestamp(),
            "response_schema": sa.cast(text_param(row_name(Q_SCHEMA, j)), JSONB()),
            "payload": sa.cast(text_param(row_name(Q_PAYLOAD, j)), JSONB()),
            "response_schema_json": sa.cast(text_param(row_name(Q_SCHEMA, j)), JSON()),
            "payload_json": sa.cast(text_param(row_name(Q_PAYLOAD, j)), JSON()),
        }
        for j in range(count)
    ]
    return sa.insert(pending_inputs).values(rows)


@cache
def ask_again_statement(count: int) -> sa.Insert:
    """``INSERT ... VALUES`` of ``count`` pending questions, each with its own ``raised_at``; none twice.

    For a fork's questions and those a rewind re-opens: a question that is
    pending already keeps its row. Returns the rows it inserted.
    """
    rows = [
        {
            "tenant_id": scope_tenant_param(),
            "session_id": target_id_param(),
            "raised_seq": int_param(row_name(Q_SEQ, j)),
            "interrupt_id": text_param(row_name(Q_ID, j)),
            "message": text_param(row_name(Q_MESSAGE, j)),
            "author": text_param(row_name(Q_AUTHOR, j)),
            "raised_at": sa.bindparam(row_name(Q_RAISED_AT, j), type_=sa.DateTime(timezone=True)),
            "response_schema": sa.cast(text_param(row_name(Q_SCHEMA, j)), JSONB()),
            "payload": sa.cast(text_param(row_name(Q_PAYLOAD, j)), JSONB()),
        }
        for j in range(count)
    ]
    return (
        pg_insert(pending_inputs)
        .values(rows)
        .on_conflict_do_nothing(
            index_elements=[
                pending_inputs.c.tenant_id,
                pending_inputs.c.session_id,
                pending_inputs.c.raised_seq,
                pending_inputs.c.interrupt_id,
            ]
        )
        .returning(pending_inputs.c.raised_seq)
    )


@cache
def unask_after_statement() -> ReturningDelete[*tuple[Any, ...]]:
    """Delete the session's pending inputs asked after ``to_seq`` (a rewind removes their questions)."""
    return (
        sa.delete(pending_inputs)
        .where(_same_session(pending_inputs), pending_inputs.c.raised_seq > int_param(TO_SEQ))
        .returning(pending_inputs.c.raised_seq)
    )


@cache
def pending_count_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(pending_count=int_param(PENDING_COUNT))
    )


@cache
def pending_delta_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(pending_count=sessions.c.pending_count + int_param(PENDING_DELTA))
    )


@cache
def markers_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    return sa.select(session_markers.c.kind, session_markers.c.reason).where(
        path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
        session_markers.c.session_id == target_id_param(),
    )


def _verbatim(column: str) -> sa.Label[Any]:
    """A pending input's JSON as text: its json twin (revision 20261205000020), else its jsonb."""
    json_text, jsonb_text = (
        sa.cast(pending_inputs.c[name], sa.Text()) for name in (f"{column}_json", column)
    )
    return sa.func.coalesce(json_text, jsonb_text).label(column)


# What a pending input is read as (cortex._calls.rows.row_to_pending).
PENDING_COLUMNS: Final = (
    pending_inputs.c.interrupt_id,
    pending_inputs.c.message,
    pending_inputs.c.author,
    pending_inputs.c.raised_at,
    pending_inputs.c.raised_seq,
    _verbatim("response_schema"),
    _verbatim("payload"),
)


@cache
def pending_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(*PENDING_COLUMNS)
        .where(_same_session(pending_inputs))
        .order_by(pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id)
    )


def _marker_insert(kind: str) -> Any:
    return pg_insert(session_markers).values(
        tenant_id=scope_tenant_param(),
        session_id=target_id_param(),
        kind=kind,
        scope=text_param(MARKER_SCOPE),
        reason=text_param(REASON),
        marked_at=sa.func.statement_timestamp(),  # not VOLATILE clock_timestamp(): Citus
    )


@cache
def abort_statements(depth: int) -> tuple[Any, sa.Delete, sa.Update]:
    marker = _marker_insert(ABORTED).on_conflict_do_nothing().returning(session_markers.c.kind)
    clear = sa.delete(pending_inputs).where(_same_session(pending_inputs))
    flag = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(is_aborted=True, pending_count=0)
        .returning(*SESSION_COLUMNS)
    )
    return marker, clear, flag


@cache
def interrupt_statements(depth: int) -> tuple[Any, Any, sa.Update, sa.Delete, sa.Update]:
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
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(is_interrupted=True)
        .returning(sessions.c.scope)
    )
    remove = sa.delete(session_markers).where(
        path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
        session_markers.c.session_id == target_id_param(),
        session_markers.c.kind == INTERRUPTED,
    )
    unflag = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param(), sessions.c.is_interrupted)
        .values(is_interrupted=False)
    )
    return mark, park, flag, remove, unflag


@cache
def probe_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The session with this id anywhere in the tenant, and whether the scope sees it."""
    return sa.select(sessions.c.scope, visible(depth).label("is_visible")).where(
        sessions.c.tenant_id == scope_tenant_param(), sessions.c.id == target_id_param()
    )


@cache
def asked_before_statement() -> sa.Select[tuple[bool]]:
    return sa.select(
        sa.exists().where(
            messages.c.tenant_id == scope_tenant_param(),
            messages.c.session_id == target_id_param(),
            sa.or_(
                messages.c.requested_input["interrupt_id"].astext == text_param(INTERRUPT_ID),
                # A message's further questions (revision 20261201000013).
                # Qualified: the variadic "any" built-ins lose to any exact signature.
                messages.c.more_requested_inputs.contains(
                    sa.func.pg_catalog.jsonb_build_array(
                        sa.func.pg_catalog.jsonb_build_object(
                            "interrupt_id", text_param(INTERRUPT_ID)
                        )
                    )
                ),
            ),
        )
    )


@cache
def pending_by_id_statement() -> sa.Select[*tuple[Any, ...]]:
    """The raised seq and response schema (jsonb: checking an answer needs no key order) of each question ``interrupt_id`` names."""
    return (
        sa.select(pending_inputs.c.raised_seq, pending_inputs.c.response_schema)
        .where(
            _same_session(pending_inputs),
            pending_inputs.c.interrupt_id == text_param(INTERRUPT_ID),
        )
        .order_by(pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id)
    )


@cache
def questions_statement() -> sa.Select[*tuple[Any, ...]]:
    """What decides a session's pending inputs up to ``through_seq``: its questions, and its answers' ids.

    Only the messages that ask or answer, and of an answer only its ids
    (``answer_id``, ``more_answer_ids``): a response's body can be large,
    and it decides nothing here.
    """
    return (
        sa.select(
            messages.c.seq,
            messages.c.author,
            messages.c.created_at,
            messages.c.requested_input,
            messages.c.more_requested_inputs,
            messages.c.function_response["id"].astext.label("answer_id"),
            _answer_ids(messages.c.more_function_responses).label("more_answer_ids"),
        )
        .where(
            _same_session(messages),
            messages.c.seq <= int_param(THROUGH_SEQ),
            sa.or_(
                messages.c.requested_input.is_not(None), messages.c.function_response.is_not(None)
            ),
        )
        .order_by(messages.c.seq)
    )


def _answer_ids(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    # Qualified: jsonb_path_query_array(jsonb, jsonpath) loses to another role's exact signature.
    return sa.func.pg_catalog.jsonb_path_query_array(
        column, sa.literal_column("'$[*].id'::pg_catalog.jsonpath"), type_=JSONB()
    )


@cache
def answered_after_statement() -> sa.Select[*tuple[Any, ...]]:
    """The ids the answers after ``to_seq`` give: what a rewind to ``to_seq`` takes back."""
    return sa.select(
        messages.c.function_response["id"].astext.label("answer_id"),
        _answer_ids(messages.c.more_function_responses).label("more_answer_ids"),
    ).where(
        _same_session(messages),
        messages.c.seq > int_param(TO_SEQ),
        messages.c.function_response.is_not(None),
    )
