"""One WHERE clause for listing, counting and iterating sessions, and their order.

List, count and iter share :func:`session_predicate`; pagination is a separate
step (:func:`page`), so a count can never receive a limit or an offset by
construction. Every statement that touches ``sessions`` gets its tenant and
scope condition from :func:`visible` or :func:`exact_clause`: there is no
second place that writes it.

Clauses are built from named bind parameters, never from values, so each
statement *shape* is built and compiled once and then reused with new
parameters (:func:`scope_params`, :func:`filter_params`). Building a Core
statement per call cost more CPU than the database spent running it.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Final, NamedTuple, TypeVarTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB, UUID
from sqlalchemy.sql.elements import ColumnElement

from cortex._sql.params import (
    AFTER_ID,
    AFTER_UPDATED_AT,
    AGENT_ID,
    CREATED_AFTER,
    CREATED_BEFORE,
    LIMIT,
    METADATA_BEFORE,
    METADATA_CAP,
    METADATA_FILTER,
    METADATA_IDS,
    METADATA_KEY,
    METADATA_NEWEST,
    METADATA_SINCE,
    METADATA_VALUE,
    OFFSET,
    SCOPE,
    SCOPE_HI,
    SCOPE_LO,
    SCOPE_PATH,
    SEARCH_IDS,
    SEARCH_PATTERN,
    UPDATED_AFTER,
    UPDATED_BEFORE,
    int_param,
    row_name,
    scope_tenant_param,
    text_param,
    uuid_param,
)
from cortex._sql.tables import metadata_pairs, sessions
from cortex.models import ListFilter, SessionState
from cortex.scope import SEPARATOR, Scope

__all__ = [
    "METADATA_CANDIDATES",
    "METADATA_COUNT_CANDIDATES",
    "METADATA_HOUR",
    "ORDER",
    "FilterShape",
    "after_cursor",
    "depth_class",
    "escape_like",
    "exact_clause",
    "filter_params",
    "filter_shape",
    "hour_of",
    "hour_start",
    "metadata_candidate_params",
    "metadata_candidates_statement",
    "metadata_clause",
    "page",
    "path_clause",
    "scope_params",
    "search_clause",
    "searches_tenant",
    "session_predicate",
    "subtree_clause",
    "tenant_search_statement",
    "too_many_candidates",
    "uses_metadata_candidates",
    "visible",
    "with_candidates",
]

_Ts = TypeVarTuple("_Ts")

# The listing order: newest activity first, id as the unique tie-breaker. Both
# keys descend, matching every listing index, so a page is one ordered scan.
ORDER: Final = (sessions.c.updated_at.desc(), sessions.c.id.desc())

# The character just above "/" in byte order. In the "C" collation the paths
# strictly beneath p are exactly those in [p + "/", p + "0").
_AFTER_SEPARATOR: Final = chr(ord(SEPARATOR) + 1)
LIKE_ESCAPE: Final = "/"


def depth_class(scope: Scope) -> int:
    """Which subtree predicate serves ``scope``: 1 (tenant), 2 (scope_l2), 3 (scope_l3), 4 (range)."""
    return min(scope.depth, 4)


def scope_params(scope: Scope, key: str = SCOPE) -> dict[str, Any]:
    """Bind values for the clauses built with the same ``key``."""
    path = str(scope)
    return {
        f"{key}_tenant": scope.tenant,
        f"{key}_path": path,
        f"{key}_lo": path + SEPARATOR,
        f"{key}_hi": path + _AFTER_SEPARATOR,
    }


def exact_clause(key: str = SCOPE) -> ColumnElement[bool]:
    """Sessions stored at exactly the scope bound under ``key``."""
    return sa.and_(
        sessions.c.tenant_id == text_param(f"{key}_tenant"),
        sessions.c.scope == text_param(f"{key}_path"),
    )


def subtree_clause(depth: int, key: str = SCOPE) -> ColumnElement[bool]:
    """Sessions at the scope bound under ``key`` or beneath it, by whole segments.

    ``depth`` is :func:`depth_class` of that scope. Depth 1 is the whole
    tenant, depth 2 an equality on ``scope_l2`` and depth 3 (a user, in the
    usual ``tenant/team/user`` layout) an equality on ``scope_l3``: each is
    served by an index ordered like the listing, so a page reads only its
    rows. Deeper subtrees are a byte range on the path, served by the
    exact-scope index: ``acme/a/b/c`` never matches ``acme/a/b/c-d`` because
    the range starts at ``acme/a/b/c/``.
    """
    tenant = sessions.c.tenant_id == text_param(f"{key}_tenant")
    if depth == 1:
        return tenant
    if depth in (2, 3):
        # The depth is SQL text, not a parameter: a generic plan can prove the
        # partial index's predicate (scope_depth >= 2 or 3) only from a constant.
        prefix = sessions.c.scope_l2 if depth == 2 else sessions.c.scope_l3
        return sa.and_(
            tenant,
            sessions.c.scope_depth >= sa.literal_column(str(depth)),
            prefix == text_param(f"{key}_path"),
        )
    return sa.and_(
        tenant,
        sa.or_(
            sessions.c.scope == text_param(f"{key}_path"),
            sa.and_(
                sessions.c.scope >= text_param(f"{key}_lo"),
                sessions.c.scope < text_param(f"{key}_hi"),
            ),
        ),
    )


def visible(depth: int) -> ColumnElement[bool]:
    """Sessions a caller bound to the scope may see: its own scope and beneath."""
    return subtree_clause(depth)


def escape_like(term: str) -> str:
    """``%term%`` for ILIKE ... ESCAPE '/', with ``%``, ``_`` and ``/`` taken literally."""
    escaped = (
        term.replace(LIKE_ESCAPE, LIKE_ESCAPE * 2)
        .replace("%", LIKE_ESCAPE + "%")
        .replace("_", LIKE_ESCAPE + "_")
    )
    return f"%{escaped}%"


class FilterShape(NamedTuple):
    """What a listing's SQL depends on; the values travel as parameters."""

    depth: int
    exact: bool
    agent: bool
    default_only: bool
    search: bool
    # The state itself, not a flag: it is rendered as a constant (see session_predicate).
    state: SessionState | None
    # The tables are distributed (Citus): see search_clause.
    distributed: bool = False
    # How many metadata keys the filter names (see metadata_clause).
    metadata: int = 0
    # Which time bounds the filter sets (exclusive; see session_predicate).
    created_after: bool = False
    created_before: bool = False
    updated_after: bool = False
    updated_before: bool = False
    # The metadata filter's candidates are bound as ``metadata_ids`` (see
    # uses_metadata_candidates); set once they are found, never by filter_shape.
    candidates: bool = False
    # They are a window's: the matches updated since ``metadata_since`` (see
    # metadata_candidates_statement); set with candidates.
    window: bool = False


def filter_shape(scope: Scope, flt: ListFilter, *, distributed: bool = False) -> FilterShape:
    """The statement shape for a scope and filter (on a distributed database or not)."""
    return FilterShape(
        depth_class(scope),
        flt.exact,
        flt.agent_id is not None,
        flt.default_only,
        bool(flt.search),
        flt.state,
        distributed,
        len(flt.metadata_pairs),
        flt.created_after is not None,
        flt.created_before is not None,
        flt.updated_after is not None,
        flt.updated_before is not None,
    )


# The time bounds: the bind each is named by, the column it bounds, and its side.
_BOUNDS: Final = (
    (CREATED_AFTER, sessions.c.created_at, True),
    (CREATED_BEFORE, sessions.c.created_at, False),
    (UPDATED_AFTER, sessions.c.updated_at, True),
    (UPDATED_BEFORE, sessions.c.updated_at, False),
)


def filter_params(scope: Scope, flt: ListFilter) -> dict[str, Any]:
    """Bind values for :func:`session_predicate`."""
    params = scope_params(scope)
    if flt.agent_id is not None:
        params[AGENT_ID] = flt.agent_id
    if flt.search:
        params[SEARCH_PATTERN] = escape_like(flt.search)
    for i, (key, value) in enumerate(flt.metadata_pairs):
        params[row_name(METADATA_KEY, i)] = key
        params[row_name(METADATA_VALUE, i)] = value
    bounds = (flt.created_after, flt.created_before, flt.updated_after, flt.updated_before)
    for (name, _, _), bound in zip(_BOUNDS, bounds, strict=True):
        if bound is not None:
            params[name] = bound
    return params


def metadata_clause(i: int) -> ColumnElement[bool]:
    """The session's metadata holds key ``metadata_key_<i>`` with the JSON value ``metadata_value_<i>``.

    jsonb equality, so values compare as JSON (objects whatever their key
    order, numbers by value, ``true`` never ``1``), and a missing key gives
    NULL, which equals nothing, not even ``null``. Equality per key, never
    containment (``@>``), which would let ``[1, 2]`` match ``[1]``. The
    metadata is read as the session shows it (cortex._sql.sessions.METADATA_TEXT):
    the verbatim ``json`` column, else a legacy row's ``jsonb``; only the
    key's value is converted to jsonb, cheaper than converting the whole
    document on every row a page reads (docs/benchmarks.md, 2026-12-02).
    """
    key = text_param(row_name(METADATA_KEY, i))
    stored = sa.case(
        (
            sessions.c.metadata_json.is_(None),
            sessions.c.metadata.op("->", return_type=JSONB())(key),
        ),
        else_=sa.cast(sessions.c.metadata_json.op("->", return_type=JSONB())(key), JSONB()),
    )
    return stored == sa.cast(text_param(row_name(METADATA_VALUE, i)), JSONB())


# At most this many candidates are bound for a page: each is a row read at
# a random place in the heap, where the listing walk reads rows in order, so
# a filter with more in the hours a page needs is checked on the walk instead
# (docs/benchmarks.md).
METADATA_CANDIDATES: Final = 1000
# For a count, which otherwise reads every row of the subtree.
METADATA_COUNT_CANDIDATES: Final = 100_000
# The width of a metadata_pairs row's hour, as metadata_pairs.hour counts it.
METADATA_HOUR: Final = timedelta(hours=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_DAY: Final = datetime(9999, 12, 31, tzinfo=UTC)


def hour_of(moment: datetime) -> int:
    """Whole hours since the epoch, exactly as revision 20261205000026 computes ``hour``."""
    return (moment - _EPOCH) // METADATA_HOUR


def hour_start(hour: int) -> datetime:
    """The first instant of ``hour`` (the inverse of :func:`hour_of` on whole hours).

    PostgreSQL's times reach further than Python's (a session updated in
    the year 20000, by raw SQL). Past the last year Python holds, the start
    of that year's last day: a window's start only bounds it from below, and
    an earlier one admits more candidates, each checked exactly. Not
    ``datetime.max``, which asyncpg sends as ``infinity``.
    """
    try:
        return _EPOCH + hour * METADATA_HOUR
    except OverflowError:
        return _LAST_DAY if hour > 0 else datetime.min.replace(tzinfo=UTC)


# A window holding more than this many times the matches a page needs (and
# more than the floor) is left to the walk.
_DENSE: Final = 4
_DENSE_FLOOR: Final = 200


def too_many_candidates(found: int, *, wanted: int, cap: int) -> bool:
    """Whether a window's ``found`` candidates are better walked than read one by one.

    More than ``cap``; or many more than the ``wanted`` matches a page needs:
    the value is common in those hours, and the listing walk finds a page in
    fewer rows than the window holds.
    """
    return found > min(cap, max(_DENSE * wanted, _DENSE_FLOOR))


def uses_metadata_candidates(shape: FilterShape) -> bool:
    """Whether a metadata filter looks up its candidates first (a whole tenant's listing).

    A subtree is walked: the candidates are the tenant's, and a page of a
    subtree would need as many more of them as the tenant holds sessions
    beside the subtree's. On Citus, where no trigger keeps
    ``metadata_pairs``, the walk always checks the filter.
    """
    return shape.metadata > 0 and not shape.exact and shape.depth == 1 and not shape.distributed


def with_candidates(shape: FilterShape, *, window: bool) -> FilterShape:
    """``shape`` with its metadata filter's candidates bound (its last two fields)."""
    return FilterShape(*shape[:-2], candidates=True, window=window)


def metadata_candidate_params(
    scope: Scope, flt: ListFilter, *, skip: int, cap: int, before: datetime | None = None
) -> dict[str, Any]:
    """Bind values for :func:`metadata_candidates_statement`.

    The tenant, the filter as one JSON object, the matches to pass over
    before the window's last hour (``skip``), one more candidate than
    ``cap`` (so that more than ``cap`` can be told), and the latest hour
    (of ``before``) when there is one.
    """
    pairs = ",".join(
        f"{json.dumps(key, ensure_ascii=False)}:{value}" for key, value in flt.metadata_pairs
    )
    given: dict[str, Any] = {
        scope_tenant_param().key: scope.tenant,
        METADATA_FILTER: "{" + pairs + "}",
        METADATA_NEWEST: skip + 1,
        METADATA_CAP: cap + 1,
    }
    if before is not None:
        given[METADATA_BEFORE] = hour_of(before)
    return given


@cache
def metadata_candidates_statement(
    keys: int, *, before: bool
) -> sa.Select[tuple[int | None, list[uuid.UUID] | None]]:
    """The bound tenant's sessions whose metadata may match, newest hours first (revision …26).

    Two columns: the hour of the ``metadata_newest``-th newest match (NULL
    when no match is older than that hour), and the sessions with a match
    in that hour or a later one (at most ``metadata_cap``). Every session
    updated since the start of that hour whose metadata matches is among
    them, since ``metadata_pairs`` holds each session's pairs at its
    current hour; a row of a session that has moved on only adds a
    candidate. ``keys`` is the filter's number of keys: every key's row of
    the same session and hour must be there. More than ``metadata_cap - 1``
    ids: too many to read one by one (the caller walks instead). With ``before``, hours after
    ``metadata_before`` are passed over (a cursor's, or a bound's).
    A statement of its own, read as the application role under the table's
    row-level security; the listing checks every key exactly on the ids.
    """
    hashes = sa.select(
        sa.func.public.cortex_metadata_pairs(
            _exact_text(scope_tenant_param()),
            sa.cast(sa.null(), JSON()),
            sa.cast(text_param(METADATA_FILTER), JSONB()),
            type_=ARRAY(sa.BigInteger()),
        ).label("p")
    ).cte("hashes")

    def pair(i: int) -> ColumnElement[int]:
        return sa.select(hashes.c.p[i + 1]).scalar_subquery()

    rows = [metadata_pairs.alias(f"m{i}") for i in range(keys)]
    first = rows[0]
    joined: sa.FromClause = first
    # Every other key's row of the same session and hour: one probe of the
    # primary key per row of the first key's. OFFSET keeps the planner from
    # turning it into a join, which merged whole hours of a common key's rows.
    others = [
        sa.exists(
            sa.select(sa.literal(1))
            .where(
                row.c.tenant_id == first.c.tenant_id,
                row.c.pair == pair(i),
                row.c.hour == first.c.hour,
                row.c.session_id == first.c.session_id,
            )
            .offset(0)
        )
        for i, row in enumerate(rows[1:], start=1)
    ]
    where = [first.c.tenant_id == scope_tenant_param(), first.c.pair == pair(0), *others]
    if before:
        where.append(first.c.hour <= sa.bindparam(METADATA_BEFORE, type_=sa.BigInteger()))
    newest = (
        sa.select(first.c.hour)
        .select_from(joined)
        .where(*where)
        .order_by(first.c.hour.desc())
        .limit(int_param(METADATA_NEWEST))
        .subquery("newest")
    )
    # The oldest hour of the newest matches, read once (a CTE) and an index
    # condition of the reads below (NULL when nothing matches).
    edges = sa.select(sa.func.min(newest.c.hour).label("hour")).cte("edge")
    edge = sa.select(edges.c.hour).scalar_subquery()
    older = sa.select(first.c.hour).select_from(joined).where(*where, first.c.hour < edge)
    since = sa.case((sa.exists(older), edge))
    found = (
        sa.select(first.c.session_id)
        .select_from(joined)
        .where(*where, first.c.hour >= edge)
        .limit(int_param(METADATA_CAP))
        .subquery("found")
    )
    ids = sa.select(sa.func.array_agg(found.c.session_id, type_=_UUIDS)).scalar_subquery()
    return sa.select(since.label("since_hour"), ids.label("ids"))


def search_clause(shape: FilterShape) -> ColumnElement[bool]:
    """Title or preview contains the term (``search_pattern``), case-insensitively.

    Across a whole tenant the candidates come from a ``SECURITY DEFINER``
    function: under row-level security PostgreSQL will not run the
    non-leakproof ILIKE inside the trigram indexes, but such a function can,
    for the bound tenant only. On plain PostgreSQL that is
    ``cortex_search_ids()`` (revision 20261015000007) inside the statement.
    On Citus a function that reads a distributed table cannot run inside a
    query routed to a shard, so the ids come first, from their own statement
    (:func:`tenant_search_statement`), and bind as ``search_ids``.

    Inside a narrower scope the term filters the listing walk instead, which
    stops after a page and never reads the tenant's matches.
    """
    pattern = text_param(SEARCH_PATTERN)
    matches = sa.or_(
        sessions.c.title.ilike(pattern, escape=LIKE_ESCAPE),
        sessions.c.last_message.ilike(pattern, escape=LIKE_ESCAPE),
    )
    if searches_tenant(shape):
        if shape.distributed:
            # The candidates came from an earlier snapshot: a row whose title
            # or preview changed since is checked again here, on the few rows
            # the ids fetch (test_search_race.py lists stale matches without it).
            candidate = sessions.c.id == sa.any_(sa.bindparam(SEARCH_IDS, type_=_UUIDS))
            return sa.and_(candidate, matches)
        ids = sa.func.public.cortex_search_ids(_exact_text(pattern), type_=UUID(as_uuid=True))
        return sessions.c.id.in_(sa.select(ids))
    return matches


_UUIDS: Final = ARRAY(UUID(as_uuid=True))


def _exact_text(value: ColumnElement[Any]) -> ColumnElement[Any]:
    """``value`` as ``text``, the exact type of cortex's search functions' arguments.

    A bind is sent as varchar: a function planted with a varchar signature
    would be an exact match and win over cortex's own.
    """
    return sa.cast(value, sa.Text())


def searches_tenant(shape: FilterShape) -> bool:
    """Whether the shape searches a whole tenant (candidates from the trigram indexes)."""
    return shape.search and shape.depth == 1 and not shape.exact


@cache
def tenant_search_statement() -> sa.Select[tuple[list[uuid.UUID]]]:
    """The bound tenant's sessions whose title or preview match, as one array (revision …12).

    Its own statement: on Citus the function's query is a router query to
    the tenant's shard, served by the shard's trigram indexes.
    """
    return sa.select(
        sa.func.public.cortex_tenant_search(
            _exact_text(scope_tenant_param()), _exact_text(text_param(SEARCH_PATTERN)), type_=_UUIDS
        )
    )


def session_predicate(shape: FilterShape) -> ColumnElement[bool]:
    """The one WHERE clause list, count and iter share.

    Search is ``ILIKE :pattern ESCAPE '/'`` on title or last_message, served
    by the trigram GIN indexes and always ANDed with the scope predicate.
    """
    conditions = [exact_clause() if shape.exact else subtree_clause(shape.depth)]
    if shape.agent:
        conditions.append(sessions.c.agent_id == text_param(AGENT_ID))
    if shape.default_only:
        conditions.append(sessions.c.is_default)
    if shape.search:
        conditions.append(search_clause(shape))
    if shape.state is not None:
        # A constant, not a parameter, so that even a generic plan can use the
        # partial ix_sessions_state_recent (WHERE state <> 'idle') for the few
        # non-idle sessions; 'idle' is most sessions, which the listing
        # indexes serve as a filter. Enum values only: nothing to escape.
        conditions.append(sessions.c.state == sa.literal_column(f"'{shape.state.value}'"))
    if shape.candidates:
        conditions.append(sessions.c.id == sa.any_(sa.bindparam(METADATA_IDS, type_=_UUIDS)))
    if shape.window:
        # The window the candidates cover: every match updated since is among them.
        since = sa.bindparam(METADATA_SINCE, type_=sa.DateTime(timezone=True))
        conditions.append(sessions.c.updated_at >= since)
    conditions.extend(metadata_clause(i) for i in range(shape.metadata))
    # Exclusive bounds; an updated_at bound is an index condition of every
    # listing index, whose order is updated_at's.
    wanted = (shape.created_after, shape.created_before, shape.updated_after, shape.updated_before)
    for (name, column, after), on in zip(_BOUNDS, wanted, strict=True):
        if on:
            bound = sa.bindparam(name, type_=sa.DateTime(timezone=True))
            conditions.append(column > bound if after else column < bound)
    return sa.and_(*conditions)


def path_clause(
    tenant: sa.ColumnElement[str], scope: sa.ColumnElement[str], depth: int
) -> ColumnElement[bool]:
    """The visibility predicate for a table keyed by (tenant, exact scope path) only.

    Same semantics as :func:`subtree_clause`, for tables without ``scope_l2``
    (session_markers): the scope bound under ``scope_*`` and everything beneath.
    """
    same_tenant = tenant == scope_tenant_param()
    if depth == 1:
        return same_tenant
    return sa.and_(
        same_tenant,
        sa.or_(
            scope == text_param(SCOPE_PATH),
            sa.and_(scope >= text_param(SCOPE_LO), scope < text_param(SCOPE_HI)),
        ),
    )


def after_cursor() -> ColumnElement[bool]:
    """Rows after the keyset cursor (``after_updated_at``, ``after_id``) in listing order.

    A row-value comparison, which the btree uses as a single index bound (an
    OR-expanded form would not be).
    """
    return sa.tuple_(sessions.c.updated_at, sessions.c.id) < sa.tuple_(
        sa.bindparam(AFTER_UPDATED_AT, type_=sa.DateTime(timezone=True)),
        uuid_param(AFTER_ID),
    )


def cursor_params(updated_at: datetime, session_id: uuid.UUID) -> dict[str, Any]:
    """Bind values for :func:`after_cursor`."""
    return {AFTER_UPDATED_AT: updated_at, AFTER_ID: session_id}


def page(stmt: sa.Select[*_Ts], *, offset: bool) -> sa.Select[*_Ts]:
    """Apply the listing order and a ``:limit`` (and ``:offset``) page to a select."""
    stmt = stmt.order_by(*ORDER).limit(int_param(LIMIT))
    return stmt.offset(int_param(OFFSET)) if offset else stmt
