"""The statements of retention: policies, a run's candidates, its erase and trim batches.

Every statement names the tenant (``scope_tenant``) on every table it reads
or writes, so Citus routes it to the tenant's shard. A run's subtree is the
one bound under the ``scope`` key (the caller's scope); an erase batch
removes what an erasure's batch removes (cortex._sql.lifecycle.erased_rows).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cortex._sql.lifecycle import erase_ctes, erased_rows
from cortex._sql.params import (
    ANCESTORS,
    BATCH_IDS,
    CUTOFF,
    FIRST_SEQS,
    IDLE_BEFORE,
    LIMIT,
    MIN_KEEP,
    R_DELETE_IDLE_AFTER,
    R_INCLUDE_PAUSED,
    R_KEEP_LAST_MESSAGES,
    SCOPE_HI,
    SCOPE_LO,
    SCOPE_PATH,
    array_param,
    bool_param,
    int_param,
    scope_tenant_param,
    text_param,
)
from cortex._sql.predicates import ORDER, after_cursor, subtree_clause
from cortex._sql.tables import messages, pending_inputs, retention_policies, sessions

__all__ = [
    "CANDIDATE_COLUMNS",
    "POLICY_COLUMNS",
    "candidates_statement",
    "count_candidates_statement",
    "delete_policy_statement",
    "erase_counts_statement",
    "erase_statement",
    "nearest_policy_statement",
    "policies_statement",
    "select_erase_statement",
    "select_trim_statement",
    "set_policy_statement",
    "tenants_statement",
    "trim_statement",
]

_UUIDS: Final = UUID(as_uuid=True)
_TIMESTAMP: Final = sa.DateTime(timezone=True)

POLICY_COLUMNS: Final = (
    retention_policies.c.scope,
    retention_policies.c.delete_idle_after,
    retention_policies.c.keep_last_messages,
    retention_policies.c.include_paused,
)

CANDIDATE_COLUMNS: Final = (
    sessions.c.id,
    sessions.c.scope,
    sessions.c.updated_at,
    sessions.c.message_count,
    sessions.c.state,
)


def _tenant(table: sa.Table) -> sa.ColumnElement[bool]:
    return table.c.tenant_id == scope_tenant_param()


def _batch() -> sa.BindParameter[Any]:
    return array_param(BATCH_IDS, _UUIDS)


# --- policies -----------------------------------------------------------------------


@cache
def set_policy_statement() -> sa.Insert:
    """The policy of the scope bound under ``scope_path``, replacing the one there."""
    values = {
        "delete_idle_after": sa.bindparam(R_DELETE_IDLE_AFTER, type_=sa.Interval()),
        "keep_last_messages": int_param(R_KEEP_LAST_MESSAGES),
        "include_paused": bool_param(R_INCLUDE_PAUSED),
    }
    stmt = pg_insert(retention_policies).values(
        tenant_id=scope_tenant_param(), scope=text_param(SCOPE_PATH), **values
    )
    # The new row's default, not now(): Citus refuses a non-immutable function there.
    return stmt.on_conflict_do_update(
        index_elements=[retention_policies.c.tenant_id, retention_policies.c.scope],
        set_={**values, "updated_at": stmt.excluded.updated_at},
    )


@cache
def delete_policy_statement() -> sa.Delete:
    return sa.delete(retention_policies).where(
        _tenant(retention_policies), retention_policies.c.scope == text_param(SCOPE_PATH)
    )


@cache
def nearest_policy_statement() -> sa.Select[*tuple[Any, ...]]:
    """The policy of the deepest of the paths ``ancestors`` (a scope and those above it)."""
    return (
        sa.select(*POLICY_COLUMNS)
        .where(
            _tenant(retention_policies),
            retention_policies.c.scope == sa.any_(array_param(ANCESTORS, sa.Text())),
        )
        .order_by(sa.func.char_length(retention_policies.c.scope).desc())
        .limit(sa.literal_column("1"))
    )


@cache
def policies_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """Every policy that can govern a session of the subtree: above it (``ancestors``) or in it."""
    where = [_tenant(retention_policies)]
    if depth > 1:
        scope = retention_policies.c.scope
        where.append(
            sa.or_(
                scope == sa.any_(array_param(ANCESTORS, sa.Text())),
                scope == text_param(SCOPE_PATH),
                sa.and_(scope >= text_param(SCOPE_LO), scope < text_param(SCOPE_HI)),
            )
        )
    return sa.select(*POLICY_COLUMNS).where(*where)


@cache
def tenants_statement() -> sa.Select[tuple[str]]:
    """The tenants that have a policy: every tenant's rows, so only for a role past row-level security."""
    return (
        sa.select(retention_policies.c.tenant_id)
        .distinct()
        .order_by(retention_policies.c.tenant_id)
    )


# --- a run's candidates --------------------------------------------------------------


def _candidate(idle: bool, trim: bool) -> sa.ColumnElement[bool]:
    """Idle since before ``idle_before``, or holding more than ``min_keep`` messages.

    The widest of the policies in force: each candidate's own policy decides.
    """
    idle_since = sessions.c.updated_at < sa.bindparam(IDLE_BEFORE, type_=_TIMESTAMP)
    over = sessions.c.message_count > int_param(MIN_KEEP)
    if idle and trim:
        return sa.or_(idle_since, over)
    return idle_since if idle else over


@cache
def candidates_statement(
    depth: int, idle: bool, trim: bool, cursor: bool
) -> sa.Select[*tuple[Any, ...]]:
    """A page of the subtree's candidates in listing order, after the keyset cursor.

    The listing order, so a page is one walk of the index that serves the
    subtree's depth; idle sessions alone are a range of it.
    """
    stmt = sa.select(*CANDIDATE_COLUMNS).where(subtree_clause(depth), _candidate(idle, trim))
    if cursor:
        stmt = stmt.where(after_cursor())
    return stmt.order_by(*ORDER).limit(int_param(LIMIT))


@cache
def count_candidates_statement(depth: int, idle: bool, trim: bool) -> sa.Select[Any]:
    return (
        sa.select(sa.func.count())
        .select_from(sessions)
        .where(subtree_clause(depth), _candidate(idle, trim))
    )


# --- erase batches --------------------------------------------------------------------


@cache
def select_erase_statement(lock: bool) -> sa.Select[*tuple[Any, ...]]:
    """Of the sessions ``batch_ids``, those still idle since before the cutoff, by id.

    Paused ones only with ``r_include_paused``; row-locked with ``lock``.
    Checked again under the lock: an append or update that committed since
    the page was read moved ``updated_at``, and that session stays.
    """
    stmt = (
        sa.select(sessions.c.id)
        .where(
            _tenant(sessions),
            sessions.c.id == sa.any_(_batch()),
            sessions.c.updated_at < sa.bindparam(CUTOFF, type_=_TIMESTAMP),
            sa.or_(bool_param(R_INCLUDE_PAUSED), sessions.c.state != sa.literal_column("'paused'")),
        )
        .order_by(sessions.c.id)
    )
    # In id order, so two runs locking overlapping batches queue, never deadlock.
    return stmt.with_for_update(of=sessions) if lock else stmt


@cache
def erase_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """Remove the sessions ``batch_ids`` (locked) as an erasure's batch does; how many rows of each."""
    ctes = erase_ctes(depth)
    counts = [
        sa.select(sa.func.count()).select_from(cte).scalar_subquery().label(name)
        for name, cte in ctes.items()
    ]
    return sa.select(*counts).add_cte(*ctes.values())


@cache
def erase_counts_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """What :func:`erase_statement` would remove, counted (a dry run)."""
    return sa.select(
        *(
            sa.select(sa.func.count())
            .select_from(table)
            .where(*where)
            .scalar_subquery()
            .label(name)
            for name, (table, where) in erased_rows(depth).items()
        )
    )


# --- trim batches ----------------------------------------------------------------------


@cache
def select_trim_statement(lock: bool) -> sa.Select[*tuple[Any, ...]]:
    """Of the sessions ``batch_ids``, those holding more than ``r_keep_last_messages``, by id.

    With the position of their oldest pending question (NULL: none), which
    the trim keeps with everything after it; row-locked with ``lock`` (an
    append or an answer then waits for the trim).
    """
    oldest_pending = (
        sa.select(sa.func.min(pending_inputs.c.raised_seq))
        .where(_tenant(pending_inputs), pending_inputs.c.session_id == sessions.c.id)
        .scalar_subquery()
    )
    stmt = (
        sa.select(
            sessions.c.id,
            sessions.c.trimmed_count,
            sessions.c.message_count,
            oldest_pending.label("oldest_pending"),
        )
        .where(
            _tenant(sessions),
            sessions.c.id == sa.any_(_batch()),
            sessions.c.message_count > int_param(R_KEEP_LAST_MESSAGES),
        )
        .order_by(sessions.c.id)
    )
    return stmt.with_for_update(of=sessions) if lock else stmt


@cache
def trim_statement() -> sa.Select[*tuple[Any, ...]]:
    """Each session ``batch_ids`` (locked) loses its messages before its ``first_seqs`` position.

    One statement: the rows and the counters (``trimmed_count`` becomes the
    position before the first kept message, ``message_count`` falls by the
    rows removed) commit together. ``updated_at`` and ``last_message`` stay:
    a trim is no activity, and the newest message is kept.
    """
    kept = (
        sa.func.unnest(_batch(), array_param(FIRST_SEQS, sa.Integer()))
        .table_valued(sa.column("id", _UUIDS), sa.column("first", sa.Integer()), name="kept")
        .render_derived()
    )
    targets = sa.select(kept.c.id, kept.c.first).cte("t")
    removed = (
        sa.delete(messages)
        .where(
            _tenant(messages),
            messages.c.session_id == targets.c.id,
            messages.c.seq < targets.c.first,
        )
        .returning(sa.literal_column("1"))
        .cte("d")
    )
    one: sa.ColumnClause[Any] = sa.literal_column("1")
    recounted = (
        sa.update(sessions)
        .where(_tenant(sessions), sessions.c.id == targets.c.id)
        .values(
            trimmed_count=targets.c.first - one,
            message_count=sessions.c.message_count
            - (targets.c.first - one - sessions.c.trimmed_count),
        )
        .returning(sa.literal_column("1"))
        .cte("u")
    )
    return sa.select(
        sa.select(sa.func.count()).select_from(removed).scalar_subquery().label("messages"),
        sa.select(sa.func.count()).select_from(recounted).scalar_subquery().label("sessions"),
    ).add_cte(targets, removed, recounted)
