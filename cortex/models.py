"""The contract's pydantic models and every input limit, as Final constants.

Each limit is enforced here, in Python, before any SQL runs: a refused input
raises :class:`~cortex.errors.InvalidInput` naming the field, and nothing is
written. This module must not import the database layer.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache, partial
from json.encoder import encode_basestring as _json_string
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Self, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    Strict,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from cortex._schemas import check_response_schema
from cortex._validate import encode_json, invalid_input
from cortex.errors import InvalidInput
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, parse_id
from cortex.scope import Scope

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "INT4_MAX",
    "MAX_AGENT_ID_LENGTH",
    "MAX_APPEND_BATCH",
    "MAX_APPEND_BYTES",
    "MAX_CONTENT_BYTES",
    "MAX_DATA_BYTES",
    "MAX_IDLE",
    "MAX_JSON_BYTES",
    "MAX_KEY_LENGTH",
    "MAX_LIST_LIMIT",
    "MAX_METADATA_FILTER_KEYS",
    "MAX_PAYLOAD_BYTES",
    "MAX_SEARCH_LENGTH",
    "MAX_TITLE_LENGTH",
    "PREVIEW_LENGTH",
    "RESERVED_DATA_PREFIX",
    "Erasure",
    "ErasureReport",
    "ErasureState",
    "ForkedFrom",
    "FunctionResponse",
    "ImportReport",
    "ListFilter",
    "Message",
    "NewMessage",
    "PendingInput",
    "RequestedInput",
    "RetentionPolicy",
    "RetentionReport",
    "Session",
    "SessionCursor",
    "SessionDetail",
    "SessionPage",
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
MAX_PAYLOAD_BYTES: Final = 16 * 1024 * 1024
"""UTF-8 bytes of compact JSON in one message's payload (an agent framework's
event or item). Events carry inline files and long tool results, so far more
than metadata's 64 KiB; 16 MiB keeps four of the largest in one append under
MAX_APPEND_BYTES (which payloads count towards)."""
MAX_DATA_BYTES: Final = 1024 * 1024
"""Bytes of one state document (a session's or a scope's) as stored: each
value's JSON text, quoted, in a jsonb object. A delta is bounded the same; a
delta that would grow a document past it is refused and nothing is written."""
MAX_KEY_LENGTH: Final = 512
"""Characters in a session key (after trimming)."""
MAX_SCOPE_DATA: Final = 8
"""Scopes one call may write state to (a scope has at most 8 segments)."""
MAX_IDLE: Final = timedelta(days=36_500)
"""The longest ``RetentionPolicy.delete_idle_after``: a hundred years."""
MAX_SEARCH_LENGTH: Final = 200
"""Characters in a ListFilter search term."""
MAX_METADATA_FILTER_KEYS: Final = 16
"""Top-level keys one ListFilter.metadata may name (each is one condition in the statement)."""
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
MAX_INPUTS_PER_MESSAGE: Final = 1_000
"""Requested inputs one message asks, and function responses one message gives."""
PREVIEW_LENGTH: Final = 256
"""Characters of the last message kept in Session.last_message."""
RESERVED_DATA_PREFIX: Final = "__cortex_"
"""State keys beginning with this are cortex's own (its adapters' bookkeeping,
such as the ADK service's last update time): stored in a session's document
like any key, and never part of ``Session.data`` or ``get_scope_data``."""

INT4_MAX: Final = 2**31 - 1
"""Largest value a PostgreSQL ``integer`` holds: a seq, an offset."""
MAX_APPEND_BYTES: Final = 64 * 1024 * 1024
"""UTF-8 bytes in one append_messages call: every message's content, author,
metadata, requested input and function response, added up. One append is one
statement; 64 MiB keeps it far from PostgreSQL's 1 GB protocol message limit
(and from its 1 GB limit on one array value), and bounds the client's memory."""

Role = Literal["user", "assistant", "system", "tool"]


# --- field checks shared by the models and the store's arguments -------------
#
# Each check raises ValueError without the field's name; pydantic reports it
# under the field (or parameter) it checked, and cortex._validate turns that
# into one InvalidInput naming it.


def _limited_text(max_length: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if "\x00" in value:
            raise ValueError("NUL characters are not allowed")
        if len(value) > max_length:
            raise ValueError(f"at most {max_length} characters, got {len(value)}")
        if not value.isascii():
            _utf8_size(value)
        return value

    return check


def _identifier(value: str) -> str:
    if (
        not value
        or len(value) > MAX_AGENT_ID_LENGTH
        or not value.isprintable()
        or any(c.isspace() for c in value)
    ):
        raise ValueError(f"1 to {MAX_AGENT_ID_LENGTH} printable characters, no whitespace")
    _limited_text(MAX_AGENT_ID_LENGTH)(value)
    return value


def _utf8_size(value: str) -> int:
    if value.isascii():  # O(1) in CPython: no copy for the common case
        return len(value)
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (lone surrogate)") from None


def _content(value: str) -> str:
    if "\x00" in value:
        raise ValueError("NUL characters are not allowed")
    size = _utf8_size(value)
    if size > MAX_CONTENT_BYTES:
        raise ValueError(f"at most {MAX_CONTENT_BYTES} bytes, got {size}")
    return value


def _json(value: Any) -> Any:
    encode_json(value, MAX_JSON_BYTES)
    return value


def _payload(value: Any) -> Any:
    encode_json(value, MAX_PAYLOAD_BYTES)
    return value


class _MetadataFilter(dict[str, Any]):
    """A validated metadata filter, with each value's compact JSON text kept, by key.

    The texts are taken when the filter is validated: a value the caller
    changes afterwards does not reach the statement unchecked.
    """

    pairs: tuple[tuple[str, str], ...]


def _metadata_filter(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_METADATA_FILTER_KEYS:
        raise ValueError(f"at most {MAX_METADATA_FILTER_KEYS} keys, got {len(value)}")
    # The whole filter, as metadata is bounded: a larger one could match nothing.
    encode_json(value, MAX_JSON_BYTES)
    checked = _MetadataFilter(value)
    checked.pairs = tuple(
        (key, encode_json(item, MAX_JSON_BYTES)) for key, item in sorted(value.items())
    )
    return checked


def _aware(value: datetime) -> datetime:
    try:
        offset = value.utcoffset()
        if offset is None:
            raise ValueError("a timezone-aware datetime (with a UTC offset), not a naive one")
        return value.astimezone(UTC)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"not a datetime PostgreSQL can hold in UTC ({exc})") from None


def _session_key(value: str) -> str:
    key = value.strip()
    if not key:
        raise ValueError("1 or more characters besides whitespace")
    return _limited_text(MAX_KEY_LENGTH)(key)


class _EncodedData(dict[str, Any]):
    """A validated state document or delta, with its stored form (``encode_data``) kept.

    What the ``Data`` annotation hands the store, so the store does not
    encode the document a second time (a copy made at validation: the
    caller's dict may change afterwards, this one does not).
    """

    stored: dict[str, str]


def encode_data(value: dict[str, Any]) -> dict[str, str]:
    """A state document or delta as stored: each key to the compact JSON text of its value.

    Raises:
        ValueError: a value is not JSON, a key is empty or holds NUL, or the
            document is more than MAX_DATA_BYTES as stored.
    """
    if isinstance(value, _EncodedData):
        return value.stored
    out: dict[str, str] = {}
    size = 2
    for key, item in value.items():
        if not isinstance(key, str) or not key or "\x00" in key:
            raise ValueError("keys are non-empty strings without NUL characters")
        text = encode_json(item, MAX_DATA_BYTES)
        out[key] = text
        # jsonb's text form: "key": "text", with the text's quotes escaped;
        # counted as the compact {"key":"text"} of both strings, plus one.
        size += len(_json_string(key).encode()) + len(_json_string(text).encode()) + 4
    if size > MAX_DATA_BYTES:
        raise ValueError(f"at most {MAX_DATA_BYTES} bytes as stored, got {size}")
    return out


def _data(value: dict[str, Any]) -> dict[str, Any]:
    checked = _EncodedData(value)
    checked.stored = encode_data(value)
    return checked


def _state_patch(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if not isinstance(key, str) or not key or "\x00" in key:
            raise ValueError("keys are non-empty strings without NUL characters")
        if key.startswith(RESERVED_DATA_PREFIX):
            raise ValueError(f"{key!r}: keys beginning {RESERVED_DATA_PREFIX!r} are cortex's own")
    # Twice a document's bound: a patch may remove as much as it adds.
    encode_json(value, 2 * MAX_DATA_BYTES)
    return value


def _scope_data(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if len(value) > MAX_SCOPE_DATA:
        raise ValueError(f"at most {MAX_SCOPE_DATA} scopes, got {len(value)}")
    for path in value:
        try:
            Scope.parse(path)
        except InvalidInput as exc:
            raise ValueError(f"{path!r}: {exc}") from None
    return value


@lru_cache(maxsize=4096)
def session_uuid(value: str) -> uuid.UUID:
    """The uuid behind a ``ses_…`` id, parsed once for the validator and the store body.

    Raises:
        InvalidInput: a malformed or wrong-prefix id (refusals are not cached).
    """
    return parse_id(SESSION_PREFIX, value)


def _session_id(value: str) -> str:
    try:
        session_uuid(value)
    except InvalidInput as exc:
        raise ValueError(str(exc).removeprefix("id: ")) from None
    return value


def _message_id(value: str) -> str:
    try:
        parse_id(MESSAGE_PREFIX, value)
    except InvalidInput as exc:
        raise ValueError(str(exc).removeprefix("id: ")) from None
    return value


# The argument and field types: strict (no int for a string, no "1" or True for
# an int, no bytes for text), each with its limit.
Title = Annotated[str, Strict(), AfterValidator(_limited_text(MAX_TITLE_LENGTH))]
"""A title, an abort reason, an interrupt reason, a question's message: 0-1,000 characters."""
Reason = Title
Author = Annotated[str, Strict(), AfterValidator(_limited_text(MAX_AUTHOR_LENGTH))]
"""A message author: 0-128 characters."""
ShortText = Annotated[str, Strict(), AfterValidator(_limited_text(MAX_AGENT_ID_LENGTH))]
AgentId = Annotated[str, Strict(), AfterValidator(_identifier)]
"""An opaque id (agent, interrupt, function response): 1-128 printable characters, no whitespace."""
InterruptId = AgentId
SearchTerm = Annotated[str, Strict(), AfterValidator(_limited_text(MAX_SEARCH_LENGTH))]
Content = Annotated[str, Strict(), AfterValidator(_content)]
SessionId = Annotated[str, Strict(), AfterValidator(_session_id)]
"""A ``ses_…`` TypeID."""
MessageId = Annotated[str, Strict(), AfterValidator(_message_id)]
"""A ``msg_…`` TypeID."""
Metadata = Annotated[dict[str, Any], Strict(), AfterValidator(_json)]
"""A JSON object of at most 64 KiB, string keys at every depth, stored verbatim."""
Payload = Annotated[Any, AfterValidator(_payload)]
"""Any JSON value of at most 16 MiB: a message's structured payload, stored verbatim."""
SessionKey = Annotated[str, Strict(), AfterValidator(_session_key)]
"""A host-chosen session key: trimmed, then 1-512 characters, no NUL."""
Data = Annotated[dict[str, Any], Strict(), AfterValidator(_data)]
"""A state document or delta: top-level keys, each value any JSON, at most 1 MiB as stored."""
StatePatch = Annotated[dict[str, Any], Strict(), AfterValidator(_state_patch)]
"""A merge patch (RFC 7386) or a whole document for a scope's state: top-level keys, JSON values."""
ScopeData = Annotated[dict[str, Data], Strict(), AfterValidator(_scope_data)]
"""State deltas by scope path (``"acme/app"``), at most 8 scopes."""
JsonValue = Annotated[Any, AfterValidator(_json)]
"""Any JSON value of at most 64 KiB (a payload, a response)."""
Flag = Annotated[bool, Strict()]
Seq = Annotated[int, Strict(), Field(ge=0, le=INT4_MAX)]
"""A message position, 0 to 2**31 - 1 (PostgreSQL ``integer``)."""
Offset = Seq
BeforeSeq = Annotated[int, Strict(), Field(ge=1, le=INT4_MAX)]
"""A position to read before: 1 to 2**31 - 1."""
# 0 means the default page, as ListFilter's limit does: one rule for every limit.
MessageLimit = Annotated[
    int,
    Strict(),
    Field(ge=0, le=MAX_MESSAGE_LIMIT),
    AfterValidator(lambda limit: limit or DEFAULT_MESSAGE_LIMIT),
]
ListLimit = Annotated[int, Strict(), Field(ge=0, le=MAX_LIST_LIMIT)]
MetadataFilter = Annotated[dict[str, Any], Strict(), AfterValidator(_metadata_filter)]
"""Top-level metadata keys to the JSON value each must hold: at most 16 keys, 64 KiB of JSON."""
AwareTime = Annotated[datetime, Strict(), AfterValidator(_aware)]
"""A timezone-aware datetime (kept as the same instant in UTC); a naive one is refused."""


def invalid(value: Any, field: str, check: Callable[[Any], Any]) -> Any:
    """Run one field check outside a model; InvalidInput naming ``field`` if it fails."""
    try:
        return check(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}") from None


def check_text(value: str, field: str, max_length: int) -> str:
    """Refuse NUL characters and more than ``max_length`` characters."""
    return cast(str, invalid(value, field, _limited_text(max_length)))


def check_identifier(value: str, field: str) -> str:
    """An opaque id: 1-128 printable characters, no whitespace."""
    return cast(str, invalid(value, field, _identifier))


def check_json(value: Any, field: str) -> str:
    """Serialise a JSON value compactly (the text that is stored), refusing what cortex cannot hold.

    Returns the JSON text, so callers bind it without serialising twice.
    """
    return cast(str, invalid(value, field, partial(encode_json, max_bytes=MAX_JSON_BYTES)))


class _Model(BaseModel):
    """Base of the contract models: pydantic errors surface as InvalidInput.

    ``revalidate_instances``: a model passed to the store (or nested in
    another) is validated again, so one built with ``model_construct`` or
    changed with ``model_copy(update=...)`` cannot carry an unchecked value
    past the boundary.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, revalidate_instances="always"
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid_input(exc) from None

    # Only a direct call needs this __init__ (its errors become InvalidInput
    # there); pydantic's own validation of a model (re-validation at the
    # boundary, a nested model, model_validate) goes straight to the core.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise invalid_input(exc) from None

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Self:
        """Validate like pydantic; a refusal is InvalidInput naming the field."""
        try:
            return super().model_validate(*args, **kwargs)
        except ValidationError as exc:
            raise invalid_input(exc) from None

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> Self:
        """Validate JSON like pydantic; a refusal is InvalidInput naming the field."""
        try:
            return super().model_validate_json(*args, **kwargs)
        except ValidationError as exc:
            raise invalid_input(exc) from None

    @classmethod
    def model_validate_strings(cls, *args: Any, **kwargs: Any) -> Self:
        """Validate strings like pydantic; a refusal is InvalidInput naming the field."""
        try:
            return super().model_validate_strings(*args, **kwargs)
        except ValidationError as exc:
            raise invalid_input(exc) from None


M = TypeVar("M", bound=BaseModel)


def from_database(
    cls: type[M],
    values: dict[str, Any],
    private: dict[str, Any] | None = None,
    *,
    in_field_order: bool = False,
) -> M:
    """Build a model from values the database already holds, without validating them.

    What ``model_construct`` does, minus its per-field default handling: every
    field is present, so this only sets the instance's slots. Reading a page of
    50 sessions spent more time in ``model_construct`` than in PostgreSQL. A
    model with private attributes (an ADK ``Session``, cortex's ``Session``)
    gets ``private``, which must name every one; without it, their defaults.
    ``in_field_order``: the caller built ``values`` in the model's field
    order (a listing's rows, cortex._calls.rows.row_to_session), so they are
    taken as they are. Unit tests keep the result identical to
    ``model_construct``'s, for cortex's models and for ADK's session.
    """
    obj = _new(cls)
    # In field order, as model_construct leaves them (serialisation follows it).
    _set_dict(obj, values if in_field_order else {n: values[n] for n in cls.__pydantic_fields__})
    _set_fields_set(obj, set(_field_names(cls)))
    _set_extra(obj, None)
    _set_private(obj, private)
    if private is None and cls.__private_attributes__:
        obj.model_post_init(None)  # their defaults, as model_construct sets them
    return obj


_new: Final = object.__new__
_set: Final = object.__setattr__


def _slot_setter(name: str) -> Callable[[Any, Any], None]:
    """Set BaseModel's slot ``name`` on an instance straight through its descriptor.

    ``object.__setattr__`` looks the name up along the class's MRO first, a
    cost every listed row pays (docs/benchmarks.md, 2026-12-01). Should
    pydantic stop declaring the slot, the setter falls back on that lookup.
    """
    slot = BaseModel.__dict__.get(name)
    setter = getattr(slot, "__set__", None)
    if setter is None:
        return partial(_set_named, name)
    return cast(Callable[[Any, Any], None], setter)


def _set_named(name: str, obj: Any, value: Any) -> None:
    _set(obj, name, value)


_set_dict: Final = _slot_setter("__dict__")
_set_fields_set: Final = _slot_setter("__pydantic_fields_set__")
_set_extra: Final = _slot_setter("__pydantic_extra__")
_set_private: Final = _slot_setter("__pydantic_private__")


@functools.cache
def _field_names(cls: type[BaseModel]) -> frozenset[str]:
    return frozenset(cls.__pydantic_fields__)


# --- sessions -----------------------------------------------------------------


class SessionState(StrEnum):
    """What the store can prove about a session (precedence: top wins)."""

    ABORTED = "aborted"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    IDLE = "idle"


class ForkedFrom(_Model):
    """Where a forked session came from: :meth:`cortex.Store.fork_session`'s source and position."""

    # The source session's "ses_" id; the source may have been deleted since.
    session_id: str
    # The source's last seq copied into the fork (0: an empty fork).
    seq: int


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
    title: Title = ""
    # host-owned: a JSON object, stored as the JSON text it serialises to and
    # returned decoded from that text, so every value comes back as sent.
    metadata: Metadata = Field(default_factory=dict)
    # cortex-owned: the messages the session holds, written in the
    # transactions that insert or remove them, so it always equals the rows.
    message_count: int = 0
    # cortex-owned: how many of its oldest messages retention removed
    # (Store.apply_retention); the kept ones run from seq trimmed_count + 1
    # to trimmed_count + message_count without a gap. 0 until a trim.
    trimmed_count: int = 0
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
    # host-owned: the key the host names this session by (trimmed), unique per
    # (agent, exact scope); fixed at creation. None: the session has no key.
    key: str | None = None
    # host-owned: the session's state merged with its scopes' state documents,
    # outer scope first, inner scopes override, the session's own document
    # last. Written by create_session and by the appends that carry a delta;
    # update_session ignores it.
    data: dict[str, Any] = Field(default_factory=dict)
    # cortex-owned: the source and position of a session made by
    # fork_session, fixed at creation; None on every other session.
    forked_from: ForkedFrom | None = None
    # cortex-owned: tz-aware UTC.
    created_at: datetime
    # cortex-owned: moves on update_session and on every append.
    updated_at: datetime
    # cortex-owned: the session document's keys beginning RESERVED_DATA_PREFIX,
    # which cortex's adapters keep there and ``data`` leaves out.
    _reserved_data: dict[str, Any] = PrivateAttr(default_factory=dict)


class ListFilter(_Model):
    """Which sessions list_sessions, count_sessions and iter_sessions return.

    Every field is optional and they combine (AND); the scope always comes
    from the context.

    ``metadata``: sessions whose metadata holds every given top-level key
    with exactly that JSON value. Values compare as JSON values, not as
    text: objects are equal whatever their key order, numbers by value
    (``1`` equals ``1.0``), ``true`` never equals ``1``, and ``None`` (JSON
    ``null``) matches a key that holds ``null``, never a missing key. ``{}``
    filters nothing. At most 16 keys and 64 KiB of JSON.

    ``created_after``, ``created_before``, ``updated_after``,
    ``updated_before``: exclusive bounds on ``created_at`` and
    ``updated_at``, timezone-aware datetimes only (a naive one is
    InvalidInput). A window whose after is not before its before (``after
    >= before``) is allowed and matches nothing. ``updated_*`` bounds narrow
    the listing's index walk; ``created_*`` bounds are checked on each row
    the walk reads. Across a whole tenant a ``metadata`` filter reads its
    candidates from ``metadata_pairs`` first, newest hours first, as many
    hours as hold a page (revision 20261205000026; the exact check still
    runs on each); a value common in those hours, a filter in a scope below
    the tenant, and any filter on Citus, is checked on each row the walk
    reads.
    """

    agent_id: AgentId | None = None
    exact: Flag = False
    default_only: Flag = False
    search: SearchTerm | None = None
    state: SessionState | None = None
    metadata: MetadataFilter | None = None
    created_after: AwareTime | None = None
    created_before: AwareTime | None = None
    updated_after: AwareTime | None = None
    updated_before: AwareTime | None = None
    # 1-1000; 0 means DEFAULT_LIST_LIMIT.
    limit: ListLimit = 0
    # 0 to 2**31 - 1: PostgreSQL's OFFSET takes a bigint, but no listing is
    # that deep, and the bound keeps every integer cortex binds an int4.
    offset: Offset = 0

    @property
    def page_size(self) -> int:
        """The effective limit: ``limit``, or the default page size when it is 0."""
        return self.limit or DEFAULT_LIST_LIMIT

    @property
    def metadata_pairs(self) -> tuple[tuple[str, str], ...]:
        """Each metadata key with its value's compact JSON text, in key order (none: ``()``)."""
        if not self.metadata:
            return ()
        if isinstance(self.metadata, _MetadataFilter):
            return self.metadata.pairs
        return cast(_MetadataFilter, _metadata_filter(self.metadata)).pairs


class SessionCursor(_Model):
    """Where a page of :meth:`cortex.Store.list_sessions_page` ended: the next page starts after it.

    A plain token: the last session's ``updated_at`` and ``id`` (the
    listing's order) and ``listing``, a digest of the scope and filter it
    continues. A cursor is good for that listing only: presented with
    another filter or from another scope, it is InvalidInput. A host that
    hands cursors to clients should sign them (``cortex serve`` does).
    """

    updated_at: AwareTime
    id: SessionId
    listing: Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{32}$")]


class SessionPage(_Model):
    """One page of a listing and the cursor of the next (None: this page is the last)."""

    items: list[Session]
    next_cursor: SessionCursor | None = None


# --- messages -----------------------------------------------------------------


class RequestedInput(_Model):
    """A question a message asks of a human; pending until answered."""

    interrupt_id: InterruptId
    message: Title = ""
    # A JSON Schema the answer must validate against, checked when appended.
    response_schema: dict[str, Any] | None = None
    payload: JsonValue = None

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


class FunctionResponse(_Model):
    """The answer to a requested input (``id`` equals its ``interrupt_id``)."""

    id: InterruptId
    name: ShortText = ""
    response: JsonValue = Field(default_factory=dict)


def _same(model: type[BaseModel], one: Any, other: Any) -> bool:
    """Whether two inputs (models or dicts) validate to the same model; False if either does not."""
    try:
        return model.model_validate(one) == model.model_validate(other)
    except (InvalidInput, ValidationError, TypeError, ValueError):
        return False  # pydantic reports the bad one, naming its field


def _fold(data: dict[str, Any], one: str, many: str, model: type[BaseModel]) -> None:
    """Fold the single field ``one`` into the list ``many``, the one place the values live.

    ``one`` alone is a list of one. Given beside the list (as a dump of a
    message carries it) it must be the list's first; None says nothing.
    """
    every = data.get(many)
    if every is not None and not isinstance(every, list | tuple | str | bytes | dict):
        # Any other iterable, as pydantic would take it; if not iterable,
        # pydantic refuses it, naming the field.
        with contextlib.suppress(TypeError):
            every = data[many] = list(every)
    if one not in data:
        return
    first = data.pop(one)
    if first is None:
        return
    if not every:
        data[many] = [first]
    elif not isinstance(every, list | tuple) or not _same(model, first, every[0]):
        raise ValueError(f"give {one} or {many} (the first of which {one} is), not both")


def _distinct(ids: list[str], what: str) -> None:
    if len(set(ids)) != len(ids):
        raise ValueError(f"{what}: one message names an id twice")


class _Inputs(_Model):
    """What a message asks and answers: the lists ``requested_inputs`` and ``function_responses``.

    ``requested_inputs``: every question the message asks (an agent
    framework's turn may ask several at once: an ADK event with parallel
    long-running calls); each is pending until answered.
    ``function_responses``: every answer it gives. The lists are the one
    shape to read, and are declared by the subclasses, in their field order.

    ``requested_input`` and ``function_response`` are deprecated: the first
    of each list (None if it is empty), kept for the single-question form
    (``NewMessage(requested_input=...)``, which makes a list of one, as
    assigning does). ``model_dump`` still carries them; the command line's
    JSON does not.
    """

    if TYPE_CHECKING:
        requested_inputs: list[RequestedInput]
        function_responses: list[FunctionResponse]

    @model_validator(mode="before")
    @classmethod
    def _one_list(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            _fold(data, "requested_input", "requested_inputs", RequestedInput)
            _fold(data, "function_response", "function_responses", FunctionResponse)
        return data

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def requested_input(self) -> RequestedInput | None:
        """Deprecated: ``requested_inputs[0]`` (None if it asks none); read the list."""
        return self.requested_inputs[0] if self.requested_inputs else None

    @requested_input.setter
    def requested_input(self, value: RequestedInput | None) -> None:
        self.requested_inputs = [] if value is None else [value]

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def function_response(self) -> FunctionResponse | None:
        """Deprecated: ``function_responses[0]`` (None if it gives none); read the list."""
        return self.function_responses[0] if self.function_responses else None

    @function_response.setter
    def function_response(self, value: FunctionResponse | None) -> None:
        self.function_responses = [] if value is None else [value]

    @field_validator("requested_inputs", check_fields=False)
    @classmethod
    def _distinct_questions(cls, value: list[RequestedInput]) -> list[RequestedInput]:
        _distinct([q.interrupt_id for q in value], "requested_inputs")
        return value

    @field_validator("function_responses", check_fields=False)
    @classmethod
    def _distinct_answers(cls, value: list[FunctionResponse]) -> list[FunctionResponse]:
        _distinct([a.id for a in value], "function_responses")
        return value


class NewMessage(_Inputs):
    """A message to append; cortex assigns its seq and created_at (and its id, unless given).

    ``id``: a caller-chosen ``msg_…`` id, the append's idempotency key. A
    retried append whose messages carry the ids of an earlier, committed one
    returns the stored messages instead of storing them again (see
    :meth:`cortex.Store.append_messages`).
    """

    role: Role
    content: Content = ""
    author: Author = ""
    requested_inputs: Annotated[list[RequestedInput], Field(max_length=MAX_INPUTS_PER_MESSAGE)] = (
        Field(default_factory=list)
    )
    function_responses: Annotated[
        list[FunctionResponse], Field(max_length=MAX_INPUTS_PER_MESSAGE)
    ] = Field(default_factory=list)
    metadata: Metadata = Field(default_factory=dict)
    id: MessageId | None = None
    # A structured payload (an agent framework's event or item), stored and
    # returned verbatim; role and content stay what listing and search read.
    payload: Payload = None

    if TYPE_CHECKING:

        def __init__(self, role: Role, content: str = "", **data: Any) -> None: ...

    else:

        def __init__(self, *args: Any, **data: Any) -> None:
            # role and content may come by position; anything else (a missing
            # role from model_validate, a third positional) is reported by
            # pydantic or here as InvalidInput, never as TypeError.
            if len(args) > 2:
                raise InvalidInput("NewMessage: takes role and content by position, nothing more")
            for name, value in zip(("role", "content"), args, strict=False):
                if name in data:
                    raise InvalidInput(f"{name}: given by position and by name")
                data[name] = value
            super().__init__(**data)

        __init__.__pydantic_base_init__ = True

    def preview(self) -> str:
        """The bounded text a session shows as its ``last_message``."""
        return self.content[:PREVIEW_LENGTH]


class Message(_Inputs):
    """A stored message. ``seq`` is its 1-based, gap-free position in the session."""

    id: str
    session_id: str
    seq: int
    # Rows written before sessions existed may carry roles outside the four.
    role: str
    content: str = ""
    author: str = ""
    # Every question and answer of the message (the deprecated
    # requested_input and function_response read the first of each).
    requested_inputs: list[RequestedInput] = Field(default_factory=list)
    function_responses: list[FunctionResponse] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # host-owned: the structured payload as appended (None if there was none).
    payload: Any = None
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
    # Every pending input, oldest first (the questions of one message by interrupt_id);
    # empty when the session is aborted.
    pending: list[PendingInput] = Field(default_factory=list)
    abort_reason: str | None = None
    interrupt_reason: str | None = None


# --- a scope's lifecycle: erasure, export, import ---------------------------------


class ErasureState(StrEnum):
    """Where an erasure stands: ``running`` until its last batch commits, then ``done``."""

    RUNNING = "running"
    DONE = "done"


class Erasure(_Model):
    """The durable receipt of one erasure: when, which scope, how much. Never what.

    Written when the erasure begins and updated in the transaction of each of
    its batches, so the counts are what was removed. A receipt left
    ``running`` (the erasing process died) is finished by the next erasure
    of the same scope. Receipts are never deleted by the store.
    """

    # cortex-owned: "era_" TypeID over a UUIDv7.
    id: str
    # The scope erased: everything at it and beneath it.
    scope: Scope
    state: ErasureState
    # When the erasure began (tz-aware UTC).
    at: datetime
    # When its last batch committed; None while running.
    finished_at: datetime | None = None
    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    scope_documents: int = 0


class ErasureReport(_Model):
    """What :meth:`cortex.Store.erase_scope` removed (or, with ``dry_run``, would remove).

    ``messages`` counts every message of the removed sessions (and legacy
    messages the backfill left outside a session in the scope);
    ``pending_inputs`` the open questions, ``markers`` the abort and
    interrupt markers (parked ones too), ``scope_documents`` the scope
    state documents at and beneath the scope. ``receipt`` is the durable
    receipt (None on a dry run), its counts the erasure's over every call
    that worked on it (a resumed erasure's included).
    """

    scope: Scope
    dry_run: bool = False
    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    scope_documents: int = 0
    receipt: Erasure | None = None


class ImportReport(_Model):
    """What :meth:`cortex.Store.import_scope` wrote, and what it found already there, identical.

    Importing an export a second time writes nothing: every row counts in
    ``unchanged``.
    """

    # Where the export's root scope now lives (``into``, else the export's root).
    scope: Scope
    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    scope_documents: int = 0
    # Rows already stored exactly as exported (nothing written for them).
    unchanged: int = 0


# --- retention -------------------------------------------------------------------------


def _idle_period(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"a positive duration, got {value}")
    if value > MAX_IDLE:
        raise ValueError(f"at most {MAX_IDLE.days:,} days, got {value}")
    if value.microseconds:
        raise ValueError(f"whole seconds, got {value}")
    return value


def _rfc3339_duration(value: timedelta) -> str:
    """``value`` in RFC 3339's duration grammar (Appendix A), which has no years nor fractions.

    pydantic's own ISO 8601 form may start with years (``P13Y169D``), which
    a JSON Schema ``format: duration`` check refuses.
    """
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"P{value.days}D" if value.days else "P"
    if hours:
        # The grammar lets an hour be followed by minutes only, and minutes by seconds only.
        text += f"T{hours}H" + (f"{minutes}M" if minutes or seconds else "")
        text += f"{seconds}S" if seconds else ""
    elif minutes:
        text += f"T{minutes}M" + (f"{seconds}S" if seconds else "")
    elif seconds:
        text += f"T{seconds}S"
    return text


IdlePeriod = Annotated[
    timedelta,
    Strict(),
    AfterValidator(_idle_period),
    PlainSerializer(_rfc3339_duration, return_type=str, when_used="json"),
]
KeepCount = Annotated[int, Strict(), Field(ge=1, le=INT4_MAX)]


class RetentionPolicy(_Model):
    """How long the sessions of a scope (and beneath it) are kept, and how much of each.

    Set with :meth:`cortex.Store.set_retention_policy`; a session follows the
    nearest policy at or above its own scope, as a whole (a policy beneath
    another replaces it there, fields it leaves None included).
    :meth:`cortex.Store.apply_retention` carries the policies out.
    """

    # Erase a session (with its messages, pending inputs and markers) once it
    # has had no append and no update for this long. None: never for idleness.
    delete_idle_after: IdlePeriod | None = None
    # Keep only a session's newest this many messages (and every message from
    # its oldest pending question on). None: keep them all.
    keep_last_messages: KeepCount | None = None
    # Erase an idle session even while it waits for an answer (paused).
    include_paused: Flag = False


class RetentionReport(_Model):
    """What :meth:`cortex.Store.apply_retention` removed (or, with ``dry_run``, would remove).

    ``sessions`` erased for being idle, with their ``pending_inputs`` and
    ``markers``; ``messages`` every message removed: those of the erased
    sessions and those trimmed from the sessions that stay
    (``trimmed_sessions`` of them lost ``trimmed_messages``).
    """

    scope: Scope
    dry_run: bool = False
    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    trimmed_sessions: int = 0
    trimmed_messages: int = 0
