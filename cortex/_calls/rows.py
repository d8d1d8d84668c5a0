"""Every row decoder: database rows to cortex's public models.

The statements a row comes from are cortex._sql's; each decoder reads the
columns by the labels those statements give them.
"""

from __future__ import annotations

from typing import Any, Final

from cortex._db.executor import Row
from cortex._validate import decode_json, decode_json_of_strings
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, format_id
from cortex.models import (
    RESERVED_DATA_PREFIX,
    ForkedFrom,
    FunctionResponse,
    Message,
    PendingInput,
    RequestedInput,
    Session,
    SessionState,
    from_database,
)
from cortex.scope import Scope

__all__ = [
    "ancestors",
    "decode_data",
    "page_sessions",
    "row_to_message",
    "row_to_pending",
    "row_to_session",
    "split_reserved",
]


# The enum member of each stored state (a lookup: calling the enum costs more).
_STATE_OF: Final = {state.value: state for state in SessionState}


def row_to_session(row: Row, data: dict[str, Any] | None = None) -> Session:
    """Build the public model from a row selected with cortex._sql.sessions.SESSION_COLUMNS.

    ``data``: the session's state, merged already (a listing's row, whose
    ``data`` column is its own document only: :func:`page_sessions`).

    The values are written in ``Session``'s field order (a unit test holds
    the two in step), so the model takes the dict without a reordering copy
    (docs/benchmarks.md). The state's keys beginning RESERVED_DATA_PREFIX
    go to the model's ``_reserved_data``, not its ``data``.
    """
    if data is None:
        data = decode_data(row["data"])
    data, reserved = split_reserved(data)
    return from_database(
        Session,
        {
            "id": format_id(SESSION_PREFIX, row["id"]),
            "agent_id": row["agent_id"],
            "scope": Scope.parse(row["scope"]),
            "title": row["title"],
            "metadata": decode_json(row["metadata"]),
            "message_count": row["message_count"],
            "trimmed_count": row["trimmed_count"],
            "last_message": row["last_message"],
            "is_default": row["is_default"],
            "backfilled_by": row["backfilled_by"],
            "state": _STATE_OF[row["state"]],
            "pending_count": row["pending_count"],
            "key": row["session_key"],
            "data": data,
            "forked_from": None if row["forked_from_id"] is None else _forked_from(row),
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        },
        {"_reserved_data": reserved},
        in_field_order=True,
    )


def split_reserved(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` without its keys beginning RESERVED_DATA_PREFIX, and those keys."""
    if not data or not any(key.startswith(RESERVED_DATA_PREFIX) for key in data):
        return data, {}
    reserved = {k: v for k, v in data.items() if k.startswith(RESERVED_DATA_PREFIX)}
    return {k: v for k, v in data.items() if k not in reserved}, reserved


def _forked_from(row: Row) -> ForkedFrom:
    return from_database(
        ForkedFrom,
        {
            "session_id": format_id(SESSION_PREFIX, row["forked_from_id"]),
            "seq": row["forked_from_seq"],
        },
    )


def decode_data(text: str) -> dict[str, Any]:
    """A stored state document: each value is the JSON text of the host's value."""
    if text == "{}":
        return {}  # most sessions
    # Its values are JSON strings: only their own texts can hold a number.
    return {key: decode_json(value) for key, value in decode_json_of_strings(text).items()}


def _jsonb_order(key: str) -> tuple[int, str]:
    """Where jsonb puts a key: shorter UTF-8 first, then by bytes (code point order is the same)."""
    return (len(key) if key.isascii() else len(key.encode()), key)


def _inherited(path: str, documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The documents of the scopes on ``path``, outer first, merged in jsonb's key order."""
    found = [d for ancestor in ancestors(path) if (d := documents.get(ancestor))]
    if len(found) == 1:
        return found[0]  # decoded from jsonb: already in its order
    merged: dict[str, Any] = {}
    for document in found:
        merged.update(document)
    return {key: merged[key] for key in sorted(merged, key=_jsonb_order)}


def ancestors(path: str) -> list[str]:
    """The paths of the scopes on ``path``, outer first, itself last."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def page_sessions(rows: list[Row], documents: dict[str, str]) -> list[Session]:
    """The sessions of a listing page (:func:`cortex._sql.sessions.page_statement`), each with its merged state.

    ``documents``: the stored text of each scope document on the rows'
    paths (scope path to text). Each is decoded once for the page: a row's
    ``data`` is a dict of its own, in the key order a single read gives
    (jsonb's), whose values from a scope document are the same objects in
    every row of the page.
    """
    if not documents:
        return [row_to_session(row) for row in rows]
    decoded = {path: decode_data(text) for path, text in documents.items()}
    inherited: dict[str, dict[str, Any]] = {}
    out = []
    for row in rows:
        path = row["scope"]
        base = inherited.get(path)
        if base is None:
            base = inherited[path] = _inherited(path, decoded)
        own = decode_data(row["data"])
        if not base:
            data = own
        elif own.keys() <= base.keys():
            data = {**base, **own}  # no new key: the base's order holds
        else:
            merged = {**base, **own}
            data = {key: merged[key] for key in sorted(merged, key=_jsonb_order)}
        out.append(row_to_session(row, data))
    return out


def row_to_message(row: Row, prefix: str = "") -> Message:
    """Build the public model from a row selected with the message columns.

    ``prefix``: the columns are labelled ``<prefix><name>`` (a join beside
    another table's columns, as in :func:`cortex._calls.messages.select_session_with_messages`).
    """
    # Each is the JSON text as written (or, on rows written before revision
    # 20261205000020, as jsonb normalised it).
    requested, response = row[prefix + "requested_input"], row[prefix + "function_response"]
    questions = (
        [] if requested is None else [RequestedInput.model_construct(**decode_json(requested))]
    )
    answers = (
        [] if response is None else [FunctionResponse.model_construct(**decode_json(response))]
    )
    more = row[prefix + "more_requested_inputs"]
    if more is not None:
        questions += [RequestedInput.model_construct(**q) for q in decode_json(more)]
    more = row[prefix + "more_function_responses"]
    if more is not None:
        answers += [FunctionResponse.model_construct(**a) for a in decode_json(more)]
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


def row_to_pending(row: Any) -> PendingInput:
    """A pending input from a row selected with cortex._sql.operator.PENDING_COLUMNS."""
    schema, payload = row.response_schema, row.payload
    return PendingInput.model_construct(
        interrupt_id=row.interrupt_id,
        message=row.message,
        author=row.author,
        raised_at=row.raised_at,
        raised_seq=row.raised_seq,
        response_schema=None if schema is None else decode_json(schema),
        payload=None if payload is None else decode_json(payload),
    )
