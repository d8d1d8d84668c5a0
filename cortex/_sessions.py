"""SQL for sessions: insert, select, update, delete, list, count, defaults.

Plain ``async def`` functions taking ``(conn, scope, ...)``. They never commit
and never open transactions: :func:`cortex._db.transaction.run_transaction` owns that.
Every statement gets its tenant and scope condition from cortex._filters.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from functools import cache
from typing import Any, Final

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSON, JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cortex._db.executor import Row, Tx
from cortex._db.transaction import RetryTransaction
from cortex._filters import (
    FilterShape,
    after_cursor,
    cursor_params,
    depth_class,
    exact_clause,
    filter_params,
    filter_shape,
    page,
    scope_params,
    searches_tenant,
    session_predicate,
    tenant_search_statement,
    visible,
)
from cortex._tables import bounded_data, scope_data, session_markers, sessions
from cortex._validate import decode_json, decode_json_of_strings
from cortex.errors import Conflict, InvalidInput, NotFound, constraint_of
from cortex.ids import SESSION_PREFIX, format_id, new_uuid
from cortex.models import MAX_DATA_BYTES, ListFilter, Session, SessionState, from_database
from cortex.scope import Scope

__all__ = [
    "SESSION_COLUMNS",
    "count_sessions",
    "data_too_large",
    "decode_data",
    "delete_session",
    "deltas_digest",
    "insert_session",
    "lock_session_id",
    "merge_scope_data",
    "page_sessions",
    "resolve_default",
    "resolve_key",
    "row_to_session",
    "select_by_key",
    "select_page",
    "select_scope_data",
    "select_session",
    "set_default",
    "update_session",
]

# The stored metadata as text: the verbatim JSON (revision 20261201000009),
# else the jsonb of a row last written before it. Decoded by row_to_session.
METADATA_TEXT: Final = sa.func.coalesce(
    sa.cast(sessions.c.metadata_json, sa.Text()), sa.cast(sessions.c.metadata, sa.Text())
)

# The session's state as read: the documents of the scopes on its path, outer
# first (ordered by path length, and jsonb_object_agg keeps a key's last
# value), then its own document over them. One index probe per ancestor on
# scope_data's primary key; the ancestors are computed from the row's path.
# The tenant is the bound parameter every statement carries (``scope_tenant``),
# not the row's column: Citus routes the subquery to the tenant's shard by it,
# and plans it for every shard without. The built-ins are qualified: another
# role's overload of generate_series(integer, smallint) or of a polymorphic one
# would match better than pg_catalog's and run as the reader.
MERGED_DATA: Final = sa.type_coerce(
    sa.text(
        # Most tenants keep no scope state: an uncorrelated EXISTS (one
        # InitPlan per statement) spares every row the per-row lookup then.
        "(CASE WHEN EXISTS (SELECT FROM scope_data WHERE tenant_id = :scope_tenant)"
        " THEN coalesce((SELECT pg_catalog.jsonb_object_agg(e.key, e.value ORDER BY pg_catalog.length(sd.scope))"
        " FROM scope_data AS sd CROSS JOIN LATERAL pg_catalog.jsonb_each(sd.data) AS e"
        " WHERE sd.tenant_id = :scope_tenant AND sd.scope = ANY (ARRAY("
        "SELECT pg_catalog.array_to_string((pg_catalog.string_to_array(sessions.scope, '/'))[1\\:i], '/')"
        " FROM pg_catalog.generate_series(1, sessions.scope_depth) AS i))), '{}'::jsonb)"
        " ELSE '{}'::jsonb END"
        " || coalesce(sessions.data, '{}'::jsonb))::text"
    ).bindparams(sa.bindparam("scope_tenant", type_=sa.Text())),
    sa.Text(),
)

# What a Session is read from; tenant_id, scope_depth and scope_l2 are derived
# from scope and stay internal.
SESSION_COLUMNS: Final = (
    sessions.c.id,
    sessions.c.agent_id,
    sessions.c.scope,
    sessions.c.title,
    METADATA_TEXT.label("metadata"),
    sessions.c.message_count,
    sessions.c.last_message,
    sessions.c.is_default,
    sessions.c.backfilled_by,
    sessions.c.created_at,
    sessions.c.updated_at,
    sessions.c.state,
    sessions.c.pending_count,
    sessions.c.session_key,
    MERGED_DATA.label("data"),
)

# Whether the tenant keeps any scope state: an uncorrelated EXISTS, one
# InitPlan per statement, on every row of a listing page. Only then does the
# page read its scopes' documents (select_page). The tenant is the bound
# parameter, as in MERGED_DATA.
HAS_SCOPE_STATE: Final = sa.exists().where(
    scope_data.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text())
)

# For INSERT ... RETURNING on Citus, which refuses a subquery there: the
# session's own document only; the caller then reads the session back.
INSERTED_COLUMNS: Final = (sessions.c.id,)

_UQ_DEFAULT: Final = "uq_sessions_default"
_UQ_KEY: Final = "uq_sessions_key"


def _default_clash(exc: asyncpg.UniqueViolationError, *, wrote_default: bool) -> bool:
    """Whether a unique violation on sessions hit uq_sessions_default (not the primary key).

    sessions has exactly those two unique indexes. The reported name decides
    (cortex.errors.constraint_of maps a Citus shard's copy back). A Citus
    coordinator relays a worker's error without the constraint field, and
    cortex never reads the localised message; then the statement decides:
    only a row written with is_default = true can hit the default index, and
    where a row is written as a default its id cannot clash (a generated
    UUIDv7, or a caller-chosen id checked under that id's advisory lock).
    """
    name = constraint_of(exc)
    return wrote_default if name is None else name == _UQ_DEFAULT


# The enum member of each stored state (a lookup: calling the enum costs more).
_STATE_OF: Final = {state.value: state for state in SessionState}


def row_to_session(row: Row, data: dict[str, Any] | None = None) -> Session:
    """Build the public model from a row selected with SESSION_COLUMNS.

    ``data``: the session's state, merged already (a listing's row, whose
    ``data`` column is its own document only: :func:`page_sessions`).

    The values are written in ``Session``'s field order (a unit test holds
    the two in step), so the model takes the dict as it is: a page of 100
    rows spends half as long here as with the fields reordered.
    """
    return from_database(
        Session,
        {
            "id": format_id(SESSION_PREFIX, row["id"]),
            "agent_id": row["agent_id"],
            "scope": Scope.parse(row["scope"]),
            "title": row["title"],
            "metadata": decode_json(row["metadata"]),
            "message_count": row["message_count"],
            "last_message": row["last_message"],
            "is_default": row["is_default"],
            "backfilled_by": row["backfilled_by"],
            "state": _STATE_OF[row["state"]],
            "pending_count": row["pending_count"],
            "key": row["session_key"],
            "data": decode_data(row["data"]) if data is None else data,
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        },
        in_field_order=True,
    )


def data_too_large(exc: asyncpg.CheckViolationError) -> InvalidInput:
    """The refusal for a state document the delta would grow past MAX_DATA_BYTES."""
    return InvalidInput(
        f"data: a state document may hold at most {MAX_DATA_BYTES} bytes as stored"
        f" ({constraint_of(exc)})"
    )


def decode_data(text: str) -> dict[str, Any]:
    """A stored state document: each value is the JSON text of the host's value."""
    if text == "{}":
        return {}  # most sessions
    # Its values are JSON strings: only their own texts can hold a number.
    return {key: decode_json(value) for key, value in decode_json_of_strings(text).items()}


def deltas_digest(data_delta: str | None, scope_deltas: dict[str, str] | None = None) -> bytes:
    """The SHA-256 of a call's state deltas as stored, whatever order their keys came in.

    What a keyed call (caller-chosen ids) records of its deltas, so that a
    replay can be told from another call with the same ids: the state they
    were merged into may have changed since. No deltas is a digest too.
    """
    canonical = {
        "data": {} if data_delta is None else decode_json_of_strings(data_delta),
        "scope_data": {
            path: decode_json_of_strings(text) for path, text in (scope_deltas or {}).items()
        },
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


def _jsonb_order(key: str) -> tuple[int, str]:
    """Where jsonb puts a key: shorter UTF-8 first, then by bytes (code point order is the same)."""
    return (len(key) if key.isascii() else len(key.encode()), key)


def _inherited(path: str, documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The documents of the scopes on ``path``, outer first, merged in jsonb's key order."""
    found = [d for ancestor in _ancestors(path) if (d := documents.get(ancestor))]
    if len(found) == 1:
        return found[0]  # decoded from jsonb: already in its order
    merged: dict[str, Any] = {}
    for document in found:
        merged.update(document)
    return {key: merged[key] for key in sorted(merged, key=_jsonb_order)}


def _ancestors(path: str) -> list[str]:
    """The paths of the scopes on ``path``, outer first, itself last."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def page_sessions(rows: list[Row], documents: dict[str, str]) -> list[Session]:
    """The sessions of a listing page (:func:`_page_statement`), each with its merged state.

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


def verbatim_json_param(name: str) -> sa.ColumnElement[Any]:
    """JSON text bound for a ``json`` column, which stores its input text exactly."""
    return sa.cast(sa.bindparam(name, type_=sa.Text()), JSON())


def _id_param(name: str = "target_id") -> sa.BindParameter[uuid.UUID]:
    return sa.bindparam(name, type_=UUID(as_uuid=True))


def scope_columns(scope: Scope) -> dict[str, Any]:
    """The columns derived from a session's scope, written once at insert."""
    return {
        "new_tenant_id": scope.tenant,
        "new_scope": str(scope),
        "new_scope_depth": scope.depth,
        "new_scope_l2": scope.prefix(2) if scope.depth >= 2 else None,
        "new_scope_l3": scope.prefix(3) if scope.depth >= 3 else None,
    }


def _scope_values() -> dict[str, Any]:
    return {
        "tenant_id": sa.bindparam("new_tenant_id", type_=sa.Text()),
        "scope": sa.bindparam("new_scope", type_=sa.Text()),
        "scope_depth": sa.bindparam("new_scope_depth", type_=sa.SmallInteger()),
        "scope_l2": sa.bindparam("new_scope_l2", type_=sa.Text()),
        "scope_l3": sa.bindparam("new_scope_l3", type_=sa.Text()),
    }


# Statements are built once per shape (functools.cache) and reused with new
# parameters; see cortex._filters.


@cache
def _insert_statement(caller_chosen_id: bool, distributed: bool = False) -> sa.Insert:
    values: dict[str, Any] = {
        "id": _id_param(),
        "agent_id": sa.bindparam("new_agent_id", type_=sa.Text()),
        "title": sa.bindparam("new_title", type_=sa.Text()),
        "metadata_json": verbatim_json_param("new_metadata"),
        "is_default": sa.bindparam("new_is_default", type_=sa.Boolean()),
        "session_key": sa.bindparam("new_key", type_=sa.Text()),
        "data": bounded_data(sa.cast(sa.bindparam("new_data", type_=sa.Text()), JSONB())),
        "scope_deltas_digest": sa.bindparam("new_scope_digest", type_=BYTEA()),
        **_scope_values(),
    }
    if not caller_chosen_id:
        # A generated id is a fresh UUIDv7 no marker can name: a plain
        # INSERT ... VALUES, which Citus routes straight to the tenant's shard.
        return sa.insert(sessions).values(**values).returning(*_returned(distributed))
    if distributed:
        # Whether a marker is parked was read first (_parked_statement), under
        # the id's lock: a plain INSERT ... VALUES, a router statement, where
        # Citus would pull an INSERT ... SELECT through the coordinator.
        values["is_interrupted"] = sa.bindparam("new_is_interrupted", type_=sa.Boolean())
        return sa.insert(sessions).values(**values).returning(*_returned(distributed))
    # A marker parked by mark_interrupted before this session existed shows
    # now, if it was set in this exact scope. INSERT ... SELECT, not a
    # subquery inside VALUES (which Citus refuses; docs/citus.md).
    values["is_interrupted"] = _parked_marker()
    return (
        sa.insert(sessions)
        .from_select(list(values), sa.select(*(v.label(k) for k, v in values.items())))
        .returning(*_returned(distributed))
    )


def _parked_marker() -> sa.Exists:
    """An interrupt marker parked for the new session's id in its exact scope."""
    return sa.exists().where(
        # scope_tenant, the one tenant parameter (the merged state reads by it too).
        session_markers.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        session_markers.c.session_id == _id_param(),
        session_markers.c.kind == "interrupted",
        session_markers.c.scope == sa.bindparam("new_scope", type_=sa.Text()),
    )


@cache
def _parked_statement() -> sa.Select[tuple[bool]]:
    return sa.select(_parked_marker())


@cache
def _taken_statement() -> sa.Select[*tuple[Any, ...]]:
    """The session holding a caller-chosen id in this tenant, and whether it is this create's.

    "Same" means the same agent at the same exact scope with the same
    title, metadata text, default flag, key, state document and scope_data
    deltas (their digest): what a retry of this very call would have created. Only then is the session returned; it is then
    visible from the caller's scope anyway.
    """
    same = sa.and_(
        sessions.c.agent_id == sa.bindparam("new_agent_id", type_=sa.Text()),
        sessions.c.scope == sa.bindparam("new_scope", type_=sa.Text()),
        sessions.c.title == sa.bindparam("new_title", type_=sa.Text()),
        sa.bindparam("new_metadata", type_=sa.Text()) == METADATA_TEXT,
        sessions.c.is_default == sa.bindparam("new_is_default", type_=sa.Boolean()),
        sessions.c.session_key.is_not_distinct_from(sa.bindparam("new_key", type_=sa.Text())),
        sessions.c.data.is_not_distinct_from(
            sa.cast(sa.bindparam("new_data", type_=sa.Text()), JSONB())
        ),
        # The create's scope_data, by digest; NULL: created by a release that kept none.
        sa.or_(
            sessions.c.scope_deltas_digest.is_(None),
            sessions.c.scope_deltas_digest == sa.bindparam("new_scope_digest", type_=BYTEA()),
        ),
    )
    return sa.select(*SESSION_COLUMNS, same.label("same")).where(
        sessions.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        sessions.c.id == _id_param(),
    )


@cache
def _select_statement(depth: int, for_update: bool) -> sa.Select[*tuple[Any, ...]]:
    stmt = sa.select(*SESSION_COLUMNS).where(visible(depth), sessions.c.id == _id_param())
    return stmt.with_for_update() if for_update else stmt


@cache
def _update_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == _id_param())
        .values(
            title=sa.bindparam("new_title", type_=sa.Text()),
            metadata_json=verbatim_json_param("new_metadata"),
            # The jsonb copy of a legacy row is superseded: free it.
            metadata=sa.text("'{}'::jsonb"),
            # statement_timestamp(), not clock_timestamp(): Citus refuses
            # VOLATILE functions in an UPDATE of a distributed table.
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )


@cache
def _delete_statement(depth: int) -> sa.ClauseElement:
    return (
        sa.delete(sessions)
        .where(visible(depth), sessions.c.id == _id_param())
        .returning(sessions.c.scope)
    )


@cache
def _delete_markers_statement() -> sa.Delete:
    # The session's own markers: those at its scope. A marker another scope
    # parked for the same id waits for a session of that scope, not this one.
    return sa.delete(session_markers).where(
        session_markers.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        session_markers.c.session_id == _id_param(),
        session_markers.c.scope == sa.bindparam("deleted_scope", type_=sa.Text()),
    )


@cache
def _page_statement(
    shape: FilterShape, *, cursor: bool, offset: bool
) -> sa.Select[*tuple[Any, ...]]:
    """A listing page: its rows with their own state documents, not merged ones.

    A merged document per row would repeat every ancestor scope's document
    in every row of the page; :func:`select_page` reads those documents
    once for the page instead (:func:`_scope_documents_statement`).
    """
    stmt = sa.select(
        *SESSION_COLUMNS[:-1],
        sa.func.coalesce(sa.cast(sessions.c.data, sa.Text()), sa.literal_column("'{}'")).label(
            "data"
        ),
        HAS_SCOPE_STATE.label("has_scope_state"),
    ).where(session_predicate(shape))
    if cursor:
        stmt = stmt.where(after_cursor())
    return page(stmt, offset=offset)


@cache
def _scope_documents_statement() -> sa.Select[*tuple[Any, ...]]:
    """The state documents stored at any of the paths ``d_paths`` (a page's scopes and their ancestors)."""
    return sa.select(scope_data.c.scope, sa.cast(scope_data.c.data, sa.Text()).label("data")).where(
        scope_data.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        scope_data.c.scope == sa.any_(sa.bindparam("d_paths", type_=ARRAY(sa.Text()))),
    )


@cache
def _count_statement(shape: FilterShape) -> sa.Select[int]:
    return sa.select(sa.func.count()).select_from(sessions).where(session_predicate(shape))


def _returned(distributed: bool) -> tuple[Any, ...]:
    """What an INSERT returns: the whole session, or (on Citus) its id to read it back by."""
    return INSERTED_COLUMNS if distributed else SESSION_COLUMNS


@cache
def _resolve_insert_statement(distributed: bool = False) -> sa.Insert:
    return (
        pg_insert(sessions)
        .values(
            id=_id_param(),
            agent_id=sa.bindparam("new_agent_id", type_=sa.Text()),
            is_default=sa.true(),
            **_scope_values(),
        )
        .on_conflict_do_nothing(
            index_elements=[sessions.c.tenant_id, sessions.c.agent_id, sessions.c.scope],
            index_where=sessions.c.is_default,
        )
        .returning(*_returned(distributed))
    )


@cache
def _resolve_statement() -> sa.CompoundSelect[*tuple[Any, ...]]:
    """The default of (agent, exact scope), inserted if there is none: one statement (plain PostgreSQL).

    ``found`` reads the default; the INSERT adds one only where ``found`` is
    empty, and yields to a concurrent winner (``ON CONFLICT DO NOTHING``).
    Both see the statement's snapshot, so a winner that committed after it
    began leaves the result empty, and the caller runs again (a new
    snapshot finds it). Citus cannot route an INSERT ... SELECT from a CTE:
    there the SELECT and the INSERT are separate statements.
    """
    found = (
        sa.select(*SESSION_COLUMNS)
        .where(
            exact_clause(),
            sessions.c.agent_id == sa.bindparam("new_agent_id", type_=sa.Text()),
            sessions.c.is_default,
        )
        .cte("found")
    )
    values = {
        "id": _id_param(),
        "agent_id": sa.bindparam("new_agent_id", type_=sa.Text()),
        "is_default": sa.true(),
        **_scope_values(),
    }
    source = sa.select(*(value.label(name) for name, value in values.items())).where(
        ~sa.exists(sa.select(found.c.id))
    )
    inserted = (
        pg_insert(sessions)
        .from_select(list(values), source)
        .on_conflict_do_nothing(
            index_elements=[sessions.c.tenant_id, sessions.c.agent_id, sessions.c.scope],
            index_where=sessions.c.is_default,
        )
        .returning(*SESSION_COLUMNS)
        .cte("inserted")
    )
    return sa.select(found).union_all(sa.select(inserted))


@cache
def _default_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(*SESSION_COLUMNS).where(
        exact_clause(),
        sessions.c.agent_id == sa.bindparam("new_agent_id", type_=sa.Text()),
        sessions.c.is_default,
    )


def _not_found(session_id: uuid.UUID) -> NotFound:
    return NotFound(f"session {format_id(SESSION_PREFIX, session_id)} not found")


async def insert_session(
    conn: Tx,
    scope: Scope,
    *,
    session_id: uuid.UUID,
    agent_id: str,
    title: str,
    metadata_json: str,
    is_default: bool,
    caller_chosen_id: bool = False,
    key: str | None = None,
    data_json: str | None = None,
    scope_deltas: dict[str, str] | None = None,
    distributed: bool = False,
) -> Session:
    """Insert a session at exactly ``scope``; merge ``scope_deltas`` into its scopes' documents.

    ``distributed`` (Citus): the INSERT returns the id only, and the session
    is read back by a second statement: Citus refuses the merged-state
    subquery of :data:`SESSION_COLUMNS` inside an INSERT.

    ``key``: the host's key for it, unique per (agent, exact scope);
    ``data_json``: its state document as stored (see cortex.models.encode_data).

    A caller-chosen id may carry an interrupt marker parked before the
    session exists: the id's advisory lock (:func:`lock_session_id`) is taken
    first, so a concurrent ``mark_interrupted`` either committed before the
    INSERT's snapshot (the session starts interrupted) or waits and then
    finds the session. Generated ids are fresh UUIDv7s no marker can name.

    ``caller_chosen_id``: the caller picked ``session_id``, so this may be a retry of
    its own create whose reply was lost. If the id is taken by the session
    this call would create (same agent, exact scope, title, metadata, key,
    state, scope deltas and default flag), that session is returned and
    nothing is written: the deltas are not merged again. A taken
    id otherwise is Conflict; the error names the id only, never anything of
    the session holding it, which may live in a scope the caller cannot see.
    Ids are unique per tenant, so that Conflict is all a caller learns:
    that the id is in use somewhere in its tenant.

    Raises:
        Conflict: the id is taken in this tenant by another session, or
            (agent, scope) already has a default.
    """
    params = {
        "target_id": session_id,
        "new_agent_id": agent_id,
        "new_title": title,
        "new_metadata": metadata_json,
        "new_is_default": is_default,
        "new_key": key,
        "new_data": data_json,
        # What a retry must match of the scope deltas (deltas_digest).
        "new_scope_digest": deltas_digest(None, scope_deltas) if caller_chosen_id else None,
        # The tenant the merged-state subquery of SESSION_COLUMNS reads by.
        "scope_tenant": scope.tenant,
        **scope_columns(scope),
    }
    taken = f"session id {format_id(SESSION_PREFIX, session_id)} is already taken"
    if caller_chosen_id:
        await lock_session_id(conn, scope, session_id)
        lookup = {
            k: v
            for k, v in params.items()
            if k not in ("new_tenant_id", "new_scope_depth", "new_scope_l2", "new_scope_l3")
        }
        existing = (await conn.execute(_taken_statement(), lookup)).first()
        if existing is not None:
            if existing["same"]:
                return row_to_session(existing)
            raise Conflict(taken)
        if distributed:
            parked = {k: params[k] for k in ("scope_tenant", "target_id", "new_scope")}
            params["new_is_interrupted"] = (
                await conn.execute(_parked_statement(), parked)
            ).scalar_one()
    try:
        stmt = _insert_statement(caller_chosen_id, distributed)
        row = (await conn.execute(stmt, params)).one()
    except asyncpg.CheckViolationError as exc:
        raise data_too_large(exc) from exc
    except asyncpg.UniqueViolationError as exc:
        if _default_clash(exc, wrote_default=is_default):
            raise Conflict(f"agent {agent_id!r} already has a default session in {scope}") from exc
        name = constraint_of(exc)
        # A Citus coordinator may relay the error without its constraint: the
        # id was checked free under its lock (or is a fresh UUIDv7), and a
        # default clash was decided above, so with a key it is the key's.
        if name == _UQ_KEY or (name is None and key is not None):
            raise Conflict(
                f"agent {agent_id!r} already has a session keyed {key!r} in {scope}"
            ) from exc
        if caller_chosen_id:
            # A concurrent create of this id committed while we inserted:
            # run again, and the check above tells a retry from a clash.
            raise RetryTransaction from exc
        raise Conflict(taken) from exc
    if scope_deltas:
        await merge_scope_data(conn, scope, session_id, scope_deltas)
        # Read again: the merged view now includes the scopes' documents.
        return await select_session(conn, scope, session_id)
    if distributed:
        return await select_session(conn, scope, session_id)
    return row_to_session(row)


async def select_session(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, for_update: bool = False
) -> Session:
    """The session if it is visible from ``scope``.

    Raises:
        NotFound: missing or outside the scope (indistinguishable on purpose).
    """
    stmt = _select_statement(depth_class(scope), for_update)
    row = (await conn.execute(stmt, {**scope_params(scope), "target_id": session_id})).first()
    if row is None:
        raise _not_found(session_id)
    return row_to_session(row)


async def update_session(
    conn: Tx, scope: Scope, session_id: uuid.UUID, *, title: str, metadata_json: str
) -> Session:
    """Write the host-owned columns (title, metadata) and move updated_at; nothing else.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {
        **scope_params(scope),
        "target_id": session_id,
        "new_title": title,
        "new_metadata": metadata_json,
    }
    row = (await conn.execute(_update_statement(depth_class(scope)), params)).first()
    if row is None:
        raise _not_found(session_id)
    return row_to_session(row)


async def delete_session(conn: Tx, scope: Scope, session_id: uuid.UUID) -> None:
    """Delete a visible session; its messages, pending inputs and markers go with it.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {**scope_params(scope), "target_id": session_id}
    deleted = (await conn.execute(_delete_statement(depth_class(scope)), params)).first()
    if deleted is None:
        raise _not_found(session_id)
    # Markers have no foreign key (they may be parked before a session
    # exists), so they go explicitly, in the same transaction. A concurrent
    # mark_interrupted writes its marker only under the session's row lock,
    # which this DELETE holds: it committed before (and is deleted here) or
    # it finds the session gone.
    await conn.execute(_delete_markers_statement(), {**params, "deleted_scope": deleted.scope})


async def select_page(
    conn: Tx,
    scope: Scope,
    flt: ListFilter,
    *,
    limit: int,
    offset: int = 0,
    after: tuple[Any, uuid.UUID] | None = None,
    distributed: bool = False,
) -> list[Session]:
    """One page of the listing, by offset or after a keyset cursor.

    ``distributed``: the tables are distributed (Citus); see cortex._filters.search_clause.
    """
    shape = filter_shape(scope, flt, distributed=distributed)
    stmt = _page_statement(shape, cursor=after is not None, offset=offset > 0)
    params = {**await _filter_params(conn, scope, flt, shape), "limit": limit}
    if offset > 0:
        params["offset"] = offset
    if after is not None:
        params.update(cursor_params(*after))
    rows = (await conn.execute(stmt, params)).all()
    return page_sessions(rows, await _page_documents(conn, scope, rows))


async def _page_documents(conn: Tx, scope: Scope, rows: list[Row]) -> dict[str, str]:
    """The stored scope documents on the paths of a page's rows, read once for the page.

    A second statement, and only when the tenant keeps scope state (the
    page's ``has_scope_state``): a page's cost stays its own rows'.
    """
    if not rows or not rows[0]["has_scope_state"]:
        return {}
    paths = sorted({ancestor for row in rows for ancestor in _ancestors(row["scope"])})
    params = {"scope_tenant": scope.tenant, "d_paths": paths}
    found = (await conn.execute(_scope_documents_statement(), params)).all()
    return {row["scope"]: row["data"] for row in found}


async def count_sessions(
    conn: Tx, scope: Scope, flt: ListFilter, *, distributed: bool = False
) -> int:
    """How many sessions the listing would return without limit or offset."""
    shape = filter_shape(scope, flt, distributed=distributed)
    params = await _filter_params(conn, scope, flt, shape)
    return int((await conn.execute(_count_statement(shape), params)).scalar_one())


async def _filter_params(
    conn: Tx, scope: Scope, flt: ListFilter, shape: FilterShape
) -> dict[str, Any]:
    """The listing's bind values; on Citus, a tenant-wide search's candidates first (one statement)."""
    params = filter_params(scope, flt)
    if shape.distributed and searches_tenant(shape):
        search = {k: params[k] for k in ("scope_tenant", "search_pattern")}
        found = (await conn.execute(tenant_search_statement(), search)).scalar_one()
        params["search_ids"] = found
    return params


async def resolve_default(
    conn: Tx, scope: Scope, agent_id: str, *, distributed: bool = False, known: bool = False
) -> Session:
    """The default session of (agent, exact scope), created if absent.

    ``known``: the caller has seen this default before, so it most likely
    exists: a plain SELECT first (the cheapest statement, no INSERT set up).
    Otherwise, on plain PostgreSQL, one statement (:func:`_resolve_statement`)
    finds the default or inserts it. Its snapshot cannot see a default
    another transaction committed while our INSERT waited on it, so that
    race returns nothing and the call runs again, on a new snapshot that
    does. On Citus, after the SELECT finds none, ``INSERT ... ON CONFLICT
    DO NOTHING`` against the partial unique index, then a *separate* SELECT,
    whose new snapshot (READ COMMITTED) sees such a winner. If the winner
    was deleted in between, the call runs again.
    """
    params = {
        "target_id": new_uuid(),
        "new_agent_id": agent_id,
        **scope_columns(scope),
        **scope_params(scope),
    }
    lookup = {**scope_params(scope), "new_agent_id": agent_id}
    if known or distributed:
        row = (await conn.execute(_default_statement(), lookup)).first()
        if row is not None:
            return row_to_session(row)
    if not distributed:
        row = (await conn.execute(_resolve_statement(), params)).first()
        if row is None:
            raise RetryTransaction  # a concurrent winner committed after our snapshot
        return row_to_session(row)
    row = (await conn.execute(_resolve_insert_statement(distributed), params)).first()
    if row is None or distributed:  # on Citus the INSERT returned the id only
        row = (await conn.execute(_default_statement(), lookup)).first()
    if row is None:
        raise RetryTransaction
    return row_to_session(row)


async def lock_session_id(conn: Tx, scope: Scope, session_id: uuid.UUID) -> None:
    """Take the transaction-scoped advisory lock on (tenant, session id).

    Serialises what a row lock cannot, because the row may not exist yet: a
    create with a caller-chosen id against markers parked for that id.
    """
    await conn.execute(_lock_statement(), {"lock_key": f"session {scope.tenant} {session_id}"})


@cache
def _lock_statement() -> sa.Select[Any]:
    key = sa.bindparam("lock_key", type_=sa.Text())
    # Qualified: the integer seed would match another role's hashtextextended(text, integer).
    return sa.select(
        sa.func.pg_catalog.pg_advisory_xact_lock(sa.func.pg_catalog.hashtextextended(key, 0))
    )


@cache
def _switch_statements(depth: int) -> tuple[sa.Update, sa.Update]:
    """Demote the current default and promote the target, within one (agent, scope)."""
    # The target's exact scope by its path alone: visible() already binds the
    # tenant, and a second tenant parameter (equal at run time) would make
    # Citus plan the UPDATE for every shard.
    same_thread = sa.and_(
        visible(depth),
        sessions.c.scope == sa.bindparam("target_path", type_=sa.Text()),
        sessions.c.agent_id == sa.bindparam("target_agent_id", type_=sa.Text()),
    )
    demote = (
        sa.update(sessions)
        .where(same_thread, sessions.c.is_default, sessions.c.id != _id_param())
        .values(is_default=False)
    )
    promote = (
        sa.update(sessions)
        .where(same_thread, sessions.c.id == _id_param())
        .values(is_default=True)
        .returning(*SESSION_COLUMNS)
    )
    return demote, promote


async def set_default(conn: Tx, scope: Scope, session_id: uuid.UUID) -> Session:
    """Make a visible session the default of its (agent, scope), demoting the old one.

    Concurrency: the target row is locked, then a transaction-scoped advisory
    lock on (agent, scope) serialises competing switches, so the last one
    wins instead of failing. Demote and promote run in this one transaction:
    readers see the old default or the new one, never none and never two. A
    default inserted concurrently by resolve_session makes the promote hit
    the unique index; the whole transaction then runs again.

    Raises:
        NotFound: when the session is not visible.
    """
    target = await select_session(conn, scope, session_id, for_update=True)
    if target.is_default:
        return target
    key = f"{target.agent_id} {target.scope}"  # agent ids hold no whitespace
    await conn.execute(_lock_statement(), {"lock_key": key})
    demote, promote = _switch_statements(depth_class(scope))
    params = {
        **scope_params(scope),
        "target_path": str(target.scope),
        "target_agent_id": target.agent_id,
        "target_id": session_id,
    }
    await conn.execute(demote, params)
    try:
        row = (await conn.execute(promote, params)).one()
    except asyncpg.UniqueViolationError as exc:
        if _default_clash(exc, wrote_default=True):  # the promote writes is_default = true
            raise RetryTransaction from exc
        raise
    return row_to_session(row)


# --- host-chosen keys -----------------------------------------------------------


@cache
def _resolve_key_statement(distributed: bool = False) -> sa.Insert:
    return (
        pg_insert(sessions)
        .values(
            id=_id_param(),
            agent_id=sa.bindparam("new_agent_id", type_=sa.Text()),
            session_key=sa.bindparam("new_key", type_=sa.Text()),
            **_scope_values(),
        )
        .on_conflict_do_nothing(
            index_elements=[
                sessions.c.tenant_id,
                sessions.c.agent_id,
                sessions.c.scope,
                sessions.c.session_key,
            ],
            index_where=sessions.c.session_key.is_not(None),
        )
        .returning(*_returned(distributed))
    )


@cache
def _by_key_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(*SESSION_COLUMNS).where(
        exact_clause(),
        sessions.c.agent_id == sa.bindparam("new_agent_id", type_=sa.Text()),
        sessions.c.session_key == sa.bindparam("new_key", type_=sa.Text()),
    )


async def select_by_key(conn: Tx, scope: Scope, agent_id: str, key: str) -> Session | None:
    """The session of ``agent_id`` keyed ``key`` at exactly ``scope``, if there is one."""
    params = {**scope_params(scope), "new_agent_id": agent_id, "new_key": key}
    row = (await conn.execute(_by_key_statement(), params)).first()
    return None if row is None else row_to_session(row)


async def resolve_key(
    conn: Tx, scope: Scope, agent_id: str, key: str, *, distributed: bool = False
) -> Session:
    """The session of ``agent_id`` keyed ``key`` at exactly ``scope``, created if absent.

    A SELECT first. If it finds none, concurrency: as
    :func:`resolve_default`, ``INSERT ... ON CONFLICT DO
    NOTHING`` against ``uq_sessions_key``, then a separate SELECT, whose new
    snapshot (READ COMMITTED) sees the row a concurrent first write
    committed while our INSERT waited on it. Concurrent first writes under
    one key therefore all get the same session. If that session was deleted
    in between, the transaction runs again.
    """
    params = {
        "target_id": new_uuid(),
        "new_agent_id": agent_id,
        "new_key": key,
        "scope_tenant": scope.tenant,
        **scope_columns(scope),
    }
    # Most calls find their session: look first, so that costs one statement.
    found = await select_by_key(conn, scope, agent_id, key)
    if found is not None:
        return found
    row = (await conn.execute(_resolve_key_statement(distributed), params)).first()
    if row is not None and not distributed:  # on Citus the INSERT returned the id only
        return row_to_session(row)
    found = await select_by_key(conn, scope, agent_id, key)
    if found is None:
        raise RetryTransaction
    return found


# --- scope state --------------------------------------------------------------


@cache
def _scope_data_statement() -> sa.Insert:
    """Merge each delta into its scope's document, if the scope is on the session's path.

    The session row supplies the path: a delta for a scope that is neither
    the session's nor an ancestor of it (or for a session not visible, which
    the WHERE on ``sessions`` excludes by tenant and id) inserts nothing, and
    the caller compares the count. ON CONFLICT takes the scope row's lock,
    so concurrent deltas to one scope apply one after the other, each on the
    other's result.
    """
    deltas = (
        sa.func.unnest(
            sa.bindparam("d_scopes", type_=ARRAY(sa.Text())),
            sa.bindparam("d_data", type_=ARRAY(sa.Text())),
        )
        .table_valued(sa.column("scope", sa.Text()), sa.column("data", sa.Text()), name="delta")
        .render_derived()
    )
    on_path = sa.or_(
        sessions.c.scope == deltas.c.scope,
        sa.func.starts_with(sessions.c.scope, deltas.c.scope + "/"),
    )
    source = sa.select(
        sessions.c.tenant_id,
        deltas.c.scope,
        sa.cast(deltas.c.data, JSONB()),
        sa.func.statement_timestamp(),
    ).where(
        sessions.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        sessions.c.id == _id_param(),
        on_path,
    )
    stmt = pg_insert(scope_data).from_select(["tenant_id", "scope", "data", "updated_at"], source)
    return stmt.on_conflict_do_update(
        index_elements=[scope_data.c.tenant_id, scope_data.c.scope],
        set_={
            "data": scope_data.c.data.op("||")(stmt.excluded.data),
            # The excluded row's time, not a function call: Citus allows only
            # IMMUTABLE functions in DO UPDATE SET on a distributed table.
            "updated_at": sa.func.greatest(scope_data.c.updated_at, stmt.excluded.updated_at),
        },
    ).returning(scope_data.c.scope)


async def merge_scope_data(
    conn: Tx, scope: Scope, session_id: uuid.UUID, deltas: dict[str, str]
) -> None:
    """Merge state deltas (scope path to stored delta text) into the scopes' documents.

    Runs after the statement that locked or created the session, in its
    transaction; scopes are written in path order, so two transactions
    touching the same scopes take their row locks in the same order.

    Raises:
        InvalidInput: a scope is not the session's or one of its ancestors
            (the transaction is rolled back: nothing is written).
    """
    paths = sorted(deltas)
    params = {
        "scope_tenant": scope.tenant,
        "target_id": session_id,
        "d_scopes": paths,
        "d_data": [deltas[p] for p in paths],
    }
    try:
        written = (await conn.execute(_scope_data_statement(), params)).all()
    except asyncpg.CheckViolationError as exc:
        raise data_too_large(exc) from exc
    if len(written) != len(paths):
        missed = sorted(set(paths) - {row["scope"] for row in written})
        raise InvalidInput(
            f"scope_data: {', '.join(missed)} is not the session's scope or an ancestor of it"
        )


@cache
def _get_scope_data_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(sa.cast(scope_data.c.data, sa.Text()).label("data")).where(
        scope_data.c.tenant_id == sa.bindparam("scope_tenant", type_=sa.Text()),
        scope_data.c.scope == sa.bindparam("target_scope", type_=sa.Text()),
    )


async def select_scope_data(conn: Tx, scope: Scope, target: Scope) -> dict[str, Any]:
    """The state document stored at exactly ``target`` ({} if none)."""
    params = {"scope_tenant": scope.tenant, "target_scope": str(target)}
    row = (await conn.execute(_get_scope_data_statement(), params)).first()
    return {} if row is None else decode_data(row["data"])
