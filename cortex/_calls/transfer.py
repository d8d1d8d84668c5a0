"""A scope's export and import: the record format (docs/reference/export-format.md) and its calls.

Export reads a subtree in one REPEATABLE READ snapshot (cortex._db.snapshot),
page by page on keyset cursors, and turns each row into a record: a dict of
JSON values, every stored column but those derived from others. Import
checks each record as it arrives (its fields, its place in the stream, its
scope under the export's root) and writes rows in multi-row INSERTs inside
one transaction, so a refusal anywhere writes nothing. A row whose key is
taken is compared with what is stored: the same row is left alone (an
import run twice changes nothing), another one is Conflict.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import json
import math
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import asyncpg

from cortex._db.executor import Row, Tx
from cortex._db.snapshot import Snapshot
from cortex._schemas import check_response_schema
from cortex._sql import lifecycle as sql
from cortex._sql.params import (
    AFTER_KIND,
    AFTER_SCOPE,
    AFTER_SEQ,
    AFTER_SESSION_ID,
    BATCH_IDS,
    D_PATHS,
    LIMIT,
    row_name,
)
from cortex._sql.predicates import cursor_params, depth_class, scope_params
from cortex._validate import encode_json
from cortex.errors import Conflict, InvalidInput, constraint_of
from cortex.ids import MESSAGE_PREFIX, SESSION_PREFIX, format_id, parse_id
from cortex.models import MAX_JSON_BYTES, ImportReport
from cortex.scope import MAX_DEPTH, Scope

__all__ = [
    "FORMAT",
    "VERSION",
    "Importer",
    "export_records",
    "read_header",
    "records_of",
]

FORMAT: Final = "cortex-scope-export"
VERSION: Final = 1

# Rows per export page, sessions per page, and the messages a group of
# small sessions may hold to be read in one page: memory stays flat.
PAGE_ROWS: Final = 1_000
PAGE_SESSIONS: Final = 200
# Rows per INSERT of an import (the largest power of two sent), and the
# messages buffered before they are written: a sessions' INSERT goes first
# each time (their foreign key), so small sessions are written in long runs.
IMPORT_ROWS: Final = 128
BUFFERED_MESSAGES: Final = 1024


# --- fields ------------------------------------------------------------------------
# Each record type's fields: (record field, kind, column). Kinds: text, int,
# bool, time (ISO 8601 with offset), jsonb (JSON text, stored as jsonb), json
# (JSON text kept verbatim), hex (bytes), ses / msg (TypeIDs), path (a scope
# path at or beneath the export's root; moved with ``into``), legacy (a
# pre-sessions scope, moved when it lies beneath the root). "?": may be null.


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str
    column: str
    nullable: bool


def _fields(*spec: tuple[str, str] | tuple[str, str, str]) -> tuple[_Field, ...]:
    out = []
    for item in spec:
        name, kind = item[0], item[1]
        column = item[2] if len(item) == 3 else name
        out.append(_Field(name, kind.rstrip("?"), column, kind.endswith("?")))
    return tuple(out)


FIELDS: Final = {
    "scope_document": _fields(("scope", "path"), ("data", "jsonb"), ("updated_at", "time")),
    "session": _fields(
        ("id", "ses"),
        ("agent_id", "text"),
        ("scope", "path"),
        ("title", "text"),
        ("metadata", "jsonb"),
        ("metadata_json", "json?"),
        ("is_default", "bool"),
        ("session_key", "text?"),
        ("data", "jsonb?"),
        ("message_count", "int"),
        ("trimmed_count", "int"),
        ("last_message", "text"),
        ("pending_count", "int"),
        ("is_aborted", "bool"),
        ("is_interrupted", "bool"),
        ("backfilled_by", "text"),
        ("scope_deltas_digest", "hex?"),
        ("forked_from_id", "ses?"),
        ("forked_from_seq", "int?"),
        ("created_at", "time"),
        ("updated_at", "time"),
    ),
    "message": _fields(
        ("id", "msg"),
        ("session_id", "ses"),
        ("seq", "int"),
        ("role", "text"),
        ("content", "text"),
        ("author", "text"),
        ("requested_input", "jsonb?"),
        ("function_response", "jsonb?"),
        ("more_requested_inputs", "jsonb?"),
        ("more_function_responses", "jsonb?"),
        ("requested_input_json", "json?"),
        ("function_response_json", "json?"),
        ("more_requested_inputs_json", "json?"),
        ("more_function_responses_json", "json?"),
        ("metadata", "jsonb"),
        ("metadata_json", "json?"),
        ("payload_json", "json?"),
        ("deltas_digest", "hex?"),
        ("created_at", "time"),
        ("legacy_agent_id", "text?", "agent_id"),
        ("legacy_scope", "legacy?", "scope"),
    ),
    "pending_input": _fields(
        ("session_id", "ses"),
        ("raised_seq", "int"),
        ("interrupt_id", "text"),
        ("message", "text"),
        ("author", "text"),
        ("raised_at", "time"),
        ("response_schema", "jsonb?"),
        ("payload", "jsonb?"),
        ("response_schema_json", "json?"),
        ("payload_json", "json?"),
    ),
    "marker": _fields(
        ("session_id", "ses"),
        ("kind", "text"),
        ("scope", "path"),
        ("reason", "text"),
        ("marked_at", "time"),
    ),
}
# The verbatim texts of questions and answers: a record without them has only
# their jsonb form, as a message written before revision 20261205000020 has.
_MAY_BE_ABSENT: Final = frozenset(
    {
        ("message", "requested_input_json"),
        ("message", "function_response_json"),
        ("message", "more_requested_inputs_json"),
        ("message", "more_function_responses_json"),
        ("pending_input", "response_schema_json"),
        ("pending_input", "payload_json"),
    }
)
# The table each record type's rows go to.
TABLE_OF: Final = {
    "scope_document": "scope_data",
    "session": "sessions",
    "message": "messages",
    "pending_input": "pending_inputs",
    "marker": "session_markers",
}
_PREFIX: Final = {"ses": SESSION_PREFIX, "msg": MESSAGE_PREFIX}
# What the end record counts, by record type.
_COUNTED: Final = {
    "scope_document": "scope_documents",
    "session": "sessions",
    "message": "messages",
    "pending_input": "pending_inputs",
    "marker": "markers",
}
_INT4: Final = 2**31 - 1


def _converter(kind: str) -> Callable[[Any], Any] | None:
    """How a column's value of ``kind`` becomes JSON (None: as it is)."""
    if kind in _PREFIX:
        prefix = _PREFIX[kind]
        return lambda value: format_id(prefix, value)
    if kind == "time":
        return datetime.isoformat
    if kind == "hex":
        return lambda value: bytes(value).hex()
    return None


# Each record type's fields that need converting, with their converters, built once.
_ENCODERS: Final = {
    kind: tuple((f.name, convert) for f in fields if (convert := _converter(f.kind)) is not None)
    for kind, fields in FIELDS.items()
}


def _record(kind: str, row: Row) -> dict[str, Any]:
    """A row selected with cortex._sql.lifecycle's export columns (labelled by field), as a record."""
    out: dict[str, Any] = {"type": kind, **row}
    for name, convert in _ENCODERS[kind]:
        value = out[name]
        if value is not None:
            out[name] = convert(value)
    return out


# --- export -----------------------------------------------------------------------


async def _rows(snap: Snapshot, stmt: Any, params: dict[str, Any]) -> list[Row]:
    return (await snap.run(lambda tx: tx.execute(stmt, params))).all()


async def export_records(snap: Snapshot, target: Scope) -> AsyncIterator[dict[str, Any]]:
    """Every record of ``target``'s subtree, header first and end last, from ``snap``'s snapshot."""
    depth = depth_class(target)
    where = scope_params(target)
    exported_at = (await _rows(snap, sql.clock_statement(), {}))[0][0]
    totals = (await snap.run(lambda tx: tx.execute(sql.totals_statement(depth), where))).one()
    yield {
        "type": "header",
        "format": FORMAT,
        "version": VERSION,
        "root": str(target),
        "exported_at": exported_at.isoformat(),
        "sessions": int(totals["sessions"]),
        "messages": int(totals["messages"]),
    }
    counts = dict.fromkeys(_COUNTED.values(), 0)

    after_scope: str | None = None
    while True:
        params = {**where, LIMIT: PAGE_ROWS}
        if after_scope is not None:
            params[AFTER_SCOPE] = after_scope
        stmt = sql.export_scope_documents_statement(depth, after_scope is not None)
        rows = await _rows(snap, stmt, params)
        for row in rows:
            counts["scope_documents"] += 1
            yield _record("scope_document", row)
        if len(rows) < PAGE_ROWS:
            break
        after_scope = rows[-1]["scope"]

    cursor: tuple[datetime, uuid.UUID] | None = None
    while True:
        params = {**where, LIMIT: PAGE_SESSIONS}
        if cursor is not None:
            params.update(cursor_params(*cursor))
        stmt = sql.export_sessions_statement(depth, cursor is not None)
        page = await _rows(snap, stmt, params)
        async for record in _session_page(snap, where, page):
            counts[_COUNTED[record["type"]]] += 1
            yield record
        if len(page) < PAGE_SESSIONS:
            break
        cursor = (page[-1]["updated_at"], page[-1]["id"])

    after_marker: tuple[uuid.UUID, str] | None = None
    while True:
        params = {**where, LIMIT: PAGE_ROWS}
        if after_marker is not None:
            params[AFTER_SESSION_ID], params[AFTER_KIND] = after_marker
        stmt = sql.export_markers_statement(depth, after_marker is not None)
        rows = await _rows(snap, stmt, params)
        for row in rows:
            counts["markers"] += 1
            yield _record("marker", row)
        if len(rows) < PAGE_ROWS:
            break
        after_marker = (rows[-1]["session_id"], rows[-1]["kind"])
    yield {"type": "end", **counts}


def _groups(page: list[Row]) -> list[list[Row]]:
    """The page's sessions by id, in runs holding at most PAGE_ROWS messages (one session at least)."""
    groups: list[list[Row]] = []
    held = 0
    for row in sorted(page, key=lambda r: r["id"]):
        if groups and held + row["message_count"] <= PAGE_ROWS:
            groups[-1].append(row)
            held += row["message_count"]
        else:
            groups.append([row])
            held = row["message_count"]
    return groups


async def _session_page(
    snap: Snapshot, where: dict[str, Any], page: list[Row]
) -> AsyncIterator[dict[str, Any]]:
    """Each session of the page, followed by its messages, then its pending inputs."""
    if not page:
        return
    ids = [row["id"] for row in page]
    pending_rows = (
        await snap.run(
            lambda tx: tx.execute(sql.export_pending_statement(), {**where, BATCH_IDS: ids})
        )
    ).all()
    pending: dict[uuid.UUID, list[Row]] = {}
    for row in pending_rows:
        pending.setdefault(row["session_id"], []).append(row)
    groups = _groups(page)
    ahead: asyncio.Future[list[Row]] | None = _fetch(snap, where, groups[0], None)
    try:
        for number, group in enumerate(groups):
            index, opened = 0, False
            while True:
                rows = [] if ahead is None else await ahead
                # Only a one-session run can hold more than a page (see _groups).
                full = len(group) == 1 and len(rows) == PAGE_ROWS
                # The next page is read while this one is turned into records.
                if full:
                    ahead = _fetch(snap, where, group, rows[-1]["seq"])
                elif number + 1 < len(groups):
                    ahead = _fetch(snap, where, groups[number + 1], None)
                else:
                    ahead = None
                for row in rows:
                    while group[index]["id"] != row["session_id"]:
                        for record in _closing(group[index], opened, pending):
                            yield record
                        index, opened = index + 1, False
                    if not opened:
                        yield _record("session", group[index])
                        opened = True
                    yield _record("message", row)
                if not full:
                    break
            for i in range(index, len(group)):
                for record in _closing(group[i], opened and i == index, pending):
                    yield record
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()
            with contextlib.suppress(BaseException):
                await ahead


def _closing(row: Row, opened: bool, pending: dict[uuid.UUID, list[Row]]) -> list[dict[str, Any]]:
    """What ends a session's run: its record if no message opened it, then its pending inputs."""
    out = [] if opened else [_record("session", row)]
    return out + [_record("pending_input", p) for p in pending.get(row["id"], [])]


def _fetch(
    snap: Snapshot, where: dict[str, Any], group: list[Row], after_seq: int | None
) -> asyncio.Future[list[Row]]:
    """A page of a run of sessions' messages (by session and seq), read in the background.

    A run of several sessions is read whole: their ``message_count`` (exact
    in the snapshot) sums to at most a page. One session is read a page at
    a time, after ``after_seq``.
    """
    total = sum(row["message_count"] for row in group)
    limit = PAGE_ROWS if len(group) == 1 else total + 1
    params = {**where, BATCH_IDS: [row["id"] for row in group], LIMIT: limit}
    if after_seq is not None:
        params[AFTER_SEQ] = after_seq
    if total == 0:
        done: asyncio.Future[list[Row]] = asyncio.get_running_loop().create_future()
        done.set_result([])
        return done
    stmt = sql.export_messages_statement(after_seq is not None)
    return asyncio.ensure_future(_rows(snap, stmt, params))


# --- import: the records -------------------------------------------------------------


def _refuse(where: str, what: str) -> InvalidInput:
    return InvalidInput(f"{where}: {what}")


@dataclass(frozen=True)
class Header:
    """An export's header record, checked."""

    root: Scope
    sessions: int
    messages: int


def read_header(record: Any) -> Header:
    """The first record, checked: the format, its version and the root scope.

    Raises:
        InvalidInput: it is not a header this cortex reads.
    """
    where = "record 1"
    if not isinstance(record, Mapping) or record.get("type") != "header":
        raise _refuse(where, "the first record must be the header ({'type': 'header', ...})")
    if record.get("format") != FORMAT:
        raise _refuse(where, f"format must be {FORMAT!r}, got {record.get('format')!r}")
    if record.get("version") != VERSION:
        raise _refuse(where, f"version {record.get('version')!r}: this cortex reads {VERSION}")
    root = record.get("root")
    if not isinstance(root, str):
        raise _refuse(where, "root must be a scope path")
    totals = [record.get(name, 0) for name in ("sessions", "messages")]
    if not all(type(n) is int and n >= 0 for n in totals):
        raise _refuse(where, "sessions and messages must be counts")
    return Header(Scope.parse(root), totals[0], totals[1])


def _moved(path: Scope, root: Scope, into: Scope) -> Scope:
    if into == root:
        return path
    moved = (*into.segments, *path.segments[root.depth :])
    if len(moved) > MAX_DEPTH:
        raise InvalidInput(f"{path} would be {len(moved)} segments deep under {into}")
    return Scope(*moved)


_STRINGS: Final = frozenset(
    {"text", "jsonb", "json", "legacy", "path", "hex", "time", "ses", "msg"}
)


def _value(f: _Field, value: Any, where: str, root: Scope, into: Scope) -> Any:
    """One field's value as its column takes it, checked."""
    kind = f.kind
    if value is None:
        if not f.nullable:
            raise InvalidInput(f"{where}: {f.name} may not be null")
        return None
    if kind in _STRINGS:
        if type(value) is not str:
            raise InvalidInput(f"{where}: {f.name} must be a string")
        if "\x00" in value:
            raise InvalidInput(f"{where}: {f.name} holds a NUL character, which text cannot")
        if kind == "text":
            return value
    elif kind == "int":
        if type(value) is not int or not 0 <= value <= _INT4:
            raise InvalidInput(f"{where}: {f.name} must be an integer from 0 to {_INT4}")
        return value
    elif type(value) is not bool:
        raise InvalidInput(f"{where}: {f.name} must be true or false")
    else:
        return value
    return _parsed(f, value, where, root, into)


def _parsed(f: _Field, value: str, where: str, root: Scope, into: Scope) -> Any:
    """A string field's value as its column takes it: JSON checked, times, ids, paths parsed."""
    kind, name = f.kind, f"{where}: {f.name}"
    if kind in ("jsonb", "json"):
        if value != "{}":
            _json_value(value, name)
        return value
    if kind == "time":
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidInput(f"{name} must be an ISO 8601 time") from None
        if moment.utcoffset() is None:
            raise InvalidInput(f"{name} must carry its UTC offset")
        return moment
    if kind == "hex":
        try:
            return binascii.unhexlify(value)
        except (binascii.Error, ValueError):
            raise InvalidInput(f"{name} must be hexadecimal") from None
    if kind in _PREFIX:
        return parse_id(_PREFIX[kind], value, field=name)
    if kind == "path":
        path = Scope.parse(value)
        if not root.contains(path):
            raise InvalidInput(f"{name} {path} is not at or beneath the export's root {root}")
        return str(_moved(path, root, into))
    # A legacy conversation scope: moved with its session when it lay beneath the root.
    try:
        legacy = Scope.parse(value)
    except InvalidInput:
        return value
    return str(_moved(legacy, root, into)) if root.contains(legacy) else value


def _json_value(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidInput(f"{name} must be JSON text") from None
    except RecursionError:
        raise InvalidInput(f"{name} is JSON nested too deeply") from None


# The fields holding questions (a list of them, or one), by record type.
_QUESTIONS: Final = {
    "message": (
        ("requested_input", False),
        ("requested_input_json", False),
        ("more_requested_inputs", True),
        ("more_requested_inputs_json", True),
    ),
}
_SCHEMAS: Final = ("response_schema", "response_schema_json")


def _check_schemas(kind: str, row: Mapping[str, Any], where: str) -> None:
    """Refuse a response schema an append would refuse: ``resume`` compiles what is stored.

    A pending input holds its question's schema; a message the questions
    it asked, which a rewind may open again.
    """
    schemas: list[tuple[str, Any]] = []
    if kind == "pending_input":
        schemas = [
            (n, _json_value(row[n], f"{where}: {n}")) for n in _SCHEMAS if row[n] is not None
        ]
    for name, many in _QUESTIONS.get(kind, ()):
        if row[name] is None:
            continue
        asked = _json_value(row[name], f"{where}: {name}")
        if many and not isinstance(asked, list):
            raise InvalidInput(f"{where}: {name} must be a list of questions")
        for question in asked if many else [asked]:
            if not isinstance(question, dict):
                raise InvalidInput(f"{where}: {name}: a question is a JSON object")
            schemas.append((name, question.get("response_schema")))
    for name, schema in schemas:
        if schema is None:
            continue
        if not isinstance(schema, dict):
            raise InvalidInput(f"{where}: {name}: a response schema is a JSON object")
        try:
            check_response_schema(schema)
        except InvalidInput as exc:
            raise InvalidInput(f"{where}: {name}: {exc}") from None


def _row(
    kind: str, record: Mapping[str, Any], where: str, root: Scope, into: Scope
) -> dict[str, Any]:
    fields = FIELDS[kind]
    unknown = record.keys() - {f.name for f in fields} - {"type"}
    if unknown:
        raise InvalidInput(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    missing = [
        f.name for f in fields if f.name not in record and (kind, f.name) not in _MAY_BE_ABSENT
    ]
    if missing:
        raise InvalidInput(f"{where}: missing field(s) {', '.join(missing)}")
    row = {f.column: _value(f, record.get(f.name), where, root, into) for f in fields}
    if kind == "marker" and row["kind"] not in ("aborted", "interrupted"):
        raise InvalidInput(f"{where}: kind must be 'aborted' or 'interrupted'")
    _check_schemas(kind, row, where)
    _check_metadata(kind, row, where)
    return row


def _check_metadata(kind: str, row: Mapping[str, Any], where: str) -> None:
    """Refuse metadata that create_session or an append would refuse: an object of at most 64 KiB.

    Each top-level key of a session's metadata is a row of ``metadata_pairs``
    that every write of the session's hour rewrites: the limit bounds them.
    Numbers are measured in their shortest form: PostgreSQL prints a jsonb
    ``1e300`` as 301 digits, which no caller wrote.
    """
    if kind not in ("session", "message"):
        return
    for name in ("metadata", "metadata_json"):
        text = row.get(name)
        if text is None:
            continue
        try:
            value = json.loads(text, parse_int=_shortest_int)
        except (ValueError, RecursionError):
            value = _json_value(text, f"{where}: {name}")  # says which
        if type(value) is not dict:
            raise InvalidInput(f"{where}: {name} must be a JSON object")
        try:
            encode_json(value, MAX_JSON_BYTES)
        except ValueError as exc:
            raise InvalidInput(f"{where}: {name}: {exc}") from None


def _shortest_int(digits: str) -> int | float:
    """An integer as :func:`_check_metadata` measures it: a long one as the float it spells."""
    if len(digits) <= 17:
        return int(digits)
    number = float(digits)
    return number if math.isfinite(number) else int(digits)


# Columns derived from a session's scope, written as create_session writes them.
def _with_scope_columns(row: dict[str, Any]) -> dict[str, Any]:
    scope = Scope.parse(row["scope"])
    row["scope_depth"] = scope.depth
    row["scope_l2"] = scope.prefix(2) if scope.depth >= 2 else None
    row["scope_l3"] = scope.prefix(3) if scope.depth >= 3 else None
    return row


# Where each record type may come: after what (the stream's grammar).
_ORDER: Final = {
    "scope_document": 1,
    "session": 2,
    "message": 2,
    "pending_input": 2,
    "marker": 3,
    "end": 4,
}


@dataclass
class _Open:
    """The session whose messages and pending inputs the stream is giving."""

    id: uuid.UUID
    where: str
    message_count: int
    pending_count: int
    # The first kept position: trimmed_count + 1 (retention removed those before it).
    first_seq: int = 1
    next_seq: int = 1
    pending: int = 0
    last_pending: tuple[int, str] | None = None


@dataclass
class Importer:
    """One import, in one transaction on ``conn``: :meth:`add` each record, then :meth:`finish`."""

    conn: Tx
    header: Header
    into: Scope
    # Called with the number of records taken, now and then (a progress bar).
    on_records: Callable[[int], None] | None = None
    stage: int = 1
    seen: int = 1
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTED.values(), 0))
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTED.values(), 0))
    unchanged: int = 0
    ended: bool = False
    current: _Open | None = None
    buffers: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {table: [] for table in TABLE_OF.values()}
    )

    async def add(self, record: Any) -> None:
        """Take the next record (checked against the format and the stream so far).

        Raises:
            InvalidInput: the record is malformed, out of place, or outside the root.
            Conflict: a key it writes holds something else.
        """
        self.seen += 1
        where = f"record {self.seen}"
        if self.ended:
            raise InvalidInput(f"{where}: nothing may follow the end record")
        if not isinstance(record, Mapping):
            raise InvalidInput(f"{where}: a record is a JSON object")
        kind = record.get("type")
        if kind not in _ORDER:
            raise InvalidInput(f"{where}: unknown record type {kind!r}")
        if _ORDER[kind] < self.stage:
            raise InvalidInput(f"{where}: a {kind} record may not follow a later section")
        self.stage = _ORDER[kind]
        if kind == "end":
            await self._end(record, where)
            return
        row = _row(kind, record, where, self.header.root, self.into)
        self.counts[_COUNTED[kind]] += 1
        if kind == "session":
            self._close()
            _with_scope_columns(row)
            first = row["trimmed_count"] + 1
            self.current = _Open(
                row["id"], where, row["message_count"], row["pending_count"], first, first
            )
        elif kind in ("message", "pending_input"):
            self._belongs(row, where, kind)
        else:
            self._close()
        table = TABLE_OF[kind]
        self.buffers[table].append(row)
        if len(self.buffers[table]) >= (BUFFERED_MESSAGES if table == "messages" else IMPORT_ROWS):
            await self._flush(table)
        if self.on_records is not None and self.seen % IMPORT_ROWS == 0:
            self.on_records(IMPORT_ROWS)

    def _belongs(self, row: dict[str, Any], where: str, kind: str) -> None:
        """A message or pending input must follow its session, in order."""
        current = self.current
        if current is None or row["session_id"] != current.id:
            raise InvalidInput(f"{where}: a {kind} must follow its session's record")
        if kind == "message":
            if current.pending:
                raise InvalidInput(f"{where}: a session's messages come before its pending inputs")
            if row["seq"] != current.next_seq:
                raise InvalidInput(f"{where}: seq {row['seq']}, expected {current.next_seq}")
            current.next_seq += 1
            return
        key = (row["raised_seq"], row["interrupt_id"])
        if current.last_pending is not None and key <= current.last_pending:
            raise InvalidInput(f"{where}: pending inputs come in (raised_seq, interrupt_id) order")
        if not current.first_seq <= row["raised_seq"] < current.next_seq:
            raise InvalidInput(f"{where}: raised_seq {row['raised_seq']} names no message")
        current.last_pending = key
        current.pending += 1

    def _close(self) -> None:
        """The open session's messages and pending inputs must be all it counts."""
        current, self.current = self.current, None
        if current is None:
            return
        if current.next_seq - current.first_seq != current.message_count:
            raise InvalidInput(
                f"{current.where}: message_count {current.message_count}, but"
                f" {current.next_seq - current.first_seq} messages follow"
            )
        if current.pending != current.pending_count:
            raise InvalidInput(
                f"{current.where}: pending_count {current.pending_count}, but"
                f" {current.pending} pending inputs follow"
            )

    async def _end(self, record: Mapping[str, Any], where: str) -> None:
        self._close()
        expected = {name: record.get(name) for name in self.counts}
        if expected != self.counts:
            raise InvalidInput(
                f"{where}: the end record counts {expected}, the stream {self.counts}"
            )
        self.ended = True

    async def finish(self) -> ImportReport:
        """Write what is buffered; the report.

        Raises:
            InvalidInput: the stream ended without its end record (cut short).
        """
        if not self.ended:
            raise InvalidInput(
                f"the export ends after record {self.seen} without its end record: cut short?"
            )
        for table in TABLE_OF.values():
            await self._flush(table)
        return ImportReport(scope=self.into, unchanged=self.unchanged, **self.written)

    async def _flush(self, table: str) -> None:
        if table != "sessions" and table != "scope_data":
            # Messages and pending inputs reference their sessions.
            await self._flush("sessions")
        rows, self.buffers[table] = self.buffers[table], []
        while rows:
            size = 1 << (len(rows).bit_length() - 1)
            chunk, rows = rows[:size], rows[size:]
            await self._insert(table, chunk)

    async def _insert(self, table: str, chunk: list[dict[str, Any]]) -> None:
        columns = tuple(chunk[0])
        params = {
            row_name(column, i): row[column] for i, row in enumerate(chunk) for column in columns
        }
        stmt = sql.import_statement(table, columns, len(chunk))
        try:
            written = (await self.conn.execute(stmt, {**_tenant(self.into), **params})).all()
        except asyncpg.UniqueViolationError as exc:
            raise Conflict(_clash(table, constraint_of(exc))) from exc
        except (asyncpg.CheckViolationError, asyncpg.DataError) as exc:
            raise InvalidInput(
                f"a {table} row is refused by the database ({exc.sqlstate})"
            ) from exc
        kind = next(k for k, t in TABLE_OF.items() if t == table)
        self.written[_COUNTED[kind]] += len(written)
        if len(written) == len(chunk):
            return
        keys = sql.IMPORT_KEYS[table]
        taken = {tuple(r) for r in written}
        await self._compare(table, [r for r in chunk if tuple(r[k] for k in keys) not in taken])

    async def _compare(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Rows whose keys were taken: each must be stored exactly so, else Conflict."""
        keys = sql.IMPORT_KEYS[table]
        first = keys[0]
        lookup = D_PATHS if table == "scope_data" else BATCH_IDS
        params = {**_tenant(self.into), lookup: sorted({r[first] for r in rows})}
        stored = {
            tuple(row[k] for k in keys): row
            for row in (await self.conn.execute(sql.stored_statement(table), params)).all()
        }
        kind = next(k for k, t in TABLE_OF.items() if t == table)
        for row in rows:
            key = tuple(row[k] for k in keys)
            have = stored.get(key)
            if have is None or not _same(kind, row, have):
                raise Conflict(_taken(kind, row))
            self.unchanged += 1


def _tenant(scope: Scope) -> dict[str, Any]:
    return scope_params(scope)


def _same(kind: str, row: dict[str, Any], stored: Row) -> bool:
    """Whether the stored row is the one the record would write (JSON compared as values)."""
    for f in FIELDS[kind]:
        mine, theirs = row[f.column], stored[f.name]
        if f.kind == "jsonb" and mine is not None and theirs is not None:
            if json.loads(mine) != json.loads(theirs):
                return False
        elif f.kind == "hex" and theirs is not None:
            if mine != bytes(theirs):
                return False
        elif mine != theirs:
            return False
    return True


def _taken(kind: str, row: dict[str, Any]) -> str:
    """The Conflict for a key holding something else: the key only, nothing of what holds it."""
    if kind in ("session", "message"):
        prefix = SESSION_PREFIX if kind == "session" else MESSAGE_PREFIX
        return f"{kind} id {format_id(prefix, row['id'])} is already taken by another {kind}"
    if kind == "scope_document":
        return f"scope {row['scope']} already holds another state document"
    session = format_id(SESSION_PREFIX, row["session_id"])
    return f"session {session} already holds another {kind.replace('_', ' ')}"


def _clash(table: str, constraint: str | None) -> str:
    if constraint == "uq_sessions_default":
        return "a session imported as default clashes with the default its agent has in that scope"
    if constraint == "uq_sessions_key":
        return "a session's key is taken in its scope by another session of its agent"
    if constraint == "uq_messages_session_seq" or (constraint is None and table == "messages"):
        return "a message's position in its session is taken by another message"
    if constraint is None and table == "sessions":
        # A Citus coordinator may relay the error without its constraint.
        return "a session clashes with the default or the key its agent has in that scope already"
    return f"a {table} row clashes with one stored ({constraint or 'a unique index'})"


async def records_of(source: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Records from a plain or an async iterable."""
    if isinstance(source, AsyncIterable):
        async for record in source:
            yield record
    else:
        for record in source:
            yield record
