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

import uuid
from datetime import datetime
from functools import cache
from typing import Any, Final, NamedTuple, TypeVarTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.sql.elements import ColumnElement

from cortex._sql.params import (
    AFTER_ID,
    AFTER_UPDATED_AT,
    AGENT_ID,
    LIMIT,
    OFFSET,
    SCOPE,
    SCOPE_HI,
    SCOPE_LO,
    SCOPE_PATH,
    SEARCH_IDS,
    SEARCH_PATTERN,
    int_param,
    scope_tenant_param,
    text_param,
    uuid_param,
)
from cortex._sql.tables import sessions
from cortex.models import ListFilter, SessionState
from cortex.scope import SEPARATOR, Scope

__all__ = [
    "ORDER",
    "FilterShape",
    "after_cursor",
    "depth_class",
    "escape_like",
    "exact_clause",
    "filter_params",
    "filter_shape",
    "page",
    "path_clause",
    "scope_params",
    "search_clause",
    "searches_tenant",
    "session_predicate",
    "subtree_clause",
    "tenant_search_statement",
    "visible",
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
    )


def filter_params(scope: Scope, flt: ListFilter) -> dict[str, Any]:
    """Bind values for :func:`session_predicate`."""
    params = scope_params(scope)
    if flt.agent_id is not None:
        params[AGENT_ID] = flt.agent_id
    if flt.search:
        params[SEARCH_PATTERN] = escape_like(flt.search)
    return params


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
