"""Calls on messages: the one-statement append and the read by position.

Plain ``async def`` functions taking ``(conn, scope, ...)``; no commits.
Their statements are built in cortex._sql.messages.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple

from cortex._calls import operator
from cortex._calls.constraints import Writing, refusals
from cortex._calls.operator import record_inputs
from cortex._calls.rows import row_to_message, row_to_session
from cortex._calls.sessions import (
    deltas_digest,
    merge_scope_data,
    not_found,
    select_session,
)
from cortex._db.executor import Row, Tx
from cortex._sql import messages as sql
from cortex._sql import sessions as session_sql
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
    NEW_TITLE,
    PENDING_COUNT,
    PREVIEW,
    SCOPE_TENANT,
    SINCE,
    SOURCE_ID,
    TARGET_ID,
    THROUGH_SEQ,
    TO_SEQ,
    row_name,
)
from cortex._sql.predicates import depth_class, scope_params
from cortex._sql.tables import DATA_SIZE_REPORTED, PK_MESSAGES
from cortex._validate import encode_json, encoded_again
from cortex.errors import Conflict, InvalidInput, SessionAborted
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, format_id, new_uuid, parse_id
from cortex.models import (
    MAX_APPEND_BYTES,
    MAX_JSON_BYTES,
    MAX_PAYLOAD_BYTES,
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
    "fork_session",
    "list_messages",
    "pop_message",
    "recent_messages",
    "rewind_session",
    "select_session_with_messages",
]


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


def _first_json(values: list[RequestedInput] | list[FunctionResponse]) -> str | None:
    """The first question (or answer), which has a column of its own; None if there is none."""
    if not values:
        return None
    return encode_json(values[0].model_dump(mode="json"), MAX_APPEND_BYTES)


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
    requested = [_first_json(m.requested_inputs) for m in batch]
    responses = [_first_json(m.function_responses) for m in batch]
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


async def _append_routed(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID,
    batch: EncodedBatch,
    extra: dict[str, Any],
    digest: bytes | None,
) -> list[Row]:
    """The append as two single-shard router statements: the counter UPDATE, then the rows.

    On Citus the one-statement form (:func:`cortex._sql.messages.append_statement`) is an
    ``INSERT ... SELECT`` from a data-modifying CTE, which Citus runs through
    the coordinator in two steps; these two are plain router statements and
    cost less there (docs/citus.md). The row lock the UPDATE takes is held
    until COMMIT, so the numbering is as gap-free as the one-statement form.
    """
    params = _append_params(scope, session_id, batch, digest)
    bump = {**scope_params(scope), **{k: params[k] for k in (TARGET_ID, BATCH_SIZE, PREVIEW)}}
    with_data, expected = DATA_DELTA in extra, EXPECTED_COUNT in extra
    n = len(batch.messages)
    if conn.routines is not None and n == 1:
        # Autocommit: both statements in one routine, run on the tenant's
        # worker (cortex._db.routines); NeedsTransaction if it is not installed.
        composite = sql.routed_append(depth_class(scope), with_data, expected)
        values = _row_values(scope, session_id, batch, range(1), digest)
        return (await conn.call(composite, {**bump, **extra, **values})).all()
    stmt = sql.bump_statement(depth_class(scope), with_data, expected)
    bumped = (await conn.execute(stmt, {**bump, **extra})).first()
    if bumped is None:
        return []
    first = bumped[sql.LAST_SEQ_COLUMN] - n + 1
    rows: list[Row] = []
    # A larger batch goes in chunks of ROUTED_BATCH rows, each a router
    # INSERT ... VALUES, still under the row lock the UPDATE holds.
    for start in range(0, n, sql.ROUTED_BATCH):
        chunk = range(start, min(start + sql.ROUTED_BATCH, n))
        values = _row_values(scope, session_id, batch, chunk, digest)
        values[M_CREATED_AT] = bumped["updated_at"]
        for j, i in enumerate(chunk):
            values[row_name(M_SEQ, j)] = first + i
        rows += (await conn.execute(sql.insert_rows_statement(len(chunk)), values)).all()
    return rows


def _row_values(
    scope: Scope,
    session_id: uuid.UUID,
    batch: EncodedBatch,
    chunk: range,
    digest: bytes | None = None,
) -> dict[str, Any]:
    """Bind values of :func:`cortex._sql.messages.insert_rows_statement` for the batch's messages in ``chunk`` (seq aside).

    ``digest``: the append's deltas digest, stored with the batch's first message.
    """
    values: dict[str, Any] = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
    for j, i in enumerate(chunk):
        message = batch.messages[i]
        values[row_name(M_DIGEST, j)] = digest if i == 0 else None
        values[row_name(M_ID, j)] = batch.ids[i]
        values[row_name(M_ROLE, j)] = message.role
        values[row_name(M_CONTENT, j)] = message.content
        values[row_name(M_AUTHOR, j)] = message.author
        values[row_name(M_REQUESTED, j)] = batch.requested[i]
        values[row_name(M_RESPONSE, j)] = batch.responses[i]
        values[row_name(M_MORE_REQUESTED, j)] = batch.more_requested[i]
        values[row_name(M_MORE_RESPONSES, j)] = batch.more_responses[i]
        values[row_name(M_METADATA, j)] = batch.metadata[i]
        values[row_name(M_PAYLOAD, j)] = batch.payloads[i]
    return values


def _one_params(
    scope: Scope, session_id: uuid.UUID, batch: EncodedBatch, digest: bytes | None
) -> dict[str, Any]:
    """The bind values of a ``single`` append (:func:`cortex._sql.messages.append_statement`): a batch of one."""
    return {
        **scope_params(scope),
        BATCH_SIZE: 1,
        PREVIEW: batch.messages[0].preview(),
        **_row_values(scope, session_id, batch, range(1), digest),
    }


def _append_params(
    scope: Scope, session_id: uuid.UUID, batch: EncodedBatch, digest: bytes | None
) -> dict[str, Any]:
    return {
        **scope_params(scope),
        DELTAS_DIGEST: digest,
        TARGET_ID: session_id,
        BATCH_SIZE: len(batch.messages),
        PREVIEW: batch.messages[-1].preview(),
        M_IDS: batch.ids,
        M_ROLES: [m.role for m in batch.messages],
        M_CONTENTS: [m.content for m in batch.messages],
        M_AUTHORS: [m.author for m in batch.messages],
        M_REQUESTED: batch.requested,
        M_RESPONSES: batch.responses,
        M_MORE_REQUESTED: batch.more_requested,
        M_MORE_RESPONSES: batch.more_responses,
        M_METADATA: batch.metadata,
        M_PAYLOADS: batch.payloads,
    }


def _digest(text: str | None) -> bytes | None:
    return None if text is None else hashlib.sha256(text.encode()).digest()


async def _stored_rows(
    conn: Tx, scope: Scope, session_id: uuid.UUID, batch: EncodedBatch
) -> list[Row]:
    picked = [i for i, keyed in enumerate(batch.keyed) if keyed]
    params = {
        SCOPE_TENANT: scope.tenant,
        TARGET_ID: session_id,
        K_IDS: [batch.ids[i] for i in picked],
        K_ROLES: [batch.messages[i].role for i in picked],
        K_CONTENT_HASHES: [_digest(batch.messages[i].content) for i in picked],
        K_AUTHORS: [batch.messages[i].author for i in picked],
        K_REQUESTED: [batch.requested[i] for i in picked],
        K_RESPONSES: [batch.responses[i] for i in picked],
        K_MORE_REQUESTED: [batch.more_requested[i] for i in picked],
        K_MORE_RESPONSES: [batch.more_responses[i] for i in picked],
        K_METADATA_HASHES: [_digest(batch.metadata[i]) for i in picked],
        K_PAYLOAD_HASHES: [_digest(batch.payloads[i]) for i in picked],
    }
    return (await conn.execute(sql.stored_statement(), params)).all()


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
    in this transaction (:func:`cortex._calls.sessions.merge_scope_data`). With
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
        extra[DATA_DELTA] = data_delta
    if expected_count is not None:
        extra[EXPECTED_COUNT] = expected_count
    # A concurrent append stored these caller-chosen ids: run again, and the
    # look-up above tells a replay from a clash.
    retry = [PK_MESSAGES] if any(batch.keyed) else []
    writing = Writing(scope, session_id=session_id)
    with refusals(writing, [PK_MESSAGES, DATA_SIZE_REPORTED], retry=retry):
        if distributed:
            rows = await _append_routed(conn, scope, session_id, batch, extra, digest)
        else:
            single = len(batch.messages) == 1
            stmt = sql.append_statement(
                depth_class(scope), data_delta is not None, expected_count is not None, single
            )
            values = (_one_params if single else _append_params)(scope, session_id, batch, digest)
            params = {**values, **extra}
            rows = (await conn.execute(stmt, params)).all()
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
        raise not_found(session_id)
    if scope_deltas:
        await merge_scope_data(conn, scope, session_id, scope_deltas)
    appended = _messages_of(
        session_id, batch, {row["id"]: (row["seq"], row["created_at"]) for row in rows}
    )
    # Questions and answers change operator state; plain messages (the hot
    # path) cost no second statement.
    if any(m.requested_inputs or m.function_responses for m in appended):
        await record_inputs(conn, scope, session_id, appended, distributed=distributed)
    return appended


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
        TARGET_ID: session_id,
        AFTER_SEQ: after_seq,
        LIMIT: limit,
    }
    if since is not None:
        params[SINCE] = since
    stmt = sql.page_statement(depth_class(scope), newest_first=False, since=since is not None)
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


async def recent_messages(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, before_seq: int, limit: int
) -> list[Message]:
    """The newest ``limit`` messages with ``seq < before_seq``, in ``seq`` order.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {
        **scope_params(scope),
        TARGET_ID: session_id,
        BEFORE_SEQ: before_seq,
        LIMIT: limit,
    }
    rows = (
        await conn.execute(sql.page_statement(depth_class(scope), newest_first=True), params)
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
    params = {**scope_params(scope), TARGET_ID: session_id, LIMIT: limit}
    rows = (await conn.execute(sql.history_statement(depth_class(scope)), params)).all()
    if not rows:
        raise not_found(session_id)
    prefix = sql.HISTORY_PREFIX
    history = [row_to_message(row, prefix) for row in rows if row[f"{prefix}id"] is not None]
    return SessionHistory(row_to_session(rows[0]), history)


# --- removing messages -------------------------------------------------------------


async def _rebuild_pending(
    conn: Tx, scope: Scope, session: Session, *, distributed: bool = False
) -> None:
    """Recompute a session's pending inputs from its questions and answers.

    Only after removing a question or an answer (rare): a popped answer
    re-opens the question it answered. An aborted session keeps none.
    """
    params = {**scope_params(scope), TARGET_ID: session_uuid(session.id)}
    _, unpend, _ = sql.clear_statements(depth_class(scope))
    await conn.execute(unpend, {SCOPE_TENANT: scope.tenant, TARGET_ID: params[TARGET_ID]})
    await conn.execute(sql.zero_pending_statement(depth_class(scope)), params)
    if session.state is SessionState.ABORTED:
        return
    rows = (
        await conn.execute(
            sql.inputs_statement(),
            {SCOPE_TENANT: scope.tenant, TARGET_ID: params[TARGET_ID]},
        )
    ).all()
    history = [row_to_message(r) for r in rows]
    await record_inputs(conn, scope, params[TARGET_ID], history, distributed=distributed)


async def pop_message(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, distributed: bool = False
) -> Message | None:
    """Remove and return a visible session's last message; None if it has none.

    ``distributed`` (Citus): pending inputs are rebuilt with router statements.

    The session's row lock is taken first, so concurrent pops (and appends)
    queue: each pop removes a different message, ``message_count`` falls by
    one with the row, and ``seq`` stays gap-free (only the last is removed:
    the one at ``trimmed_count + message_count``).

    Raises:
        NotFound: when the session is not visible.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.message_count == 0:
        return None
    last = session.trimmed_count + session.message_count
    params = {**scope_params(scope), TARGET_ID: session_id, LAST_SEQ: last}
    delete, recount = sql.pop_statements(depth_class(scope))
    row = (
        await conn.execute(
            delete,
            {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id, LAST_SEQ: params[LAST_SEQ]},
        )
    ).first()
    if row is None:  # count and rows always agree; refuse to guess if they do not
        raise Conflict(f"session {session.id} has no message at seq {last}")
    await conn.execute(recount, params)
    popped = row_to_message(row)
    if popped.requested_inputs or popped.function_responses:
        await _rebuild_pending(conn, scope, session, distributed=distributed)
    return popped


async def clear_messages(conn: Tx, scope: Scope, session_id: uuid.UUID) -> Session:
    """Remove every message of a visible session, in one transaction with its counters.

    Its pending inputs go with the questions; state documents stay.

    Raises:
        NotFound: when the session is not visible.
    """
    await select_session(conn, scope, session_id, for_update=True)
    delete, unpend, reset = sql.clear_statements(depth_class(scope))
    own = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
    await conn.execute(delete, own)
    await conn.execute(unpend, own)
    row = (await conn.execute(reset, {**scope_params(scope), TARGET_ID: session_id})).one()
    return row_to_session(row)


# --- forking and rewinding ------------------------------------------------------------

# Messages a fork copies per statement (each a chunk of new ids bound as one array).
FORK_CHUNK: Final = 1000


async def fork_session(
    conn: Tx,
    scope: Scope,
    source_id: uuid.UUID,
    *,
    through_seq: int | None,
    title: str | None,
) -> Session:
    """A new session holding copies of a visible session's messages 1 to ``through_seq`` (all: None).

    The source is locked ``FOR KEY SHARE`` while it is copied
    (:func:`cortex._sql.sessions.fork_source_statement`): removals wait, appends go on
    past the count read, so the fork is always a prefix the source held.
    Each copy gets a new id and keeps its seq, fields and ``created_at``;
    the fork's questions pending at ``through_seq`` are pending in it,
    raised when the source raised them (when their message was appended,
    for one answered later in the source or cleared by its abort).

    Raises:
        NotFound: the source is not visible.
        InvalidInput: ``through_seq`` is past the source's last message.
    """
    depth = depth_class(scope)
    own = {SCOPE_TENANT: scope.tenant, TARGET_ID: source_id}
    row = (
        await conn.execute(session_sql.fork_source_statement(depth), {**scope_params(scope), **own})
    ).first()
    if row is None:
        raise not_found(source_id)
    source = row_to_session(row)
    through = source.message_count if through_seq is None else through_seq
    if through > source.message_count:
        raise InvalidInput(
            f"through_seq: session {source.id} holds {source.message_count} messages;"
            f" through_seq may be 0 to {source.message_count}, got {through}"
        )
    preview = ""
    if through:
        found = (await conn.execute(sql.preview_statement(), {**own, THROUGH_SEQ: through})).first()
        if found is None:  # count and rows always agree; refuse to guess if they do not
            raise Conflict(f"session {source.id} has no message at seq {through}")
        preview = found[0]
    fork_id = new_uuid()
    fork = {
        **scope_params(scope),
        TARGET_ID: fork_id,
        SOURCE_ID: source_id,
        NEW_TITLE: title,
        THROUGH_SEQ: through,
        PREVIEW: preview,
    }
    await conn.execute(session_sql.fork_statement(depth), fork)
    copy = {SCOPE_TENANT: scope.tenant, TARGET_ID: fork_id, SOURCE_ID: source_id}
    for base in range(0, through, FORK_CHUNK):
        end = min(base + FORK_CHUNK, through)
        ids = [new_uuid() for _ in range(base, end)]
        values = {**copy, COPY_BASE: base, COPY_IDS: ids, THROUGH_SEQ: end}
        await conn.execute(sql.copy_statement(), values)
    pending = await operator.pending_through(conn, scope, source_id, through)
    if pending:
        raised = await operator.raised_times(conn, scope, source_id)
        count = await operator.ask_again(conn, scope, fork_id, pending, raised)
        await operator.set_pending_count(conn, scope, fork_id, count)
    return await select_session(conn, scope, fork_id)


async def rewind_session(conn: Tx, scope: Scope, session_id: uuid.UUID, *, to_seq: int) -> Session:
    """Delete a visible session's messages after ``to_seq``, with its counters, in one transaction.

    Under the session's row lock (``FOR UPDATE``, as pop and clear take it),
    so appends queue behind it and the next one is ``to_seq + 1``. Pending
    inputs asked after ``to_seq`` go; a question asked up to it and answered
    after it is pending again (raised when its message was appended).
    Interrupt markers stay: they are the session's, not a message's.

    Raises:
        NotFound: the session is not visible.
        SessionAborted: the session carries an abort marker.
        InvalidInput: ``to_seq`` is past the last message.
    """
    session = await select_session(conn, scope, session_id, for_update=True)
    if session.state is SessionState.ABORTED:
        raise SessionAborted(f"session {session.id} was aborted")
    if to_seq > session.message_count:
        raise InvalidInput(
            f"to_seq: session {session.id} holds {session.message_count} messages;"
            f" to_seq may be 0 to {session.message_count}, got {to_seq}"
        )
    if to_seq == session.message_count:
        return session
    own = {SCOPE_TENANT: scope.tenant, TARGET_ID: session_id}
    reopens = await operator.answers_after(conn, scope, session_id, to_seq)
    delete, recount = sql.rewind_statements(depth_class(scope))
    await conn.execute(delete, {**own, TO_SEQ: to_seq})
    pending = session.pending_count - await operator.unask_after(conn, scope, session_id, to_seq)
    if reopens:
        asked = await operator.pending_through(conn, scope, session_id, to_seq)
        pending += await operator.ask_again(conn, scope, session_id, asked)
    params = {**scope_params(scope), TARGET_ID: session_id, TO_SEQ: to_seq, PENDING_COUNT: pending}
    return row_to_session((await conn.execute(recount, params)).one())
