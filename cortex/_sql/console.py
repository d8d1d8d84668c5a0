"""The operator console's statements: waiting sessions across tenants, and the audit trail.

The listing runs as the role ``cortex_console`` (revision 20261205000025),
whose policies show only rows at or beneath the operator scope bound in the
transaction; each statement also carries that scope itself, so a statement
is never wider than its policy. Pages are keyset pages in the order of
``ix_sessions_console_recent`` (no OFFSET). The audit row is inserted by the
application role, bound to its tenant like every other write.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from cortex._sql.params import (
    ACTION,
    ACTION_ID,
    AFTER_AT,
    AFTER_ID,
    AFTER_TENANT,
    AFTER_UPDATED_AT,
    C_AGENT_ID,
    C_SEARCH,
    C_TENANT,
    DETAIL,
    LIMIT,
    OUTCOME,
    SCOPE_PATH,
    SESSION_ID,
    SUBJECT,
    int_param,
    scope_tenant_param,
    text_param,
    uuid_param,
)
from cortex._sql.predicates import LIKE_ESCAPE, path_clause
from cortex._sql.tables import console_actions, pending_inputs, session_markers, sessions

__all__ = [
    "OPERATOR_SETTING",
    "PREVIEW_CHARS",
    "ROLE_STATEMENT",
    "SEARCH_PATH",
    "actions_statement",
    "bind_statement",
    "insert_action_statement",
    "session_scope_statement",
    "waiting_statement",
]

# The transaction-local setting the console's policies compare scopes with.
OPERATOR_SETTING: Final = "cortex.operator_scope"
# Characters of a question a listing row shows; the whole question is the session's.
PREVIEW_CHARS: Final = 200
# Where each kind of operator scope is: every tenant, one tenant, or beneath a tenant.
ALL: Final = 0
TENANT: Final = 1
SUBTREE: Final = 2


# SET LOCAL ROLE: the transaction holds exactly the console's rights and
# policies, whatever else the login may be a member of.
ROLE_STATEMENT: Final = "SET LOCAL ROLE cortex_console"


# The search path of the console's transactions: pg_catalog first, then the
# schema cortex's tables live in, pg_temp last. Under ROLE cortex_console the
# login's path would put "$user" (a schema named cortex_console, which anyone
# allowed to create schemas may make) ahead of public.
SEARCH_PATH: Final = "pg_catalog, public, pg_temp"


def bind_statement() -> sa.Select[Any]:
    """The operator scope (a path ending in ``/``, or ``/``) and the search path, for the transaction."""
    return sa.select(
        sa.func.pg_catalog.set_config(
            sa.literal_column(f"'{OPERATOR_SETTING}'"), text_param(SCOPE_PATH), sa.true()
        ),
        sa.func.pg_catalog.set_config(
            sa.literal_column("'search_path'"),
            sa.literal_column(f"'{SEARCH_PATH}'"),
            sa.true(),
        ),
    )


def _where_scope(tenant: sa.ColumnElement[str], scope: sa.ColumnElement[str], kind: int) -> Any:
    if kind == ALL:
        return sa.true()
    return path_clause(tenant, scope, 1 if kind == TENANT else 2)


@cache
def waiting_statement(
    state: str, kind: int, *, tenant: bool, agent: bool, search: bool, after: bool
) -> sa.Select[Any]:
    """One page of sessions in ``state`` (not idle), newest first, with what each waits on.

    ``state`` is SQL text, not a bind: a constant proves the partial index's
    ``state <> 'idle'``. A paused session shows its oldest open question; an
    interrupted or aborted one its marker's reason; ``since`` is when either
    was written.
    """
    paused = state == "paused"
    # What the session waits on: a paused one's oldest question, else its
    # marker. LIMIT 1 keeps each a per-row index probe (the planner would
    # otherwise join every marker of the database and filter).
    if paused:
        waits = (
            sa.select(
                sa.func.pg_catalog.left(pending_inputs.c.message, PREVIEW_CHARS).label("question"),
                pending_inputs.c.interrupt_id,
                pending_inputs.c.raised_at.label("since"),
                sa.null().label("reason"),
            )
            .where(
                pending_inputs.c.tenant_id == sessions.c.tenant_id,
                pending_inputs.c.session_id == sessions.c.id,
            )
            .order_by(pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id)
        )
    else:
        waits = sa.select(
            sa.null().label("question"),
            sa.null().label("interrupt_id"),
            session_markers.c.marked_at.label("since"),
            session_markers.c.reason,
        ).where(
            session_markers.c.tenant_id == sessions.c.tenant_id,
            session_markers.c.session_id == sessions.c.id,
            session_markers.c.kind
            == sa.literal_column("'aborted'" if state == "aborted" else "'interrupted'"),
        )
    waiting = waits.limit(1).lateral("waits")
    conditions: list[Any] = [
        sessions.c.state == sa.literal_column(f"'{state}'"),
        _where_scope(sessions.c.tenant_id, sessions.c.scope, kind),
    ]
    if tenant:
        conditions.append(sessions.c.tenant_id == text_param(C_TENANT))
    if agent:
        conditions.append(sessions.c.agent_id == text_param(C_AGENT_ID))
    if search:
        conditions.append(sessions.c.title.ilike(text_param(C_SEARCH), escape=LIKE_ESCAPE))
    if after:
        conditions.append(
            sa.tuple_(sessions.c.updated_at, sessions.c.id, sessions.c.tenant_id)
            < sa.tuple_(
                sa.bindparam(AFTER_UPDATED_AT, type_=sa.DateTime(timezone=True)),
                uuid_param(AFTER_ID),
                text_param(AFTER_TENANT),
            )
        )
    return (
        sa.select(
            sessions.c.tenant_id,
            sessions.c.scope,
            sessions.c.id,
            sessions.c.agent_id,
            sessions.c.title,
            sessions.c.state,
            sessions.c.updated_at,
            waiting.c.question,
            waiting.c.interrupt_id,
            waiting.c.since,
            waiting.c.reason,
        )
        .select_from(sessions.outerjoin(waiting, sa.true()))
        .where(*conditions)
        .order_by(sessions.c.updated_at.desc(), sessions.c.id.desc(), sessions.c.tenant_id.desc())
        .limit(int_param(LIMIT))
    )


@cache
def session_scope_statement(kind: int) -> sa.Select[Any]:
    """The scope of one session of one tenant, when it is at or beneath the operator scope."""
    return sa.select(sessions.c.scope).where(
        sessions.c.tenant_id == text_param(C_TENANT),
        sessions.c.id == uuid_param(SESSION_ID),
        _where_scope(sessions.c.tenant_id, sessions.c.scope, kind),
    )


@cache
def actions_statement(kind: int, *, tenant: bool, session: bool, after: bool) -> sa.Select[Any]:
    """One page of audit rows at or beneath the scope (of one tenant, of one session), newest first.

    A session is named by its tenant and id together: ids are unique within a tenant only.
    """
    conditions: list[Any] = [
        _where_scope(console_actions.c.tenant_id, console_actions.c.scope, kind)
    ]
    if tenant:
        conditions.append(console_actions.c.tenant_id == text_param(C_TENANT))
    if session:
        conditions.append(console_actions.c.session_id == uuid_param(SESSION_ID))
    if after:
        conditions.append(
            sa.tuple_(console_actions.c.at, console_actions.c.id, console_actions.c.tenant_id)
            < sa.tuple_(
                sa.bindparam(AFTER_AT, type_=sa.DateTime(timezone=True)),
                uuid_param(AFTER_ID),
                text_param(AFTER_TENANT),
            )
        )
    return (
        sa.select(
            console_actions.c.tenant_id,
            console_actions.c.id,
            console_actions.c.scope,
            console_actions.c.session_id,
            console_actions.c.subject,
            console_actions.c.action,
            console_actions.c.outcome,
            sa.cast(console_actions.c.detail, sa.Text()).label("detail"),
            console_actions.c.at,
        )
        .where(*conditions)
        .order_by(
            console_actions.c.at.desc(),
            console_actions.c.id.desc(),
            console_actions.c.tenant_id.desc(),
        )
        .limit(int_param(LIMIT))
    )


@cache
def insert_action_statement() -> sa.Insert:
    """One audit row in the bound tenant; ``at`` is the database's clock (returned)."""
    return (
        sa.insert(console_actions)
        .returning(console_actions.c.at)
        .values(
            tenant_id=scope_tenant_param(),
            id=uuid_param(ACTION_ID),
            scope=text_param(SCOPE_PATH),
            session_id=uuid_param(SESSION_ID),
            subject=text_param(SUBJECT),
            action=text_param(ACTION),
            outcome=text_param(OUTCOME),
            detail=sa.cast(text_param(DETAIL), JSONB()),
            at=sa.func.pg_catalog.statement_timestamp(),
        )
    )
