"""Calls on sessions: insert, select, update, delete, list, count, defaults.

Plain ``async def`` functions taking ``(conn, scope, ...)``. They never commit
and never open transactions: :func:`cortex._db.transaction.run_transaction` owns that.
Their statements are built in cortex._sql.sessions.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from typing import Any

from cortex._calls.constraints import Writing, refusal, refusals
from cortex._calls.rows import (
    ancestors,
    decode_data,
    page_sessions,
    row_to_session,
    split_reserved,
)
from cortex._db.executor import Row, Tx
from cortex._db.transaction import RetryTransaction
from cortex._sql import sessions as sql
from cortex._sql.params import (
    D_DATA,
    D_PATHS,
    D_SCOPES,
    DELETED_SCOPE,
    LIMIT,
    LOCK_KEY,
    METADATA_IDS,
    METADATA_SINCE,
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
    OFFSET,
    SCOPE_TENANT,
    SEARCH_IDS,
    SEARCH_PATTERN,
    TARGET_AGENT_ID,
    TARGET_ID,
    TARGET_PATH,
    TARGET_SCOPE,
)
from cortex._sql.predicates import (
    METADATA_CANDIDATES,
    METADATA_COUNT_CANDIDATES,
    FilterShape,
    cursor_params,
    depth_class,
    filter_params,
    filter_shape,
    hour_start,
    metadata_candidate_params,
    metadata_candidates_statement,
    scope_params,
    searches_tenant,
    tenant_search_statement,
    too_many_candidates,
    uses_metadata_candidates,
    with_candidates,
)
from cortex._sql.tables import (
    DATA_SIZE_REPORTED,
    PK_SESSIONS,
    SCOPE_DATA_SIZE,
    UQ_SESSIONS_DEFAULT,
    UQ_SESSIONS_KEY,
)
from cortex._validate import decode_json_of_strings
from cortex.errors import InvalidInput, NotFound
from cortex.ids import SESSION_PREFIX, format_id, new_uuid
from cortex.models import ListFilter, Session
from cortex.scope import Scope

__all__ = [
    "count_sessions",
    "delete_session",
    "deltas_digest",
    "insert_session",
    "listing_digest",
    "lock_session_id",
    "merge_scope_data",
    "not_found",
    "resolve_default",
    "resolve_key",
    "scope_columns",
    "select_by_key",
    "select_page",
    "select_scope_data",
    "select_session",
    "set_default",
    "update_session",
]


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


def scope_columns(scope: Scope) -> dict[str, Any]:
    """The columns derived from a session's scope, written once at insert."""
    return {
        NEW_TENANT_ID: scope.tenant,
        NEW_SCOPE: str(scope),
        NEW_SCOPE_DEPTH: scope.depth,
        NEW_SCOPE_L2: scope.prefix(2) if scope.depth >= 2 else None,
        NEW_SCOPE_L3: scope.prefix(3) if scope.depth >= 3 else None,
    }


def not_found(session_id: uuid.UUID) -> NotFound:
    """The refusal for a session that is not visible: missing and out of scope look alike."""
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
    subquery of :data:`cortex._sql.sessions.SESSION_COLUMNS` inside an INSERT.

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
        TARGET_ID: session_id,
        NEW_AGENT_ID: agent_id,
        NEW_TITLE: title,
        NEW_METADATA: metadata_json,
        NEW_IS_DEFAULT: is_default,
        NEW_KEY: key,
        NEW_DATA: data_json,
        # What a retry must match of the scope deltas (deltas_digest).
        NEW_SCOPE_DIGEST: deltas_digest(None, scope_deltas) if caller_chosen_id else None,
        # The tenant the merged-state subquery of SESSION_COLUMNS reads by.
        SCOPE_TENANT: scope.tenant,
        **scope_columns(scope),
    }
    writing = Writing(scope, session_id=session_id, agent_id=agent_id, key=key)
    if caller_chosen_id:
        await lock_session_id(conn, scope, session_id)
        lookup = {
            k: v
            for k, v in params.items()
            if k not in (NEW_TENANT_ID, NEW_SCOPE_DEPTH, NEW_SCOPE_L2, NEW_SCOPE_L3)
        }
        existing = (await conn.execute(sql.taken_statement(), lookup)).first()
        if existing is not None:
            if existing["same"]:
                return row_to_session(existing)
            raise refusal(PK_SESSIONS, writing)
        if distributed:
            parked = {k: params[k] for k in (SCOPE_TENANT, TARGET_ID, NEW_SCOPE)}
            params[NEW_IS_INTERRUPTED] = (
                await conn.execute(sql.parked_statement(), parked)
            ).scalar_one()
    # Only a row written as a default can meet uq_sessions_default, and only a
    # keyed one uq_sessions_key; where either is written, the id cannot clash
    # (a fresh UUIDv7, or a caller-chosen one checked free under its lock).
    could = [
        *([UQ_SESSIONS_DEFAULT] if is_default else []),
        *([UQ_SESSIONS_KEY] if key is not None else []),
        PK_SESSIONS,
        DATA_SIZE_REPORTED,
    ]
    # A concurrent create of a caller-chosen id committed while we inserted:
    # run again, and the check above tells a retry from a clash.
    retry = [PK_SESSIONS] if caller_chosen_id else []
    with refusals(writing, could, retry=retry):
        stmt = sql.insert_statement(caller_chosen_id, distributed)
        row = (await conn.execute(stmt, params)).one()
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
    stmt = sql.select_statement(depth_class(scope), for_update)
    row = (await conn.execute(stmt, {**scope_params(scope), TARGET_ID: session_id})).first()
    if row is None:
        raise not_found(session_id)
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
        TARGET_ID: session_id,
        NEW_TITLE: title,
        NEW_METADATA: metadata_json,
    }
    row = (await conn.execute(sql.update_statement(depth_class(scope)), params)).first()
    if row is None:
        raise not_found(session_id)
    return row_to_session(row)


async def delete_session(conn: Tx, scope: Scope, session_id: uuid.UUID) -> None:
    """Delete a visible session; its messages, pending inputs and markers go with it.

    Raises:
        NotFound: when the session is not visible.
    """
    params = {**scope_params(scope), TARGET_ID: session_id}
    deleted = (await conn.execute(sql.delete_statement(depth_class(scope)), params)).first()
    if deleted is None:
        raise not_found(session_id)
    # Markers have no foreign key (they may be parked before a session
    # exists), so they go explicitly, in the same transaction. A concurrent
    # mark_interrupted writes its marker only under the session's row lock,
    # which this DELETE holds: it committed before (and is deleted here) or
    # it finds the session gone.
    await conn.execute(sql.delete_markers_statement(), {**params, DELETED_SCOPE: deleted.scope})


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

    ``distributed``: the tables are distributed (Citus); see cortex._sql.predicates.search_clause.

    A metadata filter's page reads its candidates a window of hours at a
    time (:func:`_metadata_window`): the newest hours holding at least
    ``offset + limit`` matches first, and wider windows while the page
    comes out short (another filter dropped candidates), until the window
    holds every match or too many to read one by one, when the listing
    walk checks the filter on each row instead.
    """
    shape, params = await _filter_params(conn, scope, flt, distributed)
    if after is not None:
        params.update(cursor_params(*after))
    if offset > 0:
        params[OFFSET] = offset
    params[LIMIT] = limit
    cursor, offsets = after is not None, offset > 0
    if uses_metadata_candidates(shape):
        before = _latest(after[0] if after is not None else None, flt.updated_before)
        wanted = offset + limit
        while wanted <= METADATA_CANDIDATES:
            window = await _metadata_window(conn, scope, flt, shape, skip=wanted - 1, before=before)
            if window is None:
                break
            windowed, given = window
            stmt = sql.page_statement(windowed, cursor=cursor, offset=offsets)
            rows = (await conn.execute(stmt, {**params, **given})).all()
            if len(rows) >= limit or not windowed.window:
                return page_sessions(rows, await _page_documents(conn, scope, rows))
            wanted *= 8
    stmt = sql.page_statement(shape, cursor=cursor, offset=offsets)
    rows = (await conn.execute(stmt, params)).all()
    return page_sessions(rows, await _page_documents(conn, scope, rows))


def _latest(*moments: datetime | None) -> datetime | None:
    """The earliest of the given upper bounds on ``updated_at``, if any."""
    given = [moment for moment in moments if moment is not None]
    return min(given) if given else None


async def _metadata_window(
    conn: Tx,
    scope: Scope,
    flt: ListFilter,
    shape: FilterShape,
    *,
    skip: int,
    before: datetime | None,
    cap: int = METADATA_CANDIDATES,
) -> tuple[FilterShape, dict[str, Any]] | None:
    """The candidates of the newest hours (no later than ``before``'s) holding ``skip + 1`` matches.

    Returns the shape with them bound and their bind values (the window's
    start too, unless they are every match), or None when there are more
    than ``cap``, or many more than ``skip + 1`` (the listing walks instead).
    """
    statement = metadata_candidates_statement(shape.metadata, before=before is not None)
    given = metadata_candidate_params(scope, flt, skip=skip, cap=cap, before=before)
    since_hour, ids = (await conn.execute(statement, given)).one()
    ids = ids or []
    if too_many_candidates(len(ids), wanted=skip + 1, cap=cap):
        return None
    bound: dict[str, Any] = {METADATA_IDS: ids}
    if since_hour is not None:
        bound[METADATA_SINCE] = hour_start(since_hour)
    return with_candidates(shape, window=since_hour is not None), bound


async def _page_documents(conn: Tx, scope: Scope, rows: list[Row]) -> dict[str, str]:
    """The stored scope documents on the paths of a page's rows, read once for the page.

    A second statement, and only when the tenant keeps scope state (the
    page's ``has_scope_state``): a page's cost stays its own rows'.
    """
    if not rows or not rows[0]["has_scope_state"]:
        return {}
    paths = sorted({ancestor for row in rows for ancestor in ancestors(row["scope"])})
    params = {SCOPE_TENANT: scope.tenant, D_PATHS: paths}
    found = (await conn.execute(sql.scope_documents_statement(), params)).all()
    return {row["scope"]: row["data"] for row in found}


def listing_digest(scope: Scope, flt: ListFilter) -> str:
    """What a listing cursor is bound to: the scope and the filter, page size and offset aside."""
    listing = {
        "scope": str(scope),
        "filter": flt.model_dump(mode="json", exclude={"limit", "offset"}),
    }
    text = json.dumps(listing, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


async def count_sessions(
    conn: Tx, scope: Scope, flt: ListFilter, *, distributed: bool = False
) -> int:
    """How many sessions the listing would return without limit or offset.

    A metadata filter counts its candidates (every match, up to
    ``METADATA_COUNT_CANDIDATES``), else every row of the subtree.
    """
    shape, params = await _filter_params(conn, scope, flt, distributed)
    if uses_metadata_candidates(shape):
        cap = METADATA_COUNT_CANDIDATES
        window = await _metadata_window(conn, scope, flt, shape, skip=cap, before=None, cap=cap)
        if window is not None:  # every match: a window would hold more than cap
            shape, given = window
            params.update(given)
    return int((await conn.execute(sql.count_statement(shape), params)).scalar_one())


async def _filter_params(
    conn: Tx, scope: Scope, flt: ListFilter, distributed: bool
) -> tuple[FilterShape, dict[str, Any]]:
    """The listing's shape and bind values, after the candidates a tenant-wide search looks up first.

    On Citus a tenant-wide search's candidates (one statement). A metadata
    filter's candidates are looked up by the callers (:func:`select_page`,
    :func:`count_sessions`), which know how many a page needs.
    """
    shape = filter_shape(scope, flt, distributed=distributed)
    params = filter_params(scope, flt)
    if shape.distributed and searches_tenant(shape):
        search = {k: params[k] for k in (SCOPE_TENANT, SEARCH_PATTERN)}
        found = (await conn.execute(tenant_search_statement(), search)).scalar_one()
        params[SEARCH_IDS] = found
    return shape, params


async def resolve_default(
    conn: Tx, scope: Scope, agent_id: str, *, distributed: bool = False, known: bool = False
) -> Session:
    """The default session of (agent, exact scope), created if absent.

    ``known``: the caller has seen this default before, so it most likely
    exists: a plain SELECT first (the cheapest statement, no INSERT set up).
    Otherwise, on plain PostgreSQL, one statement (:func:`cortex._sql.sessions.resolve_default_statement`)
    finds the default or inserts it. Its snapshot cannot see a default
    another transaction committed while our INSERT waited on it, so that
    race returns nothing and the call runs again, on a new snapshot that
    does. On Citus, after the SELECT finds none, ``INSERT ... ON CONFLICT
    DO NOTHING`` against the partial unique index, then a *separate* SELECT,
    whose new snapshot (READ COMMITTED) sees such a winner. If the winner
    was deleted in between, the call runs again.
    """
    params = {
        TARGET_ID: new_uuid(),
        NEW_AGENT_ID: agent_id,
        **scope_columns(scope),
        **scope_params(scope),
    }
    lookup = {**scope_params(scope), NEW_AGENT_ID: agent_id}
    if known or distributed:
        row = (await conn.execute(sql.default_statement(), lookup)).first()
        if row is not None:
            return row_to_session(row)
    if not distributed:
        row = (await conn.execute(sql.resolve_default_statement(), params)).first()
        if row is None:
            raise RetryTransaction  # a concurrent winner committed after our snapshot
        return row_to_session(row)
    row = (await conn.execute(sql.resolve_default_insert_statement(distributed), params)).first()
    if row is None or distributed:  # on Citus the INSERT returned the id only
        row = (await conn.execute(sql.default_statement(), lookup)).first()
    if row is None:
        raise RetryTransaction
    return row_to_session(row)


async def lock_session_id(conn: Tx, scope: Scope, session_id: uuid.UUID) -> None:
    """Take the transaction-scoped advisory lock on (tenant, session id).

    Serialises what a row lock cannot, because the row may not exist yet: a
    create with a caller-chosen id against markers parked for that id.
    """
    await conn.execute(sql.lock_statement(), {LOCK_KEY: f"session {scope.tenant} {session_id}"})


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
    await conn.execute(sql.lock_statement(), {LOCK_KEY: key})
    demote, promote = sql.switch_statements(depth_class(scope))
    params = {
        **scope_params(scope),
        TARGET_PATH: str(target.scope),
        TARGET_AGENT_ID: target.agent_id,
        TARGET_ID: session_id,
    }
    await conn.execute(demote, params)
    writing = Writing(scope, session_id=session_id, agent_id=target.agent_id)
    with refusals(writing, [UQ_SESSIONS_DEFAULT], retry=[UQ_SESSIONS_DEFAULT]):
        row = (await conn.execute(promote, params)).one()
    return row_to_session(row)


# --- host-chosen keys -----------------------------------------------------------


async def select_by_key(conn: Tx, scope: Scope, agent_id: str, key: str) -> Session | None:
    """The session of ``agent_id`` keyed ``key`` at exactly ``scope``, if there is one."""
    params = {**scope_params(scope), NEW_AGENT_ID: agent_id, NEW_KEY: key}
    row = (await conn.execute(sql.by_key_statement(), params)).first()
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
        TARGET_ID: new_uuid(),
        NEW_AGENT_ID: agent_id,
        NEW_KEY: key,
        SCOPE_TENANT: scope.tenant,
        **scope_columns(scope),
    }
    # Most calls find their session: look first, so that costs one statement.
    found = await select_by_key(conn, scope, agent_id, key)
    if found is not None:
        return found
    row = (await conn.execute(sql.resolve_key_statement(distributed), params)).first()
    if row is not None and not distributed:  # on Citus the INSERT returned the id only
        return row_to_session(row)
    found = await select_by_key(conn, scope, agent_id, key)
    if found is None:
        raise RetryTransaction
    return found


# --- scope state --------------------------------------------------------------


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
        SCOPE_TENANT: scope.tenant,
        TARGET_ID: session_id,
        D_SCOPES: paths,
        D_DATA: [deltas[p] for p in paths],
    }
    with refusals(Writing(scope, session_id=session_id), [SCOPE_DATA_SIZE]):
        written = (await conn.execute(sql.scope_data_statement(), params)).all()
    if len(written) != len(paths):
        missed = sorted(set(paths) - {row["scope"] for row in written})
        raise InvalidInput(
            f"scope_data: {', '.join(missed)} is not the session's scope or an ancestor of it"
        )


async def select_scope_data(conn: Tx, scope: Scope, target: Scope) -> dict[str, Any]:
    """The state document stored at exactly ``target`` ({} if none), as Session.data shows state."""
    params = {SCOPE_TENANT: scope.tenant, TARGET_SCOPE: str(target)}
    row = (await conn.execute(sql.get_scope_data_statement(), params)).first()
    return {} if row is None else split_reserved(decode_data(row["data"]))[0]
