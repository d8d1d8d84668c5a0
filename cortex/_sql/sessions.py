"""The statements on sessions and scope state, and the columns a Session is read from.

Each builder is cached (functools.cache): a statement shape is built and
compiled once, then reused with new bind values (cortex._calls.sessions).
Every statement gets its tenant and scope condition from cortex._sql.predicates.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSON, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cortex._sql.params import (
    D_DATA,
    D_PATHS,
    D_SCOPES,
    DELETED_SCOPE,
    LOCK_KEY,
    NEW_AGENT_ID,
    NEW_DATA,
    NEW_IS_DEFAULT,
    NEW_IS_INTERRUPTED,
    NEW_KEY,
    NEW_METADATA,
    NEW_SCOPE,
    NEW_SCOPE_DEPTH,
    NEW_SCOPE_DIGEST,
    NEW_SCOPE_L2,
    NEW_SCOPE_L3,
    NEW_TENANT_ID,
    NEW_TITLE,
    PREVIEW,
    SCOPE_TENANT,
    SOURCE_ID,
    TARGET_AGENT_ID,
    TARGET_PATH,
    TARGET_SCOPE,
    THROUGH_SEQ,
    array_param,
    bool_param,
    bytes_param,
    int_param,
    scope_tenant_param,
    target_id_param,
    text_param,
    uuid_param,
)
from cortex._sql.predicates import (
    FilterShape,
    after_cursor,
    exact_clause,
    page,
    session_predicate,
    visible,
)
from cortex._sql.tables import bounded_data, scope_data, session_markers, sessions

__all__ = [
    "HAS_SCOPE_STATE",
    "INSERTED_COLUMNS",
    "MERGED_DATA",
    "METADATA_TEXT",
    "SESSION_COLUMNS",
    "by_key_statement",
    "count_statement",
    "default_statement",
    "delete_markers_statement",
    "delete_statement",
    "fork_source_statement",
    "fork_statement",
    "get_scope_data_statement",
    "insert_statement",
    "lock_statement",
    "page_statement",
    "parked_statement",
    "resolve_default_insert_statement",
    "resolve_default_statement",
    "resolve_key_statement",
    "scope_data_statement",
    "scope_documents_statement",
    "select_statement",
    "switch_statements",
    "taken_statement",
    "update_statement",
    "verbatim_json_param",
]

# The stored metadata as text: the verbatim JSON (revision 20261201000009),
# else the jsonb of a row last written before it. Decoded by row_to_session.
METADATA_TEXT: Final = sa.func.coalesce(
    sa.cast(sessions.c.metadata_json, sa.Text()), sa.cast(sessions.c.metadata, sa.Text())
)

# The session's state as read: its scopes' documents, outer first, then its own
# over them; bound by ``scope_tenant`` (not the row's column) so Citus routes the
# subquery to one shard, and pg_catalog-qualified so no planted overload runs.
MERGED_DATA: Final = sa.type_coerce(
    sa.text(
        # Most tenants keep no scope state: an uncorrelated EXISTS (one
        # InitPlan per statement) spares every row the per-row lookup then.
        f"(CASE WHEN EXISTS (SELECT FROM scope_data WHERE tenant_id = :{SCOPE_TENANT})"
        " THEN coalesce((SELECT pg_catalog.jsonb_object_agg(e.key, e.value ORDER BY pg_catalog.length(sd.scope))"
        " FROM scope_data AS sd CROSS JOIN LATERAL pg_catalog.jsonb_each(sd.data) AS e"
        f" WHERE sd.tenant_id = :{SCOPE_TENANT} AND sd.scope = ANY (ARRAY("
        "SELECT pg_catalog.array_to_string((pg_catalog.string_to_array(sessions.scope, '/'))[1\\:i], '/')"
        " FROM pg_catalog.generate_series(1, sessions.scope_depth) AS i))), '{}'::jsonb)"
        " ELSE '{}'::jsonb END"
        " || coalesce(sessions.data, '{}'::jsonb))::text"
    ).bindparams(scope_tenant_param()),
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
    sessions.c.trimmed_count,
    sessions.c.last_message,
    sessions.c.is_default,
    sessions.c.backfilled_by,
    sessions.c.created_at,
    sessions.c.updated_at,
    sessions.c.state,
    sessions.c.pending_count,
    sessions.c.session_key,
    sessions.c.forked_from_id,
    sessions.c.forked_from_seq,
    # Last: a listing page reads the session's own document instead.
    MERGED_DATA.label("data"),
)

# Whether the tenant keeps any scope state: an uncorrelated EXISTS, one
# InitPlan per statement, on every row of a listing page. Only then does the
# page read its scopes' documents (select_page). The tenant is the bound
# parameter, as in MERGED_DATA.
HAS_SCOPE_STATE: Final = sa.exists().where(scope_data.c.tenant_id == scope_tenant_param())

# For INSERT ... RETURNING on Citus, which refuses a subquery there: the
# session's own document only; the caller then reads the session back.
INSERTED_COLUMNS: Final = (sessions.c.id,)


def verbatim_json_param(name: str) -> sa.ColumnElement[Any]:
    """JSON text bound for a ``json`` column, which stores its input text exactly."""
    return sa.cast(text_param(name), JSON())


def _scope_values() -> dict[str, Any]:
    return {
        "tenant_id": text_param(NEW_TENANT_ID),
        "scope": text_param(NEW_SCOPE),
        "scope_depth": sa.bindparam(NEW_SCOPE_DEPTH, type_=sa.SmallInteger()),
        "scope_l2": text_param(NEW_SCOPE_L2),
        "scope_l3": text_param(NEW_SCOPE_L3),
    }


@cache
def insert_statement(caller_chosen_id: bool, distributed: bool = False) -> sa.Insert:
    values: dict[str, Any] = {
        "id": target_id_param(),
        "agent_id": text_param(NEW_AGENT_ID),
        "title": text_param(NEW_TITLE),
        "metadata_json": verbatim_json_param(NEW_METADATA),
        "is_default": bool_param(NEW_IS_DEFAULT),
        "session_key": text_param(NEW_KEY),
        "data": bounded_data(sa.cast(text_param(NEW_DATA), JSONB())),
        "scope_deltas_digest": bytes_param(NEW_SCOPE_DIGEST),
        **_scope_values(),
    }
    if not caller_chosen_id:
        # A generated id is a fresh UUIDv7 no marker can name: a plain
        # INSERT ... VALUES, which Citus routes straight to the tenant's shard.
        return sa.insert(sessions).values(**values).returning(*_returned(distributed))
    if distributed:
        # Whether a marker is parked was read first (parked_statement), under
        # the id's lock: a plain INSERT ... VALUES, a router statement, where
        # Citus would pull an INSERT ... SELECT through the coordinator.
        values["is_interrupted"] = bool_param(NEW_IS_INTERRUPTED)
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
        session_markers.c.tenant_id == scope_tenant_param(),
        session_markers.c.session_id == target_id_param(),
        session_markers.c.kind == "interrupted",
        session_markers.c.scope == text_param(NEW_SCOPE),
    )


@cache
def parked_statement() -> sa.Select[tuple[bool]]:
    return sa.select(_parked_marker())


@cache
def taken_statement() -> sa.Select[*tuple[Any, ...]]:
    """The session holding a caller-chosen id in this tenant, and whether it is this create's.

    "Same" means the same agent at the same exact scope with the same
    title, metadata text, default flag, key, state document and scope_data
    deltas (their digest): what a retry of this very call would have created. Only then is the session returned; it is then
    visible from the caller's scope anyway.
    """
    same = sa.and_(
        sessions.c.agent_id == text_param(NEW_AGENT_ID),
        sessions.c.scope == text_param(NEW_SCOPE),
        sessions.c.title == text_param(NEW_TITLE),
        text_param(NEW_METADATA) == METADATA_TEXT,
        sessions.c.is_default == bool_param(NEW_IS_DEFAULT),
        sessions.c.session_key.is_not_distinct_from(text_param(NEW_KEY)),
        sessions.c.data.is_not_distinct_from(sa.cast(text_param(NEW_DATA), JSONB())),
        # The create's scope_data, by digest; NULL: created by a release that kept none.
        sa.or_(
            sessions.c.scope_deltas_digest.is_(None),
            sessions.c.scope_deltas_digest == bytes_param(NEW_SCOPE_DIGEST),
        ),
    )
    return sa.select(*SESSION_COLUMNS, same.label("same")).where(
        sessions.c.tenant_id == scope_tenant_param(),
        sessions.c.id == target_id_param(),
    )


@cache
def select_statement(depth: int, for_update: bool) -> sa.Select[*tuple[Any, ...]]:
    stmt = sa.select(*SESSION_COLUMNS).where(visible(depth), sessions.c.id == target_id_param())
    return stmt.with_for_update() if for_update else stmt


@cache
def fork_source_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """A visible session about to be forked, locked ``FOR KEY SHARE``.

    The lock waits for (and holds off) what takes the row ``FOR UPDATE``
    or deletes it: pop, clear, rewind, abort, delete. Appends update no key
    column, so they go on; each adds messages after the count read here,
    which the fork never copies.
    """
    return (
        sa.select(*SESSION_COLUMNS)
        .where(visible(depth), sessions.c.id == target_id_param())
        .with_for_update(read=True, key_share=True)
    )


@cache
def fork_statement(depth: int) -> sa.Insert:
    """Insert the fork of the visible session ``source_id`` as ``target_id``: one INSERT ... SELECT.

    The fork is the source's agent, exact scope, metadata (both stored
    forms), own state document and title (``new_title`` if not NULL), with
    ``message_count = through_seq`` and the given preview; it has no key, is
    not the default, carries no marker and names its source. Citus runs it
    on the tenant's shard: both rows are the tenant's, and the tenant column
    is copied as is.
    """
    now = sa.func.statement_timestamp()
    columns: dict[str, Any] = {
        "tenant_id": sessions.c.tenant_id,
        "id": target_id_param(),
        "agent_id": sessions.c.agent_id,
        "scope": sessions.c.scope,
        "scope_depth": sessions.c.scope_depth,
        "scope_l2": sessions.c.scope_l2,
        "scope_l3": sessions.c.scope_l3,
        "title": sa.func.coalesce(text_param(NEW_TITLE), sessions.c.title),
        "metadata": sessions.c.metadata,
        "metadata_json": sessions.c.metadata_json,
        "data": sessions.c.data,
        "message_count": int_param(THROUGH_SEQ),
        "last_message": text_param(PREVIEW),
        "forked_from_id": sessions.c.id,
        "forked_from_seq": int_param(THROUGH_SEQ),
        "created_at": now,
        "updated_at": now,
    }
    select = sa.select(*(value.label(name) for name, value in columns.items())).where(
        visible(depth), sessions.c.id == uuid_param(SOURCE_ID)
    )
    # No RETURNING: Citus fails an INSERT ... SELECT it runs on a shard with one.
    return sa.insert(sessions).from_select(list(columns), select)


@cache
def update_statement(depth: int) -> sa.Update:
    return (
        sa.update(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .values(
            title=text_param(NEW_TITLE),
            metadata_json=verbatim_json_param(NEW_METADATA),
            # The jsonb copy of a legacy row is superseded: free it.
            metadata=sa.text("'{}'::jsonb"),
            # statement_timestamp(), not clock_timestamp(): Citus refuses
            # VOLATILE functions in an UPDATE of a distributed table.
            updated_at=sa.func.greatest(sessions.c.updated_at, sa.func.statement_timestamp()),
        )
        .returning(*SESSION_COLUMNS)
    )


@cache
def delete_statement(depth: int) -> sa.ClauseElement:
    return (
        sa.delete(sessions)
        .where(visible(depth), sessions.c.id == target_id_param())
        .returning(sessions.c.scope)
    )


@cache
def delete_markers_statement() -> sa.Delete:
    # The session's own markers: those at its scope. A marker another scope
    # parked for the same id waits for a session of that scope, not this one.
    return sa.delete(session_markers).where(
        session_markers.c.tenant_id == scope_tenant_param(),
        session_markers.c.session_id == target_id_param(),
        session_markers.c.scope == text_param(DELETED_SCOPE),
    )


@cache
def page_statement(
    shape: FilterShape, *, cursor: bool, offset: bool
) -> sa.Select[*tuple[Any, ...]]:
    """A listing page: its rows with their own state documents, not merged ones.

    A merged document per row would repeat every ancestor scope's document
    in every row of the page; the page's call reads those documents once
    for the page instead (:func:`scope_documents_statement`).
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
def scope_documents_statement() -> sa.Select[*tuple[Any, ...]]:
    """The state documents stored at any of the paths ``d_paths`` (a page's scopes and their ancestors)."""
    return sa.select(scope_data.c.scope, sa.cast(scope_data.c.data, sa.Text()).label("data")).where(
        scope_data.c.tenant_id == scope_tenant_param(),
        scope_data.c.scope == sa.any_(array_param(D_PATHS, sa.Text())),
    )


@cache
def count_statement(shape: FilterShape) -> sa.Select[int]:
    return sa.select(sa.func.count()).select_from(sessions).where(session_predicate(shape))


def _returned(distributed: bool) -> tuple[Any, ...]:
    """What an INSERT returns: the whole session, or (on Citus) its id to read it back by."""
    return INSERTED_COLUMNS if distributed else SESSION_COLUMNS


@cache
def resolve_default_insert_statement(distributed: bool = False) -> sa.Insert:
    """Insert the default of (agent, exact scope) unless there is one (Citus: the SELECT is separate)."""
    return (
        pg_insert(sessions)
        .values(
            id=target_id_param(),
            agent_id=text_param(NEW_AGENT_ID),
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
def resolve_default_statement() -> sa.CompoundSelect[*tuple[Any, ...]]:
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
            sessions.c.agent_id == text_param(NEW_AGENT_ID),
            sessions.c.is_default,
        )
        .cte("found")
    )
    values = {
        "id": target_id_param(),
        "agent_id": text_param(NEW_AGENT_ID),
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
def default_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(*SESSION_COLUMNS).where(
        exact_clause(),
        sessions.c.agent_id == text_param(NEW_AGENT_ID),
        sessions.c.is_default,
    )


@cache
def lock_statement() -> sa.Select[Any]:
    key = text_param(LOCK_KEY)
    # Qualified: the integer seed would match another role's hashtextextended(text, integer).
    return sa.select(
        sa.func.pg_catalog.pg_advisory_xact_lock(sa.func.pg_catalog.hashtextextended(key, 0))
    )


@cache
def switch_statements(depth: int) -> tuple[sa.Update, sa.Update]:
    """Demote the current default and promote the target, within one (agent, scope)."""
    # The target's exact scope by its path alone: visible() already binds the
    # tenant, and a second tenant parameter (equal at run time) would make
    # Citus plan the UPDATE for every shard.
    same_thread = sa.and_(
        visible(depth),
        sessions.c.scope == text_param(TARGET_PATH),
        sessions.c.agent_id == text_param(TARGET_AGENT_ID),
    )
    demote = (
        sa.update(sessions)
        .where(same_thread, sessions.c.is_default, sessions.c.id != target_id_param())
        .values(is_default=False)
    )
    promote = (
        sa.update(sessions)
        .where(same_thread, sessions.c.id == target_id_param())
        .values(is_default=True)
        .returning(*SESSION_COLUMNS)
    )
    return demote, promote


# --- host-chosen keys -----------------------------------------------------------


@cache
def resolve_key_statement(distributed: bool = False) -> sa.Insert:
    return (
        pg_insert(sessions)
        .values(
            id=target_id_param(),
            agent_id=text_param(NEW_AGENT_ID),
            session_key=text_param(NEW_KEY),
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
def by_key_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(*SESSION_COLUMNS).where(
        exact_clause(),
        sessions.c.agent_id == text_param(NEW_AGENT_ID),
        sessions.c.session_key == text_param(NEW_KEY),
    )


# --- scope state --------------------------------------------------------------


@cache
def scope_data_statement() -> sa.Insert:
    """Merge each delta into its scope's document, if the scope is on the session's path.

    The session row supplies the path: a delta for a scope that is neither
    the session's nor an ancestor of it (or for a session not visible, which
    the WHERE on ``sessions`` excludes by tenant and id) inserts nothing, and
    the caller compares the count. ON CONFLICT takes the scope row's lock,
    so concurrent deltas to one scope apply one after the other, each on the
    other's result.
    """
    deltas = (
        sa.func.unnest(array_param(D_SCOPES, sa.Text()), array_param(D_DATA, sa.Text()))
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
        sessions.c.tenant_id == scope_tenant_param(),
        sessions.c.id == target_id_param(),
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


@cache
def get_scope_data_statement() -> sa.Select[*tuple[Any, ...]]:
    return sa.select(sa.cast(scope_data.c.data, sa.Text()).label("data")).where(
        scope_data.c.tenant_id == scope_tenant_param(),
        scope_data.c.scope == text_param(TARGET_SCOPE),
    )
