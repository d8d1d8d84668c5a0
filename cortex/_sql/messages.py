"""The statements on messages: the one-statement append, reads by position, removal.

Each builder is cached (functools.cache): a statement shape is built and
compiled once, then reused with new bind values (cortex._calls.messages).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, JSON, JSONB, UUID

from cortex._sql.params import (
    AFTER_SEQ,
    BATCH_SIZE,
    BEFORE_SEQ,
    COPY_BASE,
    COPY_IDS,
    DATA_DELTA,
    DELTAS_DIGEST,
    EXPECTED_COUNT,
    K_AUTHORS,
    K_CONTENT_HASHES,
    K_IDS,
    K_METADATA_HASHES,
    K_MORE_REQUESTED,
    K_MORE_RESPONSES,
    K_PAYLOAD_HASHES,
    K_REQUESTED,
    K_RESPONSES,
    K_ROLES,
    LAST_SEQ,
    LIMIT,
    M_AUTHOR,
    M_AUTHORS,
    M_CONTENT,
    M_CONTENTS,
    M_CREATED_AT,
    M_DIGEST,
    M_ID,
    M_IDS,
    M_METADATA,
    M_MORE_REQUESTED,
    M_MORE_RESPONSES,
    M_PAYLOAD,
    M_PAYLOADS,
    M_REQUESTED,
    M_RESPONSE,
    M_RESPONSES,
    M_ROLE,
    M_ROLES,
    M_SEQ,
    PENDING_COUNT,
    PREVIEW,
    SINCE,
    SOURCE_ID,
    THROUGH_SEQ,
    TO_SEQ,
    array_param,
    bytes_param,
    int_param,
    row_name,
    scope_tenant_param,
    target_id_param,
    text_param,
    uuid_param,
)
from cortex._sql.predicates import visible
from cortex._sql.sessions import SESSION_COLUMNS
from cortex._sql.tables import bounded_data, messages, pending_inputs, sessions
from cortex.models import PREVIEW_LENGTH

__all__ = [
    "HISTORY_PREFIX",
    "LAST_SEQ_COLUMN",
    "MESSAGE_COLUMNS",
    "METADATA_TEXT",
    "ROUTED_BATCH",
    "Composite",
    "append_statement",
    "bump_statement",
    "clear_statements",
    "copy_statement",
    "history_statement",
    "inputs_statement",
    "insert_rows_statement",
    "page_statement",
    "pop_statements",
    "preview_statement",
    "rewind_statements",
    "routed_append",
    "stored_statement",
    "zero_pending_statement",
]

# The stored metadata as text: the verbatim JSON (revision 20261201000009),
# else the jsonb of a row written before it. Decoded by row_to_message.
METADATA_TEXT: Final = sa.func.coalesce(
    sa.cast(messages.c.metadata_json, sa.Text()), sa.cast(messages.c.metadata, sa.Text())
)

# The label prefix of the message columns beside a session's own (history_statement).
HISTORY_PREFIX: Final = "m_"


def _verbatim(column: str) -> sa.Label[Any]:
    """A question or answer column as text: its json twin (revision 20261205000020), else its jsonb.

    Labelled with the jsonb column's name; decoded by row_to_message.
    """
    return sa.func.coalesce(
        sa.cast(messages.c[f"{column}_json"], sa.Text()), sa.cast(messages.c[column], sa.Text())
    ).label(column)


# The label of the position of a session's last message in the counter
# UPDATE's RETURNING (trimmed_count + message_count).
LAST_SEQ_COLUMN: Final = "last_seq"

MESSAGE_COLUMNS: Final = (
    messages.c.id,
    messages.c.session_id,
    messages.c.seq,
    messages.c.role,
    messages.c.content,
    messages.c.author,
    _verbatim("requested_input"),
    _verbatim("function_response"),
    _verbatim("more_requested_inputs"),
    _verbatim("more_function_responses"),
    METADATA_TEXT.label("metadata"),
    sa.cast(messages.c.payload_json, sa.Text()).label("payload"),
    messages.c.created_at,
)


@dataclass(frozen=True, eq=False)  # statements compare by identity (== builds SQL)
class Composite:
    """Two statements as one routine: ``first`` (an UPDATE ... RETURNING one row), then ``then``.

    ``fed`` names binds of ``then`` that take a column ``first`` returned
    (``{"m_seq_0": "last_seq"}``); the routine's rows are ``then``'s, or
    none when ``first`` matched no row. cortex._db.executor.compile_composite
    gives its parameters and its routine's key.
    """

    first: sa.ClauseElement
    then: sa.ClauseElement
    fed: tuple[tuple[str, str], ...]


@cache
def bump_statement(depth: int, with_data: bool = False, expected: bool = False) -> sa.Update:
    """Raise a visible session's counter by ``batch_size`` and move its preview, under its row lock.

    Returns the new ``last_seq`` (``trimmed_count + message_count``, which
    numbers the batch: a trimmed session's positions go on after its kept
    messages) and ``updated_at`` (the messages' ``created_at``). ``with_data``: the same
    UPDATE merges the session's state delta (``data_delta``) into its
    document, so the state changes in the statement that appends the
    messages carrying it. ``expected``: it matches only while
    ``message_count`` equals ``expected_count`` (an optimistic check made
    under the row lock, so of two writers that read the same count exactly
    one appends).
    """
    n = int_param(BATCH_SIZE)
    values: dict[str, Any] = {
        "message_count": sessions.c.message_count + n,
        "last_message": text_param(PREVIEW),
        # greatest(): appends queue on the row lock, so a later statement
        # must never move updated_at backwards. statement_timestamp(), not
        # clock_timestamp(): Citus refuses VOLATILE functions in an UPDATE
        # of a distributed table.
        "updated_at": sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
    }
    if with_data:
        values["data"] = bounded_data(
            sa.func.coalesce(sessions.c.data, sa.text("'{}'::jsonb")).op("||")(
                sa.cast(text_param(DATA_DELTA), JSONB())
            )
        )
    where = [visible(depth), sessions.c.id == target_id_param()]
    if expected:
        where.append(sessions.c.message_count == int_param(EXPECTED_COUNT))
    return (
        sa.update(sessions)
        .where(*where)
        .values(**values)
        .returning(
            sessions.c.tenant_id,
            sessions.c.id,
            (sessions.c.trimmed_count + sessions.c.message_count).label(LAST_SEQ_COLUMN),
            sessions.c.updated_at,
        )
    )


# Each question and answer is written twice from one text: jsonb, which
# statements search, and a json twin, which keeps the text as written.
_INPUT_COLUMNS: Final = (
    "requested_input",
    "function_response",
    "more_requested_inputs",
    "more_function_responses",
)
_INPUT_COLUMNS_WRITTEN: Final = (
    *_INPUT_COLUMNS,
    *(f"{column}_json" for column in _INPUT_COLUMNS),
)


def _inputs(*texts: sa.ColumnElement[Any]) -> dict[str, sa.ColumnElement[Any]]:
    """The values of _INPUT_COLUMNS_WRITTEN, in its order: the four texts as jsonb, then as json."""
    return {
        **{c: sa.cast(t, JSONB()) for c, t in zip(_INPUT_COLUMNS, texts, strict=True)},
        **{f"{c}_json": sa.cast(t, JSON()) for c, t in zip(_INPUT_COLUMNS, texts, strict=True)},
    }


# On Citus the rows of an append go in INSERT ... VALUES statements of at
# most this many rows (one shape per size, so the shapes stay few).
ROUTED_BATCH: Final = 32


@cache
def insert_rows_statement(count: int) -> sa.Insert:
    """``INSERT ... VALUES`` of ``count`` messages, numbered by the caller (distributed databases).

    Bind names are suffixed with the row's position; the tenant, session and
    ``created_at`` are shared. One shape per batch size (at most
    :data:`ROUTED_BATCH` of them).
    """
    rows = [
        {
            "tenant_id": scope_tenant_param(),
            "id": uuid_param(row_name(M_ID, i)),
            "session_id": target_id_param(),
            "seq": int_param(row_name(M_SEQ, i)),
            "role": text_param(row_name(M_ROLE, i)),
            "content": text_param(row_name(M_CONTENT, i)),
            "author": text_param(row_name(M_AUTHOR, i)),
            **_inputs(
                text_param(row_name(M_REQUESTED, i)),
                text_param(row_name(M_RESPONSE, i)),
                text_param(row_name(M_MORE_REQUESTED, i)),
                text_param(row_name(M_MORE_RESPONSES, i)),
            ),
            # The host's JSON text, verbatim (json keeps its input text exactly).
            "metadata_json": sa.cast(text_param(row_name(M_METADATA, i)), JSON()),
            "payload_json": sa.cast(text_param(row_name(M_PAYLOAD, i)), JSON()),
            "deltas_digest": bytes_param(row_name(M_DIGEST, i)),
            "created_at": sa.bindparam(M_CREATED_AT, type_=sa.DateTime(timezone=True)),
        }
        for i in range(count)
    ]
    return (
        sa.insert(messages)
        .values(rows)
        .returning(messages.c.id, messages.c.seq, messages.c.created_at)
    )


@cache
def routed_append(depth: int, with_data: bool = False, expected: bool = False) -> Composite:
    """One message appended on Citus as one routine: the counter UPDATE, then the row.

    The row's ``seq`` is the new ``last_seq`` and its ``created_at`` the
    session's new ``updated_at``, both taken inside the routine, under the
    row lock the UPDATE holds until the call's implicit COMMIT.
    """
    return Composite(
        bump_statement(depth, with_data, expected),
        insert_rows_statement(1),
        ((row_name(M_SEQ, 0), LAST_SEQ_COLUMN), (M_CREATED_AT, "updated_at")),
    )


@cache
def append_statement(
    depth: int, with_data: bool = False, expected: bool = False, single: bool = False
) -> sa.Insert:
    """One statement: raise the counter under the row lock, then insert the rows.

    The UPDATE runs first (a data-modifying CTE) and takes the session's row
    lock; concurrent appends to the same session queue on it. The new
    ``last_seq`` it returns numbers the batch, so ``seq`` is gap-free and
    the count equals the rows in every committed state. One round trip: the
    lock is held for one statement plus COMMIT, not across client round trips
    (docs/append-cost.md). If the session is not visible the UPDATE matches
    nothing and so does the INSERT.

    RETURNING gives back only what the caller lacks (id, seq, created_at), so
    a large batch's contents never travel back.

    ``with_data``: the same UPDATE merges the session's state delta
    (``data_delta``) into its document, so the state changes in the
    statement that appends the messages carrying it. ``expected``: the
    UPDATE matches only while ``message_count`` equals ``expected_count``
    (an optimistic check made under the row lock, so of two writers that
    read the same count exactly one appends).

    ``single``: one message, its fields bound as scalars (the names of row 0
    of :func:`insert_rows_statement`) rather than as ten one-element arrays
    to unnest, which costs the most frequent append less CPU (docs/benchmarks.md).
    """
    touched = bump_statement(depth, with_data, expected).cte("touched")
    if single:
        return _insert_appended(touched, _one_message_source(touched))
    n = int_param(BATCH_SIZE)
    rows = (
        sa.func.unnest(
            array_param(M_IDS, UUID(as_uuid=True)),
            array_param(M_ROLES, sa.Text()),
            array_param(M_CONTENTS, sa.Text()),
            array_param(M_AUTHORS, sa.Text()),
            array_param(M_REQUESTED, sa.Text()),
            array_param(M_RESPONSES, sa.Text()),
            array_param(M_MORE_REQUESTED, sa.Text()),
            array_param(M_MORE_RESPONSES, sa.Text()),
            array_param(M_METADATA, sa.Text()),
            array_param(M_PAYLOADS, sa.Text()),
        )
        .table_valued(
            sa.column("id", UUID(as_uuid=True)),
            sa.column("role", sa.Text()),
            sa.column("content", sa.Text()),
            sa.column("author", sa.Text()),
            sa.column("requested", sa.Text()),
            sa.column("response", sa.Text()),
            sa.column("more_requested", sa.Text()),
            sa.column("more_responses", sa.Text()),
            sa.column("meta", sa.Text()),
            sa.column("payload", sa.Text()),
            with_ordinality="ord",
            name="batch",
        )
        .render_derived()
    )
    source = sa.select(
        touched.c.tenant_id,
        rows.c.id,
        touched.c.id,
        touched.c[LAST_SEQ_COLUMN] - n + rows.c.ord,
        rows.c.role,
        rows.c.content,
        rows.c.author,
        *_inputs(
            rows.c.requested, rows.c.response, rows.c.more_requested, rows.c.more_responses
        ).values(),
        # The host's JSON text, verbatim (json keeps its input text exactly).
        sa.cast(rows.c.meta, JSON()),
        sa.cast(rows.c.payload, JSON()),
        # The deltas digest goes with the batch's first message only.
        sa.case(
            (rows.c.ord == sa.literal_column("1"), bytes_param(DELTAS_DIGEST)),
            else_=sa.null(),
        ),
        touched.c.updated_at,
    ).select_from(touched.join(rows, sa.true()))
    return _insert_appended(touched, source)


def _one_message_source(touched: sa.CTE) -> sa.Select[Any]:
    """The one message of a ``single`` append, numbered by the position the UPDATE returned.

    Its bind names are those of row 0 of :func:`insert_rows_statement`, so
    the same values serve both.
    """
    return sa.select(
        touched.c.tenant_id,
        uuid_param(row_name(M_ID, 0)),
        touched.c.id,
        touched.c[LAST_SEQ_COLUMN],
        text_param(row_name(M_ROLE, 0)),
        text_param(row_name(M_CONTENT, 0)),
        text_param(row_name(M_AUTHOR, 0)),
        *_inputs(
            text_param(row_name(M_REQUESTED, 0)),
            text_param(row_name(M_RESPONSE, 0)),
            text_param(row_name(M_MORE_REQUESTED, 0)),
            text_param(row_name(M_MORE_RESPONSES, 0)),
        ).values(),
        sa.cast(text_param(row_name(M_METADATA, 0)), JSON()),
        sa.cast(text_param(row_name(M_PAYLOAD, 0)), JSON()),
        bytes_param(row_name(M_DIGEST, 0)),
        touched.c.updated_at,
    ).select_from(touched)


def _insert_appended(touched: sa.CTE, source: sa.Select[Any]) -> sa.Insert:
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
                *_INPUT_COLUMNS_WRITTEN,
                "metadata_json",
                "payload_json",
                "deltas_digest",
                "created_at",
            ],
            source,
        )
        .returning(messages.c.id, messages.c.seq, messages.c.created_at)
        .add_cte(touched)
    )


def _sha256(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bytes]:
    # Qualified: convert_to(text, name) loses to another role's convert_to(text, text).
    return sa.func.pg_catalog.sha256(
        sa.func.pg_catalog.convert_to(column, sa.literal_column("'UTF8'"))
    )


@cache
def stored_statement() -> sa.Select[*tuple[Any, ...]]:
    """Stored messages with the batch's caller-chosen ids, and whether each is the same message.

    Contents and metadata are compared by SHA-256, so a retry does not send
    the batch twice; the questions and answers (small) as jsonb.
    """
    keys = (
        sa.func.unnest(
            array_param(K_IDS, UUID(as_uuid=True)),
            array_param(K_ROLES, sa.Text()),
            array_param(K_CONTENT_HASHES, BYTEA()),
            array_param(K_AUTHORS, sa.Text()),
            array_param(K_REQUESTED, sa.Text()),
            array_param(K_RESPONSES, sa.Text()),
            array_param(K_MORE_REQUESTED, sa.Text()),
            array_param(K_MORE_RESPONSES, sa.Text()),
            array_param(K_METADATA_HASHES, BYTEA()),
            array_param(K_PAYLOAD_HASHES, BYTEA()),
        )
        .table_valued(
            sa.column("id", UUID(as_uuid=True)),
            sa.column("role", sa.Text()),
            sa.column("content_hash", BYTEA()),
            sa.column("author", sa.Text()),
            sa.column("requested", sa.Text()),
            sa.column("response", sa.Text()),
            sa.column("more_requested", sa.Text()),
            sa.column("more_responses", sa.Text()),
            sa.column("meta_hash", BYTEA()),
            sa.column("payload_hash", BYTEA()),
            name="keyed",
        )
        .render_derived()
    )
    same = sa.and_(
        messages.c.session_id == target_id_param(),
        messages.c.role == keys.c.role,
        messages.c.author == keys.c.author,
        _sha256(messages.c.content) == keys.c.content_hash,
        messages.c.requested_input.is_not_distinct_from(sa.cast(keys.c.requested, JSONB())),
        messages.c.function_response.is_not_distinct_from(sa.cast(keys.c.response, JSONB())),
        messages.c.more_requested_inputs.is_not_distinct_from(
            sa.cast(keys.c.more_requested, JSONB())
        ),
        messages.c.more_function_responses.is_not_distinct_from(
            sa.cast(keys.c.more_responses, JSONB())
        ),
        _sha256(METADATA_TEXT) == keys.c.meta_hash,
        _sha256(sa.cast(messages.c.payload_json, sa.Text())).is_not_distinct_from(
            keys.c.payload_hash
        ),
    )
    return sa.select(
        messages.c.id,
        messages.c.seq,
        messages.c.created_at,
        messages.c.deltas_digest,
        same.label("same"),
    ).select_from(
        keys.join(
            messages,
            sa.and_(
                messages.c.tenant_id == scope_tenant_param(),
                messages.c.id == keys.c.id,
            ),
        )
    )


@cache
def page_statement(
    depth: int, *, newest_first: bool, since: bool = False
) -> sa.Select[*tuple[Any, ...]]:
    """A page of a visible session's messages by position: one scan of its seq index.

    Forward (``seq > after_seq``, oldest first) or backward (``seq <
    before_seq``, newest first): either way a walk of ``uq_messages_session_seq
    (tenant_id, session_id, seq)`` that stops after the page, so a page costs
    the same however long the conversation is and however deep the page lies.
    ``since``: only messages created after the bound ``since``, which are
    the conversation's tail: the walk starts after the last message created
    at or before it (:func:`_since_boundary`), not at the first message.
    """
    seq = messages.c.seq
    if newest_first:
        bound = seq < int_param(BEFORE_SEQ)
    elif since:
        after = int_param(AFTER_SEQ)
        bound = seq > sa.func.greatest(after, _since_boundary(depth))
    else:
        bound = seq > int_param(AFTER_SEQ)
    return (
        sa.select(*MESSAGE_COLUMNS)
        .join(
            sessions,
            sa.and_(
                sessions.c.tenant_id == messages.c.tenant_id,
                sessions.c.id == messages.c.session_id,
            ),
        )
        .where(
            visible(depth),
            sessions.c.id == target_id_param(),
            messages.c.tenant_id == scope_tenant_param(),
            bound,
        )
        .order_by(seq.desc() if newest_first else seq)
        .limit(int_param(LIMIT))
    )


def _since_boundary(depth: int) -> sa.ScalarSelect[Any]:
    """The last ``seq`` created at or before ``:since`` (0 for none): a binary search.

    created_at never decreases along seq (it is the session's updated_at,
    moved with greatest() under the row lock), and seq runs from
    trimmed_count + 1 to trimmed_count + message_count without a gap, so
    the boundary is found with about log2(message_count) lookups of
    ``uq_messages_session_seq``, each one index probe: 21 for a million
    messages, where a filter on created_at walked every message from the
    first. The invariant: ``lo`` is created at or before ``:since``
    (trimmed_count stands before the first), ``hi`` after it
    (trimmed_count + message_count + 1 stands after the last); the search
    ends when they meet.
    """
    since = sa.bindparam(SINCE, type_=sa.DateTime(timezone=True))
    two: sa.ColumnClause[Any] = sa.literal_column("2")
    first = sessions.c.trimmed_count
    end = sessions.c.trimmed_count + sessions.c.message_count + sa.literal_column("1")
    start = (
        sa.select(
            first.label("lo"),
            end.label("hi"),
            ((first + end).self_group().op("/")(two)).label("mid"),
        )
        .where(visible(depth), sessions.c.id == target_id_param())
        .cte("since_search", recursive=True)
    )
    # One index probe per step: a scalar subquery on the work table's own
    # ``mid`` (arithmetic in the probe's condition is not leakproof, so row-level
    # security would make it a filter), in a LATERAL that OFFSET 0 keeps unflattened.
    later = (
        sa.select(messages.c.created_at > since)
        .where(
            messages.c.tenant_id == scope_tenant_param(),
            messages.c.session_id == target_id_param(),
            messages.c.seq == start.c.mid,
        )
        .correlate(start)
        .scalar_subquery()
    )
    probe = sa.select(later.label("later")).offset(0).correlate(start).lateral("probe")
    lo = sa.case((probe.c.later, start.c.lo), else_=start.c.mid)
    hi = sa.case((probe.c.later, start.c.mid), else_=start.c.hi)
    step = (
        sa.select(lo, hi, (lo + hi).self_group().op("/")(two))
        .select_from(start)
        .join(probe, sa.true())
        .where(start.c.hi - start.c.lo > sa.literal_column("1"))
    )
    search = start.union_all(step)
    return sa.select(sa.func.max(search.c.lo)).scalar_subquery()


@cache
def history_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The session's columns, each row joined to one of its newest messages (or none).

    The first row (the oldest message of the page, or none) alone carries the state.

    One statement is one snapshot under READ COMMITTED, so the counter and the
    messages agree even while appends commit between two reads. Message
    columns are labelled ``m_…`` beside the session's own.
    """
    recent = (
        sa.select(*MESSAGE_COLUMNS)
        .where(
            # The bound tenant, not sessions.tenant_id: with the policy's
            # tenant_id = current_setting(...) that equivalence would yield a
            # pseudoconstant qual, which Citus refuses in an outer join
            # (PostgreSQL 15 and 16). visible() binds the same parameter.
            messages.c.tenant_id == scope_tenant_param(),
            messages.c.session_id == sessions.c.id,
        )
        .order_by(messages.c.seq.desc())
        .limit(int_param(LIMIT))
        .lateral("recent")
    )
    # The merged state on the first row only: a row per message would carry
    # (and the server print) every ancestor's document once per message.
    first = recent.c.seq.is_not_distinct_from(sa.func.min(recent.c.seq).over())
    columns = [
        sa.case((first, column), else_=sa.null()).label("data") if column.name == "data" else column
        for column in SESSION_COLUMNS
    ]
    return (
        sa.select(*columns, *(c.label(f"{HISTORY_PREFIX}{c.name}") for c in recent.c))
        # ON a real condition (implied by the lateral's own), not ON true:
        # Citus refuses an outer join on a constant (PostgreSQL 15 and 16).
        .select_from(sessions.outerjoin(recent, recent.c.session_id == sessions.c.id))
        .where(visible(depth), sessions.c.id == target_id_param())
        .order_by(recent.c.seq)
    )


# --- removing messages -------------------------------------------------------------


def _own_messages() -> sa.ColumnElement[bool]:
    return sa.and_(
        messages.c.tenant_id == scope_tenant_param(),
        messages.c.session_id == target_id_param(),
    )


@cache
def pop_statements(depth: int) -> tuple[Any, sa.Update]:
    """Delete the message at ``seq = last_seq``; recount and re-preview the session."""
    delete = (
        sa.delete(messages)
        .where(_own_messages(), messages.c.seq == int_param(LAST_SEQ))
        .returning(*MESSAGE_COLUMNS)
    )
    previous = (
        sa.select(sa.func.left(messages.c.content, PREVIEW_LENGTH))
        .where(_own_messages(), messages.c.seq == int_param(LAST_SEQ) - 1)
        .scalar_subquery()
    )
    recount = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(
            message_count=sessions.c.message_count - 1,
            last_message=sa.func.coalesce(previous, ""),
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
    )
    return delete, recount


@cache
def clear_statements(depth: int) -> tuple[sa.Delete, sa.Delete, sa.Update]:
    delete = sa.delete(messages).where(_own_messages())
    unpend = sa.delete(pending_inputs).where(
        pending_inputs.c.tenant_id == scope_tenant_param(),
        pending_inputs.c.session_id == target_id_param(),
    )
    reset = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(
            message_count=0,
            # Positions start again at 1, as in a new session.
            trimmed_count=0,
            last_message="",
            pending_count=0,
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )
    return delete, unpend, reset


@cache
def inputs_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(*MESSAGE_COLUMNS)
        .where(
            _own_messages(),
            sa.or_(
                messages.c.requested_input.is_not(None), messages.c.function_response.is_not(None)
            ),
        )
        .order_by(messages.c.seq)
    )


@cache
def zero_pending_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(pending_count=0)
    )


# --- forking and rewinding ------------------------------------------------------------


@cache
def preview_statement() -> sa.Select[tuple[str]]:
    """The preview a session shows when the message at ``through_seq`` is its last."""
    return sa.select(sa.func.left(messages.c.content, PREVIEW_LENGTH)).where(
        _own_messages(), messages.c.seq == int_param(THROUGH_SEQ)
    )


@cache
def copy_statement() -> sa.Insert:
    """Copy the messages of ``source_id`` after ``copy_base`` through ``through_seq`` into ``target_id``.

    One INSERT ... SELECT, each copy under its new id (``copy_ids``, in seq
    order: the n-th id goes to seq ``copy_base + n``) with the original's
    seq, fields and ``created_at``. A keyed append's digest stays with the
    original (a replay of that append finds the original by its ids). Both
    sessions are the tenant's, so Citus runs it on the tenant's shard.
    """
    fresh = (
        sa.func.unnest(array_param(COPY_IDS, UUID(as_uuid=True)))
        .table_valued(sa.column("id", UUID(as_uuid=True)), with_ordinality="ord", name="fresh")
        .render_derived()
    )
    base = int_param(COPY_BASE)
    columns: dict[str, Any] = {
        "tenant_id": messages.c.tenant_id,
        "id": fresh.c.id,
        "session_id": target_id_param(),
        "seq": messages.c.seq,
        "role": messages.c.role,
        "content": messages.c.content,
        "author": messages.c.author,
        "requested_input": messages.c.requested_input,
        "function_response": messages.c.function_response,
        "more_requested_inputs": messages.c.more_requested_inputs,
        "more_function_responses": messages.c.more_function_responses,
        "metadata": messages.c.metadata,
        "metadata_json": messages.c.metadata_json,
        "payload_json": messages.c.payload_json,
        "created_at": messages.c.created_at,
    }
    source = (
        sa.select(*(value.label(name) for name, value in columns.items()))
        .select_from(messages.join(fresh, messages.c.seq == base + fresh.c.ord))
        .where(
            messages.c.tenant_id == scope_tenant_param(),
            messages.c.session_id == uuid_param(SOURCE_ID),
            messages.c.seq > base,
            messages.c.seq <= int_param(THROUGH_SEQ),
        )
    )
    # No RETURNING: Citus fails an INSERT ... SELECT it runs on a shard with one.
    return sa.insert(messages).from_select(list(columns), source)


@cache
def rewind_statements(depth: int) -> tuple[sa.Delete, sa.Update]:
    """Delete the messages after ``to_seq``; set the counters and preview to what remains.

    Run under the session's row lock (taken first, ``FOR UPDATE``), so no
    append interleaves: ``message_count`` becomes ``to_seq``, exactly the
    rows left, and ``pending_count`` the caller's recount.
    """
    delete = sa.delete(messages).where(_own_messages(), messages.c.seq > int_param(TO_SEQ))
    last = (
        sa.select(sa.func.left(messages.c.content, PREVIEW_LENGTH))
        .where(_own_messages(), messages.c.seq == int_param(TO_SEQ))
        .scalar_subquery()
    )
    recount = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(
            message_count=int_param(TO_SEQ),
            last_message=sa.func.coalesce(last, ""),
            pending_count=int_param(PENDING_COUNT),
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )
    return delete, recount
