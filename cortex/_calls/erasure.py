"""Calls of an erasure: its receipt, its batches, its dry run, the receipts' listing.

Each function is the body of one transaction (cortex._db.transaction.run_transaction);
:meth:`cortex.Store.erase_scope` runs them one after another, so no
statement holds its locks for more than one batch. ``target`` is the scope
erased (at or beneath the caller's, checked by the store); the transaction
is bound to the caller's tenant, which is ``target``'s.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from cortex._db.executor import Row, Tx
from cortex._sql import lifecycle as sql
from cortex._sql.params import BATCH_IDS, CUTOFF, ERASURE_ID, LIMIT
from cortex._sql.predicates import depth_class, scope_params
from cortex.errors import DatabaseError
from cortex.ids import ERASURE_PREFIX, format_id, new_uuid
from cortex.models import Erasure, ErasureReport, ErasureState
from cortex.scope import Scope

__all__ = [
    "BATCH_MESSAGES",
    "BATCH_SESSIONS",
    "Begun",
    "Removed",
    "begin",
    "count",
    "erase_batch",
    "erase_rest",
    "finish",
    "list_receipts",
    "row_to_erasure",
]

# A batch locks at most this many sessions and removes as many of them as
# hold BATCH_MESSAGES messages in all (one at least): its statement's locks
# then last milliseconds, whatever the subtree's size (docs/benchmarks.md).
BATCH_SESSIONS: Final = 500
BATCH_MESSAGES: Final = 10_000
# Rows of a table without sessions (parked markers, scope documents, legacy
# messages) removed per batch.
BATCH_ROWS: Final = 5_000

_STATE_OF: Final = {state.value: state for state in ErasureState}


@dataclass(frozen=True)
class Begun:
    """An erasure this call works on: its receipt, and the call's cutoff."""

    receipt: Erasure
    erasure_id: uuid.UUID
    # The database's clock when the call began: sessions created from then
    # on are not this call's to remove.
    cutoff: datetime
    resumed: bool


@dataclass(frozen=True)
class Removed:
    """What one batch removed (its receipt's counts include it)."""

    sessions: int = 0
    messages: int = 0
    pending_inputs: int = 0
    markers: int = 0
    scope_documents: int = 0
    receipt: Erasure | None = None

    @property
    def rows(self) -> int:
        return (
            self.sessions
            + self.messages
            + self.pending_inputs
            + self.markers
            + self.scope_documents
        )


def row_to_erasure(row: Row) -> Erasure:
    """A receipt from a row of cortex._sql.lifecycle.erasure_columns."""
    return Erasure(
        id=format_id(ERASURE_PREFIX, row["id"]),
        scope=Scope.parse(row["scope"]),
        state=_STATE_OF[row["state"]],
        at=row["at"],
        finished_at=row["finished_at"],
        **{name: int(row[name]) for name in sql.COUNTED},
    )


def _params(target: Scope) -> dict[str, Any]:
    return scope_params(target)


async def begin(conn: Tx, target: Scope) -> Begun:
    """The scope's running erasure, or a new one; this call's cutoff.

    Two calls on one scope share its running erasure (``uq_erasures_running``),
    each removing with its own cutoff; the receipt counts both.
    """
    erasure_id = new_uuid()
    cutoff = (await conn.execute(sql.clock_statement())).scalar_one()
    params = {**_params(target), ERASURE_ID: erasure_id, CUTOFF: cutoff}
    row = (await conn.execute(sql.begin_erasure_statement(), params)).first()
    resumed = row is None
    if row is None:
        row = (await conn.execute(sql.running_erasure_statement(), _params(target))).first()
        if row is None:
            # Finished between the two statements (READ COMMITTED): begin anew.
            row = (await conn.execute(sql.begin_erasure_statement(), params)).first()
            resumed = False
        if row is None:
            raise DatabaseError(f"no running erasure of {target} could be begun or found")
    return Begun(row_to_erasure(row), row["id"], cutoff, resumed)


def _removed(row: Row) -> Removed:
    counts = {name: int(row.get(f"removed_{name}") or 0) for name in sql.COUNTED}
    return Removed(**counts, receipt=row_to_erasure(row))


async def erase_batch(conn: Tx, target: Scope, begun: Begun) -> Removed:
    """Remove one batch of the subtree's sessions created before the cutoff, counted on the receipt.

    The sessions are row-locked first: an append in flight on one commits
    before (and its messages are removed here) or waits, then finds the
    session gone. Nothing left: an empty Removed.
    """
    depth = depth_class(target)
    params = {**_params(target), CUTOFF: begun.cutoff, LIMIT: BATCH_SESSIONS}
    locked = (await conn.execute(sql.lock_batch_statement(depth), params)).all()
    if not locked:
        return Removed()
    chosen: list[uuid.UUID] = []
    held = 0
    for row in locked:
        if chosen and held + row["message_count"] > BATCH_MESSAGES:
            break
        chosen.append(row["id"])
        held += row["message_count"]
    batch = {**_params(target), BATCH_IDS: chosen, ERASURE_ID: begun.erasure_id}
    return _removed((await conn.execute(sql.erase_batch_statement(depth), batch)).one())


async def erase_rest(conn: Tx, target: Scope, begun: Begun, kind: str) -> Removed:
    """One batch of what no session holds.

    ``kind``: ``markers`` parked before the cutoff, ``unsessioned`` legacy
    messages, or ``scope_documents``.
    """
    depth = depth_class(target)
    params: dict[str, Any] = {**_params(target), LIMIT: BATCH_ROWS, ERASURE_ID: begun.erasure_id}
    if kind == "markers":
        stmt = sql.erase_parked_markers_statement(depth)
        params[CUTOFF] = begun.cutoff
    elif kind == "unsessioned":
        stmt = sql.erase_unsessioned_statement()
    else:
        stmt = sql.erase_scope_documents_statement(depth)
    return _removed((await conn.execute(stmt, params)).one())


async def finish(conn: Tx, target: Scope, begun: Begun) -> Erasure:
    """Mark the receipt done (another call on the same erasure may have done it first)."""
    params = {**_params(target), ERASURE_ID: begun.erasure_id}
    row = (await conn.execute(sql.finish_erasure_statement(), params)).first()
    if row is None:
        row = (await conn.execute(sql.erasure_statement(), params)).one()
    return row_to_erasure(row)


async def count(conn: Tx, target: Scope) -> ErasureReport:
    """What erasing ``target`` would remove now, from one statement's snapshot."""
    row = (await conn.execute(sql.count_statement(depth_class(target)), _params(target))).one()
    return ErasureReport(
        scope=target,
        dry_run=True,
        sessions=int(row["sessions"]),
        messages=int(row["session_messages"]) + int(row["unsessioned"]),
        pending_inputs=int(row["pending_inputs"]),
        markers=int(row["markers"]),
        scope_documents=int(row["scope_documents"]),
    )


async def list_receipts(conn: Tx, target: Scope) -> list[Erasure]:
    """Receipts of erasures at or beneath ``target``, newest first."""
    rows = (await conn.execute(sql.erasures_statement(depth_class(target)), _params(target))).all()
    return [row_to_erasure(row) for row in rows]
