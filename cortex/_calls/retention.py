"""Calls of retention: a scope's policy, and a run's pages and batches.

Each function is the body of one transaction (cortex._db.transaction.run_transaction);
:meth:`cortex.Store.apply_retention` runs them one after another, so no
statement holds its locks for more than one batch. A run reads the
policies that can govern its subtree once (:func:`load_policies`), walks
its candidates in keyset pages (:func:`candidates`), and hands each page's
sessions to :func:`erase_batch` and :func:`trim_batch` grouped by the
policy that governs them. Each batch checks its sessions again under their
row locks, so what another run or an append changed meanwhile is never
removed twice, nor wrongly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from cortex._db.executor import Row, Tx
from cortex._sql import lifecycle as lifecycle_sql
from cortex._sql import retention as sql
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
)
from cortex._sql.predicates import cursor_params, depth_class, scope_params
from cortex.errors import DatabaseError
from cortex.models import INT4_MAX, RetentionPolicy
from cortex.scope import Scope

__all__ = [
    "BATCH_MESSAGES",
    "BATCH_SESSIONS",
    "PAGE_SESSIONS",
    "Candidate",
    "Plan",
    "Policies",
    "Removed",
    "candidates",
    "clock",
    "count_candidates",
    "erase_batch",
    "get_policy",
    "load_policies",
    "set_policy",
    "trim_batch",
]

# A page of candidates, and the most one batch locks: as an erasure's
# batches (cortex._calls.erasure), a statement's locks last milliseconds
# whatever the subtree's size (docs/benchmarks.md).
PAGE_SESSIONS: Final = 500
BATCH_SESSIONS: Final = 500
BATCH_MESSAGES: Final = 10_000
# Before any session: the bound of an idle test no policy asks for.
_NEVER: Final = datetime(1, 1, 2, tzinfo=UTC)


def _ancestors(scope: Scope, *, inclusive: bool) -> list[str]:
    top = scope.depth if inclusive else scope.depth - 1
    return [scope.prefix(depth) for depth in range(1, top + 1)]


def _policy(row: Row) -> RetentionPolicy:
    return RetentionPolicy.model_construct(
        delete_idle_after=row["delete_idle_after"],
        keep_last_messages=row["keep_last_messages"],
        include_paused=row["include_paused"],
    )


# --- policies -------------------------------------------------------------------------


async def set_policy(conn: Tx, target: Scope, policy: RetentionPolicy | None) -> None:
    """Write (or with None remove) the policy at exactly ``target``."""
    params = scope_params(target)
    if policy is None:
        await conn.execute(sql.delete_policy_statement(), params)
        return
    values = {
        R_DELETE_IDLE_AFTER: policy.delete_idle_after,
        R_KEEP_LAST_MESSAGES: policy.keep_last_messages,
        R_INCLUDE_PAUSED: policy.include_paused,
    }
    await conn.execute(sql.set_policy_statement(), {**params, **values})


async def get_policy(conn: Tx, target: Scope) -> RetentionPolicy | None:
    """The policy in force at ``target``: the nearest one at or above it (None: none)."""
    params = {**scope_params(target), ANCESTORS: _ancestors(target, inclusive=True)}
    row = (await conn.execute(sql.nearest_policy_statement(), params)).first()
    return None if row is None else _policy(row)


@dataclass(frozen=True)
class Policies:
    """The policies that can govern a subtree's sessions, by path: above it, at it, beneath it."""

    by_path: dict[str, RetentionPolicy]

    def governing(self, scope: str) -> tuple[str, RetentionPolicy] | None:
        """The nearest policy at or above ``scope`` (a session's), with its path."""
        path = scope
        while True:
            found = self.by_path.get(path)
            if found is not None:
                return path, found
            cut = path.rfind("/")
            if cut < 0:
                return None
            path = path[:cut]

    def widest(self) -> tuple[timedelta | None, int | None]:
        """The shortest idle period and the smallest count any policy keeps (None: no policy asks)."""
        idle = [p.delete_idle_after for p in self.by_path.values() if p.delete_idle_after]
        keep = [p.keep_last_messages for p in self.by_path.values() if p.keep_last_messages]
        return (min(idle) if idle else None, min(keep) if keep else None)


async def load_policies(conn: Tx, target: Scope) -> Policies:
    params = scope_params(target)
    if target.depth > 1:
        params[ANCESTORS] = _ancestors(target, inclusive=False)
    rows = (await conn.execute(sql.policies_statement(depth_class(target)), params)).all()
    return Policies({row["scope"]: _policy(row) for row in rows})


# --- a run's candidates --------------------------------------------------------------------


async def clock(conn: Tx) -> datetime:
    """The database's clock: a run's idle periods are measured back from it."""
    moment: datetime = (await conn.execute(lifecycle_sql.clock_statement())).scalar_one()
    return moment


@dataclass(frozen=True)
class Plan:
    """What a run looks for: sessions idle since before ``idle_before``, or over ``min_keep``."""

    started: datetime
    idle_before: datetime | None
    min_keep: int | None

    @classmethod
    def of(cls, policies: Policies, started: datetime) -> Plan:
        idle, keep = policies.widest()
        return cls(started, None if idle is None else started - idle, keep)

    @property
    def empty(self) -> bool:
        return self.idle_before is None and self.min_keep is None

    def params(self, target: Scope) -> dict[str, Any]:
        params = scope_params(target)
        if self.idle_before is not None:
            params[IDLE_BEFORE] = self.idle_before
        if self.min_keep is not None:
            params[MIN_KEEP] = self.min_keep
        return params

    def shape(self) -> tuple[bool, bool]:
        return self.idle_before is not None, self.min_keep is not None


@dataclass(frozen=True)
class Candidate:
    id: uuid.UUID
    scope: str
    updated_at: datetime
    message_count: int
    paused: bool


async def count_candidates(conn: Tx, target: Scope, plan: Plan) -> int:
    stmt = sql.count_candidates_statement(depth_class(target), *plan.shape())
    return int((await conn.execute(stmt, plan.params(target))).scalar_one())


async def candidates(
    conn: Tx, target: Scope, plan: Plan, after: tuple[datetime, uuid.UUID] | None
) -> list[Candidate]:
    """The next page of the subtree's candidates (listing order), after ``after``."""
    stmt = sql.candidates_statement(depth_class(target), *plan.shape(), after is not None)
    params = {**plan.params(target), LIMIT: PAGE_SESSIONS}
    if after is not None:
        params.update(cursor_params(*after))
    rows = (await conn.execute(stmt, params)).all()
    return [
        Candidate(r["id"], r["scope"], r["updated_at"], r["message_count"], r["state"] == "paused")
        for r in rows
    ]


# --- batches -----------------------------------------------------------------------------------


@dataclass
class Removed:
    """What a run (or one batch of it) removed, as RetentionReport counts it."""

    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    trimmed_sessions: int = 0
    trimmed_messages: int = 0
    # Sessions a capped trim left over their policy: the next batch goes on with them.
    unfinished: list[uuid.UUID] = field(default_factory=list)

    def add(self, other: Removed) -> None:
        for name in (
            "sessions",
            "messages",
            "pending_inputs",
            "markers",
            "trimmed_sessions",
            "trimmed_messages",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def erase_groups(sessions: Iterable[Candidate]) -> list[list[Candidate]]:
    """``sessions`` in batches of at most BATCH_SESSIONS holding BATCH_MESSAGES (one at least)."""
    groups: list[list[Candidate]] = []
    held = 0
    for session in sessions:
        if (
            not groups
            or len(groups[-1]) >= BATCH_SESSIONS
            or held + session.message_count > BATCH_MESSAGES
        ):
            groups.append([])
            held = 0
        groups[-1].append(session)
        held += session.message_count
    return groups


async def erase_batch(
    conn: Tx,
    target: Scope,
    ids: Sequence[uuid.UUID],
    policy: RetentionPolicy,
    started: datetime,
    *,
    dry_run: bool,
) -> Removed:
    """Erase those of ``ids`` still idle past ``policy`` (measured from ``started``), as erase_scope does.

    They are row-locked and checked again first: one appended to or updated
    since the page was read, or erased by another run, is left out.
    """
    assert policy.delete_idle_after is not None
    params = {
        **scope_params(target),
        BATCH_IDS: list(ids),
        CUTOFF: started - policy.delete_idle_after,
        R_INCLUDE_PAUSED: policy.include_paused,
    }
    rows = (await conn.execute(sql.select_erase_statement(not dry_run), params)).all()
    if not rows:
        return Removed()
    batch = {**scope_params(target), BATCH_IDS: [row["id"] for row in rows]}
    depth = depth_class(target)
    stmt = sql.erase_counts_statement(depth) if dry_run else sql.erase_statement(depth)
    counts = (await conn.execute(stmt, batch)).one()
    return Removed(
        sessions=int(counts["sessions"]),
        messages=int(counts["messages"]),
        pending_inputs=int(counts["pending_inputs"]),
        markers=int(counts["markers"]),
    )


async def trim_batch(
    conn: Tx,
    target: Scope,
    ids: Sequence[uuid.UUID],
    policy: RetentionPolicy,
    *,
    dry_run: bool,
) -> Removed:
    """Remove the oldest messages of those of ``ids`` holding more than ``policy`` keeps.

    Each keeps its newest ``keep_last_messages`` messages, and every message
    from its oldest pending question on; the kept ones keep their ``seq``.
    At most BATCH_MESSAGES go in one batch: a session capped short of its
    policy is named in ``unfinished`` (a dry run counts it whole).
    """
    keep = policy.keep_last_messages
    assert keep is not None
    params = {**scope_params(target), BATCH_IDS: list(ids), R_KEEP_LAST_MESSAGES: keep}
    rows = (await conn.execute(sql.select_trim_statement(not dry_run), params)).all()
    chosen: list[uuid.UUID] = []
    firsts: list[int] = []
    removed = Removed()
    budget = INT4_MAX if dry_run else BATCH_MESSAGES
    for row in rows:
        trimmed, count = row["trimmed_count"], row["message_count"]
        first = trimmed + count - keep + 1
        if row["oldest_pending"] is not None:
            first = min(first, row["oldest_pending"])
        if first - 1 - trimmed > budget:
            if chosen:
                removed.unfinished.append(row["id"])
                continue
            first = trimmed + 1 + budget
            removed.unfinished.append(row["id"])
        gone = first - 1 - trimmed
        if gone <= 0:
            continue
        budget -= gone
        chosen.append(row["id"])
        firsts.append(first)
        removed.trimmed_messages += gone
    if not chosen:
        return removed
    if not dry_run:
        batch = {**scope_params(target), BATCH_IDS: chosen, FIRST_SEQS: firsts}
        done = (await conn.execute(sql.trim_statement(), batch)).one()
        if done["messages"] != removed.trimmed_messages or done["sessions"] != len(chosen):
            # seq runs without a gap under the row lock: anything else is refused whole.
            raise DatabaseError(
                f"a trim removed {done['messages']} messages of {done['sessions']} sessions,"
                f" not {removed.trimmed_messages} of {len(chosen)}: rolled back"
            )
    removed.trimmed_sessions = len([i for i in chosen if i not in removed.unfinished])
    removed.messages = removed.trimmed_messages
    return removed
