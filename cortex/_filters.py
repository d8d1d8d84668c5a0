"""One WHERE clause for listing, counting and iterating sessions, and their order.

List, count and iter share :func:`session_predicate`; pagination is a separate
step (:func:`page`), so a count can never receive a limit or an offset by
construction. Every statement that touches ``sessions`` gets its tenant and
scope condition from :func:`visible`: there is no second place that writes it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypeVarTuple

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from cortex._tables import sessions
from cortex.models import ListFilter
from cortex.scope import SEPARATOR, Scope

__all__ = [
    "ORDER",
    "after_cursor",
    "agent_clause",
    "default_clause",
    "exact_clause",
    "page",
    "search_clause",
    "session_predicate",
    "subtree_clause",
    "visible",
]

_Ts = TypeVarTuple("_Ts")

# The listing order: newest activity first, id as the unique tie-breaker. Both
# keys descend, matching every listing index, so a page is one ordered scan.
ORDER = (sessions.c.updated_at.desc(), sessions.c.id.desc())

# The character just above "/" in byte order. In the "C" collation the paths
# strictly beneath p are exactly those in [p + "/", p + "0").
_AFTER_SEPARATOR = chr(ord(SEPARATOR) + 1)


def exact_clause(scope: Scope) -> ColumnElement[bool]:
    """Sessions stored at exactly ``scope``."""
    return sa.and_(sessions.c.tenant_id == scope.tenant, sessions.c.scope == str(scope))


def subtree_clause(scope: Scope) -> ColumnElement[bool]:
    """Sessions at ``scope`` or beneath it, matching whole segments only.

    Depth 1 is the whole tenant and depth 2 an equality on ``scope_l2``: both
    are served by an index ordered like the listing. Deeper subtrees are a byte
    range on the path, served by the exact-scope index: ``acme`` never matches
    ``acme-corp`` because the range starts at ``acme/``.
    """
    tenant = sessions.c.tenant_id == scope.tenant
    if scope.depth == 1:
        return tenant
    if scope.depth == 2:
        return sa.and_(tenant, sessions.c.scope_depth >= 2, sessions.c.scope_l2 == str(scope))
    path = str(scope)
    return sa.and_(
        tenant,
        sa.or_(
            sessions.c.scope == path,
            sa.and_(
                sessions.c.scope >= path + SEPARATOR,
                sessions.c.scope < path + _AFTER_SEPARATOR,
            ),
        ),
    )


def visible(scope: Scope) -> ColumnElement[bool]:
    """Sessions a caller bound to ``scope`` may see: its own scope and beneath."""
    return subtree_clause(scope)


def agent_clause(agent_id: str) -> ColumnElement[bool]:
    """Sessions of one agent."""
    return sessions.c.agent_id == agent_id


def default_clause() -> ColumnElement[bool]:
    """Default sessions only."""
    return sessions.c.is_default


def search_clause(term: str) -> ColumnElement[bool]:
    """Case-insensitive substring of title or last_message; wildcards taken literally.

    ``icontains(autoescape=True)`` escapes ``%``, ``_`` and the escape
    character itself and renders ``ILIKE '%' || :term || '%' ESCAPE '/'``,
    which the trigram GIN indexes serve.
    """
    return sa.or_(
        sessions.c.title.icontains(term, autoescape=True),
        sessions.c.last_message.icontains(term, autoescape=True),
    )


def session_predicate(scope: Scope, flt: ListFilter) -> ColumnElement[bool]:
    """The one WHERE clause list, count and iter share."""
    conditions = [exact_clause(scope) if flt.exact else subtree_clause(scope)]
    if flt.agent_id is not None:
        conditions.append(agent_clause(flt.agent_id))
    if flt.default_only:
        conditions.append(default_clause())
    if flt.search:
        conditions.append(search_clause(flt.search))
    return sa.and_(*conditions)


def after_cursor(updated_at: datetime, session_id: uuid.UUID) -> ColumnElement[bool]:
    """Rows after a keyset cursor in listing order.

    A row-value comparison, which the btree uses as a single index bound (an
    OR-expanded form would not be).
    """
    return sa.tuple_(sessions.c.updated_at, sessions.c.id) < sa.tuple_(
        sa.literal(updated_at, sessions.c.updated_at.type),
        sa.literal(session_id, sessions.c.id.type),
    )


def page(stmt: sa.Select[*_Ts], *, limit: int, offset: int = 0) -> sa.Select[*_Ts]:
    """Apply the listing order and a page to a select built on session_predicate."""
    stmt = stmt.order_by(*ORDER).limit(limit)
    return stmt.offset(offset) if offset else stmt
