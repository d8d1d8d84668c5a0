"""SQL for messages: the one-statement append and the read by position.

Plain ``async def`` functions taking ``(conn, scope, ...)``; no commits.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Final, NamedTuple

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSON, JSONB, UUID

from cortex._db.executor import Composite, Row, Tx
from cortex._db.transaction import RetryTransaction
from cortex._filters import depth_class, scope_params, visible
from cortex._operator import record_inputs
from cortex._sessions import (
    SESSION_COLUMNS,
    data_too_large,
    deltas_digest,
    merge_scope_data,
    row_to_session,
    select_session,
)
from cortex._tables import bounded_data, messages, pending_inputs, sessions
from cortex._validate import decode_json, encode_json, encoded_again
from cortex.errors import Conflict, InvalidInput, NotFound
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, format_id, new_uuid, parse_id
from cortex.models import (
    MAX_APPEND_BYTES,
    MAX_JSON_BYTES,
    MAX_PAYLOAD_BYTES,
    PREVIEW_LENGTH,
    FunctionResponse,
    Message,
    NewMessage,
    RequestedInput,
    Session,
    SessionState,
    from_database,
    session_uuid,
)
from cortex.scope import Scope

__all__ = [
    "EncodedBatch",
    "SessionHistory",
    "append_messages",
    "clear_messages",
    "encode_batch",
    "list_messages",
    "pop_message",
    "recent_messages",
    "row_to_message",
    "select_session_with_messages",
]

# The stored metadata as text: the verbatim JSON (revision 20261201000009),
# else the jsonb of a row written before it. Decoded by row_to_message.
METADATA_TEXT: Final = sa.func.coalesce(
    sa.cast(messages.c.metadata_json, sa.Text()), sa.cast(messages.c.metadata, sa.Text())
)

_MESSAGE_COLUMNS: Final = (
    messages.c.id,
    messages.c.session_id,
    messages.c.seq,
    messages.c.role,
    messages.c.content,
    messages.c.author,
    messages.c.requested_input,
    messages.c.function_response,
    messages.c.more_requested_inputs,
    messages.c.more_function_responses,
    METADATA_TEXT.label("metadata"),
    sa.cast(messages.c.payload_json, sa.Text()).label("payload"),
    messages.c.created_at,
)


def row_to_message(row: Row, prefix: str = "") -> Message:
    """Build the public model from a row selected with the message columns.

    ``prefix``: the columns are labelled ``<prefix><name>`` (a join beside
    another table's columns, as in :func:`select_session_with_messages`).
    """
    requested, response = row[prefix + "requested_input"], row[prefix + "function_response"]
    questions = [] if requested is None else [RequestedInput.model_construct(**requested)]
    answers = [] if response is None else [FunctionResponse.model_construct(**response)]
    more = row[prefix + "more_requested_inputs"]
    if more is not None:
        questions += [RequestedInput.model_construct(**q) for q in more]
    more = row[prefix + "more_function_responses"]
    if more is not None:
        answers += [FunctionResponse.model_construct(**a) for a in more]
    payload = row[prefix + "payload"]
    return from_database(
        Message,
        {
            "id": format_id(MESSAGE_PREFIX, row[prefix + "id"]),
            "session_id": format_id(SESSION_PREFIX, row[prefix + "session_id"]),
            "seq": row[prefix + "seq"],
            "role": row[prefix + "role"],
            "content": row[prefix + "content"],
            "author": row[prefix + "author"],
            "requested_inputs": questions,
            "function_responses": answers,
            "metadata": decode_json(row[prefix + "metadata"]),
            "payload": None if payload is None else decode_json(payload),
            "created_at": row[prefix + "created_at"],
        },
    )


@dataclass(frozen=True)
class EncodedBatch:
    """A validated batch, serialised once, before any transaction (and reused by its retries)."""

    messages: list[NewMessage]
    ids: list[uuid.UUID]
    # Which messages carry a caller-chosen id (their idempotency key).
    keyed: list[bool]
    requested: list[str | None]
    responses: list[str | None]
    # The questions and answers after each message's first, as JSON arrays (or None).
    more_requested: list[str | None]
    more_responses: list[str | None]
    metadata: list[str]
    payloads: list[str | None]
    size: int


def _model_json(value: RequestedInput | FunctionResponse | None) -> str | None:
    if value is None:
        return None
    return encode_json(value.model_dump(mode="json"), MAX_APPEND_BYTES)


def _more_json(values: list[RequestedInput] | list[FunctionResponse]) -> str | None:
    """The questions (or answers) after the first, as one JSON array; None if there are none."""
    if len(values) < 2:
        return None
    return encode_json([v.model_dump(mode="json") for v in values[1:]], MAX_APPEND_BYTES)


def _size(text: str | None) -> int:
    if text is None:
        return 0
    return len(text) if text.isascii() else len(text.encode())


def encode_batch(batch: list[NewMessage]) -> EncodedBatch:
    """Serialise a validated batch and check what only the whole batch can break.

    Raises:
        InvalidInput: more than MAX_APPEND_BYTES in all, or one id twice.
    """
    requested = [_model_json(m.requested_input) for m in batch]
    responses = [_model_json(m.function_response) for m in batch]
    more_requested = [_more_json(m.requested_inputs) for m in batch]
    more_responses = [_more_json(m.function_responses) for m in batch]
    metadata = [encode_json(m.metadata, MAX_JSON_BYTES) for m in batch]
    # The boundary encoded each payload a moment ago, to check it: the same text.
    payloads = [
        None if m.payload is None else encoded_again(m.payload, MAX_PAYLOAD_BYTES) for m in batch
    ]
    size = sum(
        _size(m.content) + _size(m.author) + _size(q) + _size(r) + _size(meta) + _size(p)
        for m, q, r, meta, p in zip(batch, requested, responses, metadata, payloads, strict=True)
    ) + sum(_size(more) for more in (*more_requested, *more_responses))
    if size > MAX_APPEND_BYTES:
        raise InvalidInput(
            f"messages: at most {MAX_APPEND_BYTES} bytes in one append (content, author,"
            f" metadata, payload, requested input and function response), got {size}"
        )
    chosen = [m.id for m in batch if m.id is not None]
    if len(set(chosen)) != len(chosen):
        raise InvalidInput("messages: a message id appears twice in the batch")
    return EncodedBatch(
        messages=batch,
        ids=[new_uuid() if m.id is None else parse_id(MESSAGE_PREFIX, m.id) for m in batch],
        keyed=[m.id is not None for m in batch],
        requested=requested,
        responses=responses,
        more_requested=more_requested,
        more_responses=more_responses,
        metadata=metadata,
        payloads=payloads,
        size=size,
    )


def appends_in_one_statement(batch: EncodedBatch) -> bool:
    """Whether appending ``batch`` writes with one statement (no ids to look up, no inputs to record)."""
    return not any(batch.keyed) and not any(
        q is not None or r is not None
        for q, r in zip(batch.requested, batch.responses, strict=True)
    )


def _array(name: str, item: sa.types.TypeEngine[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=ARRAY(item))


@cache
def _bump_statement(depth: int, with_data: bool = False, expected: bool = False) -> sa.Update:
    """Raise a visible session's counter by ``batch_size`` and move its preview, under its row lock.

    Returns the new ``message_count`` (which numbers the batch) and
    ``updated_at`` (the messages' ``created_at``). ``with_data``: the same
    UPDATE merges the session's state delta (``data_delta``) into its
    document, so the state changes in the statement that appends the
    messages carrying it. ``expected``: it matches only while
    ``message_count`` equals ``expected_count`` (an optimistic check made
    under the row lock, so of two writers that read the same count exactly
    one appends).
    """
    n = sa.bindparam("batch_size", type_=sa.Integer())
    values: dict[str, Any] = {
        "message_count": sessions.c.message_count + n,
        "last_message": sa.bindparam("preview", type_=sa.Text()),
        # greatest(): appends queue on the row lock, so a later statement
        # must never move updated_at backwards. statement_timestamp(), not
        # clock_timestamp(): Citus refuses VOLATILE functions in an UPDATE
        # of a distributed table.
        "updated_at": sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
    }
    if with_data:
        values["data"] = bounded_data(
            sa.func.coalesce(sessions.c.data, sa.text("'{}'::jsonb")).op("||")(
                sa.cast(sa.bindparam("data_delta", type_=sa.Text()), JSONB())
            )
        )
    where = [visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True))]
    if expected:
        where.append(sessions.c.message_count == sa.bindparam("expected_count", type_=sa.Integer()))
    return (
        sa.update(sessions)
        .where(*where)
        .values(**values)
        .returning(
            sessions.c.tenant_id, sessions.c.id, sessions.c.message_count, sessions.c.updated_at
        )
    )


# On Citus the rows of an append go in INSERT ... VALUES statements of at
# most this many rows (one shape per size, so the shapes stay few).
_ROUTED_BATCH: Final = 32


@cache
def _insert_rows_statement(count: int) -> sa.Insert:
    """``INSERT ... VALUES`` of ``count`` messages, numbered by the caller (distributed databases).

    Bind names are suffixed with the row's position; the tenant, session and
    ``created_at`` are shared. One shape per batch size (at most
    :data:`_ROUTED_BATCH` of them).
    """

    def text(name: str) -> sa.BindParameter[str]:
        return sa.bindparam(name, type_=sa.Text())

    rows = [
        {
            "tenant_id": text("scope_tenant"),
            "id": sa.bindparam(f"m_id_{i}", type_=UUID(as_uuid=True)),
            "session_id": sa.bindparam("target_id", type_=UUID(as_uuid=True)),
            "seq": sa.bindparam(f"m_seq_{i}", type_=sa.Integer()),
            "role": text(f"m_role_{i}"),
            "content": text(f"m_content_{i}"),
            "author": text(f"m_author_{i}"),
            "requested_input": sa.cast(text(f"m_requested_{i}"), JSONB()),
            "function_response": sa.cast(text(f"m_response_{i}"), JSONB()),
            "more_requested_inputs": sa.cast(text(f"m_more_requested_{i}"), JSONB()),
            "more_function_responses": sa.cast(text(f"m_more_responses_{i}"), JSONB()),
            # The host's JSON text, verbatim (json keeps its input text exactly).
            "metadata_json": sa.cast(text(f"m_metadata_{i}"), JSON()),
            "payload_json": sa.cast(text(f"m_payload_{i}"), JSON()),
            "deltas_digest": sa.bindparam(f"m_digest_{i}", type_=BYTEA()),
            "created_at": sa.bindparam("m_created_at", type_=sa.DateTime(timezone=True)),
        }
        for i in range(count)
    ]
    return (
        sa.insert(messages)
        .values(rows)
        .returning(messages.c.id, messages.c.seq, messages.c.created_at)
    )


async def _append_routed(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    batch: EncodedBatch,
    extra: dict[str, Any],
    digest: bytes | None,
) -> list[Row]:
    """The append as two single-shard router statements: the counter UPDATE, then the rows.

    On Citus the one-statement form (:func:`_append_statement`) is an
    ``INSERT ... SELECT`` from a data-modifying CTE, which Citus runs through
    the coordinator in two steps; these two are plain router statements and
    cost less there (docs/citus.md). The row lock the UPDATE takes is held
    until COMMIT, so the numbering is as gap-free as the one-statement form.
    """
    params = _append_params(scope, session_id, batch, digest)
    bump = {**scope_params(scope), **{k: params[k] for k in ("target_id", "batch_size", "preview")}}
    with_data, expected = "data_delta" in extra, "expected_count" in extra
    n = len(batch.messages)
    if conn.routines is not None and n == 1:
        # Autocommit: both statements in one routine, run on the tenant's
        # worker (cortex._db.routines); NeedsTransaction if it is not installed.
        composite = routed_append(depth_class(scope), with_data, expected)
        values = _row_values(scope, session_id, batch, range(1), digest)
        return (await conn.call(composite, {**bump, **extra, **values})).all()
    stmt = _bump_statement(depth_class(scope), with_data, expected)
    bumped = (await conn.execute(stmt, {**bump, **extra})).first()
    if bumped is None:
        return []
    first = bumped["message_count"] - n + 1
    rows: list[Row] = []
    # A larger batch goes in chunks of _ROUTED_BATCH rows, each a router
    # INSERT ... VALUES, still under the row lock the UPDATE holds.
    for start in range(0, n, _ROUTED_BATCH):
        chunk = range(start, min(start + _ROUTED_BATCH, n))
        values = _row_values(scope, session_id, batch, chunk, digest)
        values["m_created_at"] = bumped["updated_at"]
        for j, i in enumerate(chunk):
            values[f"m_seq_{j}"] = first + i
        rows += (await conn.execute(_insert_rows_statement(len(chunk)), values)).all()
    return rows


def _row_values(
    scope: Scope,
    session_id: uuid.UUID,
    batch: EncodedBatch,
    chunk: range,
    digest: bytes | None = None,
) -> dict[str, Any]:
    """Bind values of :func:`_insert_rows_statement` for the batch's messages in ``chunk`` (seq aside).

    ``digest``: the append's deltas digest, stored with the batch's first message.
    """
    values: dict[str, Any] = {"scope_tenant": scope.tenant, "target_id": session_id}
    for j, i in enumerate(chunk):
        message = batch.messages[i]
        values[f"m_digest_{j}"] = digest if i == 0 else None
        values[f"m_id_{j}"] = batch.ids[i]
        values[f"m_role_{j}"] = message.role
        values[f"m_content_{j}"] = message.content
        values[f"m_author_{j}"] = message.author
        values[f"m_requested_{j}"] = batch.requested[i]
        values[f"m_response_{j}"] = batch.responses[i]
        values[f"m_more_requested_{j}"] = batch.more_requested[i]
        values[f"m_more_responses_{j}"] = batch.more_responses[i]
        values[f"m_metadata_{j}"] = batch.metadata[i]
        values[f"m_payload_{j}"] = batch.payloads[i]
    return values


@cache
def routed_append(depth: int, with_data: bool = False, expected: bool = False) -> Composite:
    """One message appended on Citus as one routine: the counter UPDATE, then the row.

    The row's ``seq`` is the new ``message_count`` and its ``created_at`` the
    session's new ``updated_at``, both taken inside the routine, under the
    row lock the UPDATE holds until the call's implicit COMMIT.
    """
    return Composite(
        _bump_statement(depth, with_data, expected),
        _insert_rows_statement(1),
        (("m_seq_0", "message_count"), ("m_created_at", "updated_at")),
    )


@cache
def _append_statement(
    depth: int, with_data: bool = False, expected: bool = False, single: bool = False
) -> sa.Insert:
    """One statement: raise the counter under the row lock, then insert the rows.

    The UPDATE runs first (a data-modifying CTE) and takes the session's row
    lock; concurrent appends to the same session queue on it. The new
    ``message_count`` it returns numbers the batch, so ``seq`` is gap-free and
    the count equals the rows in every committed state. One round trip: the
    lock is held for one statement plus COMMIT, not across client round trips
    (postgres-design.md, Q4: 2.5x the throughput of INSERT-then-UPDATE on a
    hot session). If the session is not visible the UPDATE matches nothing
    and so does the INSERT.

    RETURNING gives back only what the caller lacks (id, seq, created_at):
    echoing each content back doubled the bytes on the wire and the client's
    memory for a large batch.

    ``with_data``: the same UPDATE merges the session's state delta
    (``data_delta``) into its document, so the state changes in the
    statement that appends the messages carrying it. ``expected``: the
    UPDATE matches only while ``message_count`` equals ``expected_count``
    (an optimistic check made under the row lock, so of two writers that
    read the same count exactly one appends).

    ``single``: one message, its fields bound as scalars (:func:`_one_params`)
    rather than as ten one-element arrays to unnest: the most frequent
    append, about 55 µs of CPU less on the two sides together
    (docs/benchmarks.md).
    """
    touched = _bump_statement(depth, with_data, expected).cte("touched")
    if single:
        return _insert_appended(touched, _one_message_source(touched))
    n = sa.bindparam("batch_size", type_=sa.Integer())
    rows = (
        sa.func.unnest(
            _array("m_ids", UUID(as_uuid=True)),
            _array("m_roles", sa.Text()),
            _array("m_contents", sa.Text()),
            _array("m_authors", sa.Text()),
            _array("m_requested", sa.Text()),
            _array("m_responses", sa.Text()),
            _array("m_more_requested", sa.Text()),
            _array("m_more_responses", sa.Text()),
            _array("m_metadata", sa.Text()),
            _array("m_payloads", sa.Text()),
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
        touched.c.message_count - n + rows.c.ord,
        rows.c.role,
        rows.c.content,
        rows.c.author,
        sa.cast(rows.c.requested, JSONB()),
        sa.cast(rows.c.response, JSONB()),
        sa.cast(rows.c.more_requested, JSONB()),
        sa.cast(rows.c.more_responses, JSONB()),
        # The host's JSON text, verbatim (json keeps its input text exactly).
        sa.cast(rows.c.meta, JSON()),
        sa.cast(rows.c.payload, JSON()),
        # The deltas digest goes with the batch's first message only.
        sa.case(
            (rows.c.ord == sa.literal_column("1"), sa.bindparam("deltas_digest", type_=BYTEA())),
            else_=sa.null(),
        ),
        touched.c.updated_at,
    ).select_from(touched.join(rows, sa.true()))
    return _insert_appended(touched, source)


def _one_message_source(touched: sa.CTE) -> sa.Select[Any]:
    """The one message of a ``single`` append, numbered by the counter the UPDATE raised.

    Its bind names are those of row 0 of :func:`_insert_rows_statement`, so
    :func:`_row_values` gives the values for both.
    """

    def text(name: str) -> sa.BindParameter[str]:
        return sa.bindparam(f"{name}_0", type_=sa.Text())

    return sa.select(
        touched.c.tenant_id,
        sa.bindparam("m_id_0", type_=UUID(as_uuid=True)),
        touched.c.id,
        touched.c.message_count,
        text("m_role"),
        text("m_content"),
        text("m_author"),
        sa.cast(text("m_requested"), JSONB()),
        sa.cast(text("m_response"), JSONB()),
        sa.cast(text("m_more_requested"), JSONB()),
        sa.cast(text("m_more_responses"), JSONB()),
        sa.cast(text("m_metadata"), JSON()),
        sa.cast(text("m_payload"), JSON()),
        sa.bindparam("m_digest_0", type_=BYTEA()),
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
                "requested_input",
                "function_response",
                "more_requested_inputs",
                "more_function_responses",
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


def _one_params(
    scope: Scope, session_id: uuid.UUID, batch: EncodedBatch, digest: bytes | None
) -> dict[str, Any]:
    """The bind values of a ``single`` append (:func:`_append_statement`): a batch of one."""
    return {
        **scope_params(scope),
        "batch_size": 1,
        "preview": batch.messages[0].preview(),
        **_row_values(scope, session_id, batch, range(1), digest),
    }


def _append_params(
    scope: Scope, session_id: uuid.UUID, batch: EncodedBatch, digest: bytes | None
) -> dict[str, Any]:
    return {
        **scope_params(scope),
        "deltas_digest": digest,
        "target_id": session_id,
        "batch_size": len(batch.messages),
        "preview": batch.messages[-1].preview(),
        "m_ids": batch.ids,
        "m_roles": [m.role for m in batch.messages],
        "m_contents": [m.content for m in batch.messages],
        "m_authors": [m.author for m in batch.messages],
        "m_requested": batch.requested,
        "m_responses": batch.responses,
        "m_more_requested": batch.more_requested,
        "m_more_responses": batch.more_responses,
        "m_metadata": batch.metadata,
        "m_payloads": batch.payloads,
    }


def _sha256(column: sa.ColumnElement[Any]) -> sa.ColumnElement[bytes]:
    # Qualified: convert_to(text, name) loses to another role's convert_to(text, text).
    return sa.func.pg_catalog.sha256(
        sa.func.pg_catalog.convert_to(column, sa.literal_column("'UTF8'"))
    )


@cache
def _stored_statement() -> sa.Select[*tuple[Any, ...]]:
    """Stored messages with the batch's caller-chosen ids, and whether each is the same message.

    Contents and metadata are compared by SHA-256, so a retry does not send
    the batch twice; the questions and answers (small) as jsonb.
    """
    keys = (
        sa.func.unnest(
            _array("k_ids", UUID(as_uuid=True)),
            _array("k_roles", sa.Text()),
            _array("k_content_hashes", BYTEA()),
            _array("k_authors", sa.Text()),
            _array("k_requested", sa.Text()),
            _array("k_responses", sa.Text()),
            _array("k_more_requested", sa.Text()),
            _array("k_more_responses", sa.Text()),
            _array("k_metadata_hashes", BYTEA()),
            _array("k_payload_hashes", BYTEA()),
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
        messages.c.session_id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
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
                messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
                messages.c.id == keys.c.id,
            ),
        )
    )


def _digest(text: str | None) -> bytes | None:
    return None if text is None else hashlib.sha256(text.encode()).digest()


async def _stored_rows(
    conn: Tx, scope: Scope, session_id: uuid.UUID, batch: EncodedBatch
) -> list[Row]:
    picked = [i for i, keyed in enumerate(batch.keyed) if keyed]
    params = {
        "scope_tenant": scope.tenant,
        "target_id": session_id,
        "k_ids": [batch.ids[i] for i in picked],
        "k_roles": [batch.messages[i].role for i in picked],
        "k_content_hashes": [_digest(batch.messages[i].content) for i in picked],
        "k_authors": [batch.messages[i].author for i in picked],
        "k_requested": [batch.requested[i] for i in picked],
        "k_responses": [batch.responses[i] for i in picked],
        "k_more_requested": [batch.more_requested[i] for i in picked],
        "k_more_responses": [batch.more_responses[i] for i in picked],
        "k_metadata_hashes": [_digest(batch.metadata[i]) for i in picked],
        "k_payload_hashes": [_digest(batch.payloads[i]) for i in picked],
    }
    return (await conn.execute(_stored_statement(), params)).all()


def _messages_of(
    session_id: uuid.UUID, batch: EncodedBatch, placed: dict[uuid.UUID, tuple[int, Any]]
) -> list[Message]:
    """The appended messages: the caller's values, and what the database assigned."""
    sid = format_id(SESSION_PREFIX, session_id)
    out = []
    for m, mid in zip(batch.messages, batch.ids, strict=True):
        seq, created_at = placed[mid]
        out.append(
            from_database(
                Message,
                {
                    "id": format_id(MESSAGE_PREFIX, mid),
                    "session_id": sid,
                    "seq": seq,
                    "role": m.role,
                    "content": m.content,
                    "author": m.author,
                    "requested_inputs": m.requested_inputs,
                    "function_responses": m.function_responses,
                    "metadata": m.metadata,
                    "payload": m.payload,
                    "created_at": created_at,
                },
            )
        )
    out.sort(key=lambda message: message.seq)
    return out


async def append_messages(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    batch: EncodedBatch,
    *,
    data_delta: str | None = None,
    scope_deltas: dict[str, str] | None = None,
    expected_count: int | None = None,
    distributed: bool = False,
) -> list[Message]:
    """Append ``batch`` to a visible session in one statement (two router statements on Citus).

    ``data_delta`` (the session's state delta as stored) is merged by the
    same statement; ``scope_deltas`` (scope path to delta) right after it,
    in this transaction (:func:`cortex._sessions.merge_scope_data`). With
    ``expected_count``, the append happens only if the session still holds
    that many messages.

    Idempotency: when messages carry caller-chosen ids, the ids already
    stored are looked up first. All of them stored, each the same message in
    this session: the earlier append committed (its reply was lost), and the
    stored messages are returned; nothing is written. Any of them stored
    otherwise: Conflict. Two concurrent retries of one batch both find
    nothing; the second then waits on the first's rows, fails on the primary
    key once it commits, and runs again, finding them.

    Raises:
        NotFound: when the session is not visible (nothing is written).
        Conflict: a caller-chosen id is stored already with other content,
            in another session, or in a batch that was not this one; or the
            session no longer holds ``expected_count`` messages.
        InvalidInput: a delta would grow a state document past its limit,
            or names a scope off the session's path (nothing is written).
    """
    # The ids key the whole call: its deltas are recorded with it (a digest).
    digest = deltas_digest(data_delta, scope_deltas) if any(batch.keyed) else None
    if digest is not None:
        stored = await _stored_rows(conn, scope, session_id, batch)
        if stored:
            if not all(batch.keyed) or len(stored) != len(batch.ids):
                raise Conflict("messages: part of this batch was stored by another append")
            if not all(row["same"] for row in stored):
                raise Conflict("messages: a message id is already stored with other content")
            recorded = {row["id"]: row["deltas_digest"] for row in stored}
            first = recorded.pop(batch.ids[0])
            if any(d is not None for d in recorded.values()):
                # A later message of this batch began an append of its own.
                raise Conflict("messages: part of this batch was stored by another append")
            # None: stored by a release that kept no digest; the messages decide.
            if first is not None and first != digest:
                raise Conflict(
                    "messages: these message ids were appended with other state deltas"
                    " (data, scope_data)"
                )
            # The replay returns nothing the scope could not read anyway.
            await select_session(conn, scope, session_id)
            return _messages_of(
                session_id, batch, {row["id"]: (row["seq"], row["created_at"]) for row in stored}
            )
    extra: dict[str, Any] = {}
    if data_delta is not None:
        extra["data_delta"] = data_delta
    if expected_count is not None:
        extra["expected_count"] = expected_count
    try:
        if distributed:
            rows = await _append_routed(conn, scope, session_id, batch, extra, digest)
        else:
            single = len(batch.messages) == 1
            stmt = _append_statement(
                depth_class(scope), data_delta is not None, expected_count is not None, single
            )
            values = (_one_params if single else _append_params)(scope, session_id, batch, digest)
            params = {**values, **extra}
            rows = (await conn.execute(stmt, params)).all()
    except asyncpg.CheckViolationError as exc:
        raise data_too_large(exc) from exc
    except asyncpg.UniqueViolationError as exc:
        if any(batch.keyed):
            raise RetryTransaction from exc  # a concurrent append stored these ids; look again
        raise
    if not rows:
        if expected_count is not None:
            # Visible but holding another count: someone appended (or
            # removed) since the caller read it. select_session raises
            # NotFound otherwise.
            current = await select_session(conn, scope, session_id)
            raise Conflict(
                f"session {current.id} holds {current.message_count} messages, not"
                f" {expected_count}: it changed since it was read"
            )
        raise NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")
    if scope_deltas:
        await merge_scope_data(conn, scope, session_id, scope_deltas)
    appended = _messages_of(
        session_id, batch, {row["id"]: (row["seq"], row["created_at"]) for row in rows}
    )
    # Questions and answers change operator state; plain messages (the hot
    # path) cost no second statement.
    if any(m.requested_input is not None or m.function_response is not None for m in appended):
        await record_inputs(conn, scope, session_id, appended, distributed=distributed)
    return appended


@cache
def _page_statement(
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
        bound = seq < sa.bindparam("before_seq", type_=sa.Integer())
    elif since:
        after = sa.bindparam("after_seq", type_=sa.Integer())
        bound = seq > sa.func.greatest(after, _since_boundary(depth))
    else:
        bound = seq > sa.bindparam("after_seq", type_=sa.Integer())
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
            bound,
        )
        .order_by(seq.desc() if newest_first else seq)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )


def _since_boundary(depth: int) -> sa.ScalarSelect[Any]:
    """The last ``seq`` created at or before ``:since`` (0 for none): a binary search.

    created_at never decreases along seq (it is the session's updated_at,
    moved with greatest() under the row lock), and seq runs 1 to
    message_count without a gap, so the boundary is found with about
    log2(message_count) lookups of ``uq_messages_session_seq``, each one
    index probe: 21 for a million messages, where a filter on created_at
    walked every message from the first. The invariant: ``lo`` is created at
    or before ``:since`` (0 stands before the first), ``hi`` after it
    (message_count + 1 stands after the last); the search ends when they meet.
    """
    since = sa.bindparam("since", type_=sa.DateTime(timezone=True))
    two: sa.ColumnClause[Any] = sa.literal_column("2")
    count = sessions.c.message_count
    start = (
        sa.select(
            sa.literal_column("0").label("lo"),
            (count + sa.literal_column("1")).label("hi"),
            ((count + sa.literal_column("1")).self_group().op("/")(two)).label("mid"),
        )
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .cte("since_search", recursive=True)
    )
    # One index probe per step, whatever the statistics say: a scalar
    # subquery on the work table's own ``mid`` column (arithmetic in the
    # probe's condition is not leakproof, so under row-level security it was
    # a filter over the session's whole seq index), in a LATERAL that OFFSET
    # 0 keeps the planner from flattening (the subquery would run once per
    # CASE). A missing row (never: seq has no gap) reads as "not later".
    later = (
        sa.select(messages.c.created_at > since)
        .where(
            messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
            messages.c.session_id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
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


async def list_messages(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    *,
    after_seq: int,
    limit: int,
    since: datetime | None = None,
) -> list[Message]:
    """Messages of a visible session with ``seq > after_seq`` (and created after ``since``), by seq.

    Raises:
        NotFound: when the session is not visible.
    """
    params: dict[str, Any] = {
        **scope_params(scope),
        "target_id": session_id,
        "after_seq": after_seq,
        "limit": limit,
    }
    if since is not None:
        params["since"] = since
    stmt = _page_statement(depth_class(scope), newest_first=False, since=since is not None)
    rows = (await conn.execute(stmt, params)).all()
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
def _history_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The session's columns, each row joined to one of its newest messages (or none).

    The first row (the oldest message of the page, or none) alone carries the state.

    One statement is one snapshot under READ COMMITTED, so the counter and the
    messages agree even while appends commit between two reads. Message
    columns are labelled ``m_…`` beside the session's own.
    """
    recent = (
        sa.select(*_MESSAGE_COLUMNS)
        .where(
            # The bound tenant, not sessions.tenant_id: with the policy's
            # tenant_id = current_setting(...) that equivalence would yield a
            # pseudoconstant qual, which Citus refuses in an outer join
            # (PostgreSQL 15 and 16). visible() binds the same parameter.
            messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
            messages.c.session_id == sessions.c.id,
        )
        .order_by(messages.c.seq.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer()))
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
        sa.select(*columns, *(c.label(f"m_{c.name}") for c in recent.c))
        # ON a real condition (implied by the lateral's own), not ON true:
        # Citus refuses an outer join on a constant (PostgreSQL 15 and 16).
        .select_from(sessions.outerjoin(recent, recent.c.session_id == sessions.c.id))
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
    rows = (
        await conn.execute(_page_statement(depth_class(scope), newest_first=True), params)
    ).all()
    if not rows:
        # An empty page and an invisible session look alike; tell them apart.
        await select_session(conn, scope, session_id)
    return [row_to_message(row) for row in reversed(rows)]


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
    history = [row_to_message(row, "m_") for row in rows if row["m_id"] is not None]
    return SessionHistory(row_to_session(rows[0]), history)


# --- removing messages -------------------------------------------------------------


def _own_messages() -> sa.ColumnElement[bool]:
    return sa.and_(
        messages.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        messages.c.session_id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
    )


@cache
def _pop_statements(depth: int) -> tuple[Any, sa.Update]:
    """Delete the message at ``seq = count``; recount and re-preview the session."""
    delete = (
        sa.delete(messages)
        .where(_own_messages(), messages.c.seq == sa.bindparam("last_seq", type_=sa.Integer()))
        .returning(*_MESSAGE_COLUMNS)
    )
    previous = (
        sa.select(sa.func.left(messages.c.content, PREVIEW_LENGTH))
        .where(_own_messages(), messages.c.seq == sa.bindparam("last_seq", type_=sa.Integer()) - 1)
        .scalar_subquery()
    )
    recount = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .values(
            message_count=sessions.c.message_count - 1,
            last_message=sa.func.coalesce(previous, ""),
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
    )
    return delete, recount


@cache
def _clear_statements(depth: int) -> tuple[sa.Delete, sa.Delete, sa.Update]:
    delete = sa.delete(messages).where(_own_messages())
    unpend = sa.delete(pending_inputs).where(
        pending_inputs.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        pending_inputs.c.session_id == sa.bindparam("target_id", type_=UUID(as_uuid=True)),
    )
    reset = (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .values(
            message_count=0,
            last_message="",
            pending_count=0,
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )
    return delete, unpend, reset


@cache
def _inputs_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(*_MESSAGE_COLUMNS)
        .where(
            _own_messages(),
            sa.or_(
                messages.c.requested_input.is_not(None), messages.c.function_response.is_not(None)
            ),
        )
        .order_by(messages.c.seq)
    )


async def _rebuild_pending(
    conn: Tx, scope: Scope, session: Session, *, distributed: bool = False
) -> None:
    """Recompute a session's pending inputs from its questions and answers.

    Only after removing a question or an answer (rare): a popped answer
    re-opens the question it answered. An aborted session keeps none.
    """
    params = {**scope_params(scope), "target_id": session_uuid(session.id)}
    _, unpend, _ = _clear_statements(depth_class(scope))
    await conn.execute(unpend, {"scope_tenant": scope.tenant, "target_id": params["target_id"]})
    await conn.execute(_zero_pending_statement(depth_class(scope)), params)
    if session.state is SessionState.ABORTED:
        return
    rows = (
        await conn.execute(
            _inputs_statement(),
            {"scope_tenant": scope.tenant, "target_id": params["target_id"]},
        )
    ).all()
    history = [row_to_message(r) for r in rows]
    await record_inputs(conn, scope, params["target_id"], history, distributed=distributed)


@cache
def _zero_pending_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == sa.bindparam("target_id", type_=UUID(as_uuid=True)))
        .values(pending_count=0)
    )


async def pop_message(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, distributed: bool = False
) -> Message | None:
    """Remove and return a visible session's last message; None if it has none.

    ``distributed`` (Citus): pending inputs are rebuilt with router statements.

    The session's row lock is taken first, so concurrent pops (and appends)
    queue: each pop removes a different message, ``message_count`` falls by
    one with the row, and ``seq`` stays gap-free (only the last is removed).

    Raises:
        NotFound: when the session is not visible.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.message_count == 0:
        return None
    params = {
        **scope_params(scope),
        "target_id": session_id,
        "last_seq": session.message_count,
    }
    delete, recount = _pop_statements(depth_class(scope))
    row = (
        await conn.execute(
            delete,
            {"scope_tenant": scope.tenant, "target_id": session_id, "last_seq": params["last_seq"]},
        )
    ).first()
    if row is None:  # count and rows always agree; refuse to guess if they do not
        raise Conflict(f"session {session.id} has no message at seq {session.message_count}")
    await conn.execute(recount, params)
    popped = row_to_message(row)
    if popped.requested_input is not None or popped.function_response is not None:
        await _rebuild_pending(conn, scope, session, distributed=distributed)
    return popped


async def clear_messages(conn: Tx, scope: Scope, session_id: uuid.UUID) -> Session:
    """Remove every message of a visible session, in one transaction with its counters.

    Its pending inputs go with the questions; state documents stay.

    Raises:
        NotFound: when the session is not visible.
    """
    await select_session(conn, scope, session_id, for_update=True)
    delete, unpend, reset = _clear_statements(depth_class(scope))
    own = {"scope_tenant": scope.tenant, "target_id": session_id}
    await conn.execute(delete, own)
    await conn.execute(unpend, own)
    row = (await conn.execute(reset, {**scope_params(scope), "target_id": session_id})).one()
    return row_to_session(row)
