"""The contract's pydantic models and every input limit, as Final constants.

Each limit is enforced here, in Python, before any SQL runs: a refused input
raises :class:`~cortex.errors.InvalidInput` naming the field, and nothing is
written. This module must not import the database layer.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cortex._schemas import check_response_schema
from cortex.errors import InvalidInput
from cortex.scope import Scope

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "MAX_AGENT_ID_LENGTH",
    "MAX_APPEND_BATCH",
    "MAX_CONTENT_BYTES",
    "MAX_JSON_BYTES",
    "MAX_LIST_LIMIT",
    "MAX_SEARCH_LENGTH",
    "MAX_TITLE_LENGTH",
    "PREVIEW_LENGTH",
    "FunctionResponse",
    "ListFilter",
    "Message",
    "NewMessage",
    "PendingInput",
    "RequestedInput",
    "Session",
    "SessionDetail",
    "SessionState",
]

MAX_TITLE_LENGTH: Final = 1_000
"""Characters in a title, an abort reason or an interrupt reason."""
MAX_AGENT_ID_LENGTH: Final = 128
"""Characters in an agent id, an interrupt id or a function-response id."""
MAX_JSON_BYTES: Final = 64 * 1024
"""UTF-8 bytes of compact JSON in metadata, a payload, a schema or a response."""
MAX_CONTENT_BYTES: Final = 1024 * 1024
"""UTF-8 bytes of one message's content."""
MAX_SEARCH_LENGTH: Final = 200
"""Characters in a ListFilter search term."""
MAX_LIST_LIMIT: Final = 1_000
"""Largest page a listing returns."""
DEFAULT_LIST_LIMIT: Final = 50
"""The page size when ListFilter.limit is 0 or unset."""
MAX_MESSAGE_LIMIT: Final = 1_000
"""Largest page of messages list_messages returns."""
DEFAULT_MESSAGE_LIMIT: Final = 100
MAX_APPEND_BATCH: Final = 1_000
"""Messages in one append_messages call."""
MAX_AUTHOR_LENGTH: Final = 128
"""Characters in a message author."""
PREVIEW_LENGTH: Final = 256
"""Characters of the last message kept in Session.last_message."""

Role = Literal["user", "assistant", "system", "tool"]


def invalid_input(exc: ValidationError) -> InvalidInput:
    """Turn pydantic's error into one readable InvalidInput line naming the field."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or exc.title
        cause = (error.get("ctx") or {}).get("error")
        message = str(cause) if isinstance(cause, Exception) else error["msg"]
        # The shared check_* helpers already name the field; keep the full path once.
        field = str(error["loc"][-1]) if error["loc"] else ""
        message = message.removeprefix(f"{field}: ")
        parts.append(f"{loc}: {message}")
    return InvalidInput("; ".join(parts))


class _Model(BaseModel):
    """Base of the contract models: pydantic errors surface as InvalidInput."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_input(exc) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise invalid_input(exc) from None


M = TypeVar("M", bound=BaseModel)


def from_database(cls: type[M], values: dict[str, Any]) -> M:
    """Build a model from values the database already holds, without validating them.

    What ``model_construct`` does, minus its per-field default handling: every
    field is present, so this only sets the instance's slots. Reading a page of
    50 sessions spent more time in ``model_construct`` than in PostgreSQL. A
    unit test keeps the result identical to ``model_construct``'s.
    """
    obj = cls.__new__(cls)
    # In field order, as model_construct leaves them (serialisation follows it).
    ordered = {name: values[name] for name in cls.__pydantic_fields__}
    object.__setattr__(obj, "__dict__", ordered)
    object.__setattr__(obj, "__pydantic_fields_set__", set(ordered))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


# --- field checks shared by the models and the store's plain arguments -------


def check_text(value: str, field: str, max_length: int) -> str:
    """Refuse NUL characters and more than ``max_length`` characters."""
    if "\x00" in value:
        raise InvalidInput(f"{field}: NUL characters are not allowed")
    if len(value) > max_length:
        raise InvalidInput(f"{field}: at most {max_length} characters, got {len(value)}")
    _check_encodable(value, field)
    return value


def check_identifier(value: str, field: str) -> str:
    """An opaque id: 1-128 printable characters, no whitespace."""
    check_text(value, field, MAX_AGENT_ID_LENGTH)
    if not value or not value.isprintable() or any(c.isspace() for c in value):
        raise InvalidInput(
            f"{field}: 1 to {MAX_AGENT_ID_LENGTH} printable characters, no whitespace"
        )
    return value


def check_json(value: Any, field: str) -> str:
    """Serialise a JSON value compactly, refusing what PostgreSQL's jsonb cannot hold.

    Returns the JSON text, so callers bind it without serialising twice.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{field}: not JSON-serialisable ({exc})") from None
    # jsonb rejects the \u0000 escape, and so does text: refuse NUL in keys and values.
    if "\\u0000" in text:
        raise InvalidInput(f"{field}: NUL characters are not allowed")
    size = len(_check_encodable(text, field).encode())
    if size > MAX_JSON_BYTES:
        raise InvalidInput(f"{field}: at most {MAX_JSON_BYTES} bytes of JSON, got {size}")
    return text


def _check_encodable(value: str, field: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInput(f"{field}: not valid Unicode (lone surrogate)") from None
    return value


def _check_metadata(value: dict[str, Any], field: str) -> dict[str, Any]:
    check_json(value, field)
    return value


# --- sessions -----------------------------------------------------------------


class SessionState(StrEnum):
    """What the store can prove about a session (precedence: top wins)."""

    ABORTED = "aborted"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    IDLE = "idle"


class Session(_Model):
    """A conversation thread of one agent in one scope.

    Ownership: ``agent_id``, ``title`` and ``metadata`` are host-owned (stored
    and returned verbatim, never interpreted). Everything else is
    cortex-owned; :meth:`cortex.Store.update_session` writes only ``title``
    and ``metadata``.
    """

    # cortex-owned: "ses_" TypeID over a UUIDv7, fixed at creation.
    id: str
    # host-owned: opaque agent id, fixed at creation.
    agent_id: str
    # cortex-owned: the exact scope the session was created in; never changes.
    scope: Scope
    # host-owned: written by create_session and update_session only.
    title: str = ""
    # host-owned: a JSON object, stored verbatim, never parsed by cortex.
    metadata: dict[str, Any] = Field(default_factory=dict)
    # cortex-owned: written only in the transaction that inserts messages.
    message_count: int = 0
    # cortex-owned: preview of the newest message, written with message_count.
    last_message: str = ""
    # cortex/host: at most one per (agent, exact scope); changed only through
    # create_session, resolve_session and set_default_session.
    is_default: bool = False
    # cortex-owned: set once by the backfill migration to its revision id.
    backfilled_by: str = ""
    # cortex-owned: what the store can prove (aborted > paused > interrupted > idle),
    # kept in the transactions that append messages and write markers.
    state: SessionState = SessionState.IDLE
    # cortex-owned: requested inputs no later message has answered.
    pending_count: int = 0
    # cortex-owned: tz-aware UTC.
    created_at: datetime
    # cortex-owned: moves on update_session and on every append.
    updated_at: datetime

    @field_validator("title")
    @classmethod
    def _title(cls, value: str) -> str:
        return check_text(value, "title", MAX_TITLE_LENGTH)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_metadata(value, "metadata")


class ListFilter(_Model):
    """Which sessions list_sessions, count_sessions and iter_sessions return.

    Every field is optional; the scope always comes from the context.
    """

    agent_id: str | None = None
    exact: bool = False
    default_only: bool = False
    search: str | None = None
    state: SessionState | None = None
    limit: int = 0
    offset: int = 0

    @field_validator("agent_id")
    @classmethod
    def _agent(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "agent_id")

    @field_validator("search")
    @classmethod
    def _search(cls, value: str | None) -> str | None:
        return None if value is None else check_text(value, "search", MAX_SEARCH_LENGTH)

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int) -> int:
        if not 0 <= value <= MAX_LIST_LIMIT:
            raise ValueError(f"must be 1 to {MAX_LIST_LIMIT} (0 means {DEFAULT_LIST_LIMIT})")
        return value

    @field_validator("offset")
    @classmethod
    def _offset(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be 0 or more")
        return value

    @property
    def page_size(self) -> int:
        """The effective limit: ``limit``, or the default page size when it is 0."""
        return self.limit or DEFAULT_LIST_LIMIT


# --- messages -----------------------------------------------------------------


class RequestedInput(_Model):
    """A question a message asks of a human; pending until answered."""

    interrupt_id: str
    message: str = ""
    # A JSON Schema the answer must validate against, checked when appended.
    response_schema: dict[str, Any] | None = None
    payload: Any = None

    @field_validator("interrupt_id")
    @classmethod
    def _interrupt_id(cls, value: str) -> str:
        return check_identifier(value, "interrupt_id")

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        return check_text(value, "message", MAX_TITLE_LENGTH)

    @field_validator("response_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        check_json(value, "response_schema")
        # Refused here, when asked, if answers could not be checked against it
        # safely (see cortex._schemas): never discovered at resume.
        check_response_schema(value)
        return value

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: Any) -> Any:
        check_json(value, "payload")
        return value


class FunctionResponse(_Model):
    """The answer to a requested input (``id`` equals its ``interrupt_id``)."""

    id: str
    name: str = ""
    response: Any = Field(default_factory=dict)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return check_identifier(value, "id")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_text(value, "name", MAX_AGENT_ID_LENGTH)

    @field_validator("response")
    @classmethod
    def _response(cls, value: Any) -> Any:
        check_json(value, "response")
        return value


class NewMessage(_Model):
    """A message to append; cortex assigns its id, seq and created_at."""

    role: Role
    content: str = ""
    author: str = ""
    requested_input: RequestedInput | None = None
    function_response: FunctionResponse | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, role: Role, content: str = "", **data: Any) -> None:
        super().__init__(role=role, content=content, **data)

    @field_validator("content")
    @classmethod
    def _content(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("NUL characters are not allowed")
        size = len(_check_encodable(value, "content").encode())
        if size > MAX_CONTENT_BYTES:
            raise ValueError(f"at most {MAX_CONTENT_BYTES} bytes, got {size}")
        return value

    @field_validator("author")
    @classmethod
    def _author(cls, value: str) -> str:
        return check_text(value, "author", MAX_AUTHOR_LENGTH)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_metadata(value, "metadata")

    def preview(self) -> str:
        """The bounded text a session shows as its ``last_message``."""
        return self.content[:PREVIEW_LENGTH]


class Message(_Model):
    """A stored message. ``seq`` is its 1-based, gap-free position in the session."""

    id: str
    session_id: str
    seq: int
    # Rows written before sessions existed may carry roles outside the four.
    role: str
    content: str = ""
    author: str = ""
    requested_input: RequestedInput | None = None
    function_response: FunctionResponse | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class PendingInput(_Model):
    """A requested input no later message has answered."""

    interrupt_id: str
    message: str = ""
    author: str = ""
    raised_at: datetime
    # seq of the message that asked.
    raised_seq: int
    response_schema: dict[str, Any] | None = None
    payload: Any = None


class SessionDetail(_Model):
    """A session with its operator state: what :meth:`cortex.Store.inspect_session` returns."""

    session: Session
    state: SessionState
    # Every pending input, oldest first; empty when the session is aborted.
    pending: list[PendingInput] = Field(default_factory=list)
    abort_reason: str | None = None
    interrupt_reason: str | None = None
