"""The backfill: legacy conversations become default sessions, in set-based batches sized by rows.

Used by revision 20260824000004 and by ``cortex db backfill`` (the catch-up
for legacy rows the old release wrote after the revision ran). It owns the
batch SQL and the loop; it must not hold a transaction across batches: the
connection is in autocommit mode and each batch is one atomic statement.

How a batch is chosen: the partial index ``ix_messages_unsessioned`` holds
exactly the legacy rows still to do, ordered by conversation (tenant, agent,
scope). From the cursor, the row ``batch_rows`` entries ahead bounds the batch;
its conversations are read whole (a conversation is never split). Each
conversation is checked with the API's own rules (:func:`cortex.models.
check_identifier` for the agent id, :class:`cortex.scope.Scope` for the scope):
one that cortex would refuse is skipped, reported, and left alone.

Resumable: a batch either committed or did not; the work list is "rows whose
``session_id`` is NULL", so a run killed at any point continues from what is
left. Runnable while the old release writes: its new rows are unsessioned, so
a later pass (passes repeat while the previous one moved rows) or the next run
picks them up, joining the default session created earlier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection

from cortex._progress import progress
from cortex.errors import InvalidInput
from cortex.models import check_identifier
from cortex.scope import Scope

__all__ = ["DEFAULT_BATCH_ROWS", "PREVIEW_LENGTH", "Totals", "backfill", "is_valid"]

log = logging.getLogger("cortex")

PREVIEW_LENGTH: Final = 256  # cortex.models.PREVIEW_LENGTH when the backfill was written
# Legacy messages per batch: large enough that per-statement overhead vanishes,
# small enough that one batch commits in well under a second.
DEFAULT_BATCH_ROWS: Final = 20_000
# Passes after the first repeat while the previous pass moved rows (rows the
# old release wrote behind the cursor); bounded so a busy writer cannot keep
# the backfill going forever. What is left, the next run (`cortex db backfill`) takes.
MAX_PASSES: Final = 5

_KEY = "(m.tenant_id, m.agent_id, m.scope)"

_TODO = "SELECT count(*) FROM messages AS m WHERE m.session_id IS NULL AND m.scope IS NOT NULL"

# The conversation key batch_rows rows past the cursor (None: fewer are left).
_BOUND = f"""
SELECT m.tenant_id, m.agent_id, m.scope FROM messages AS m
WHERE m.session_id IS NULL AND m.scope IS NOT NULL AND {_KEY} > (:at, :aa, :as_)
ORDER BY m.tenant_id, m.agent_id, m.scope, m.created_at
OFFSET :offset LIMIT 1
"""

# The batch's rows: a range of the partial index, from the cursor to the bound
# (two spellings, not an OR, so a generic plan still bounds the index scan).
_RANGE = f"m.session_id IS NULL AND m.scope IS NOT NULL AND {_KEY} > (:at, :aa, :as_)"
_BOUNDED = f"{_RANGE} AND {_KEY} <= (:bt, :ba, :bs)"

_CONVERSATIONS = """
SELECT m.tenant_id, m.agent_id, m.scope, count(*) AS n FROM messages AS m
WHERE {range}
GROUP BY m.tenant_id, m.agent_id, m.scope
ORDER BY m.tenant_id, m.agent_id, m.scope
"""

# One batch, one statement: every CTE runs once, on one snapshot, atomically.
# Sibling CTEs cannot see each other's writes, so new sessions are inserted with
# their final counters rather than inserted and then bumped.
_BATCH = """
WITH conv AS (
    SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:agents AS text[]),
                         CAST(:scopes AS text[])) AS k(tenant_id, agent_id, scope)
),
rows AS MATERIALIZED (
    SELECT m.tenant_id, m.id, m.agent_id, m.scope, m.created_at, m.content
    FROM messages AS m
    JOIN conv AS c
      ON c.tenant_id = m.tenant_id AND c.agent_id = m.agent_id AND c.scope = m.scope
    WHERE {range}
),
agg AS (
    SELECT r.tenant_id, r.agent_id, r.scope, count(*) AS n,
           min(r.created_at) AS first_at, max(r.created_at) AS last_at,
           (array_agg(left(r.content, {preview}) ORDER BY r.created_at DESC, r.id DESC))[1]
               AS last_content
    FROM rows AS r
    GROUP BY r.tenant_id, r.agent_id, r.scope
),
existing AS (
    -- Lock the defaults we join, so a concurrent append cannot take the seqs we number.
    SELECT s.tenant_id, s.id, s.agent_id, s.scope, s.message_count AS base
    FROM sessions AS s
    JOIN agg AS a
      ON s.tenant_id = a.tenant_id
     AND s.agent_id = a.agent_id COLLATE "C"
     AND s.scope = a.scope COLLATE "C"
    WHERE s.is_default
    FOR UPDATE OF s
),
created AS (
    INSERT INTO sessions (
        tenant_id, id, agent_id, scope, scope_depth, scope_l2, is_default,
        message_count, last_message, backfilled_by, created_at, updated_at
    )
    SELECT a.tenant_id,
           -- UUIDv7 stamped with the first message's time (PostgreSQL 15 has no uuidv7()).
           encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
               substring(int8send(floor(extract(epoch FROM a.first_at) * 1000)::bigint) FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
           a.agent_id, a.scope,
           array_length(string_to_array(a.scope, '/'), 1),
           CASE WHEN strpos(a.scope, '/') > 0
                THEN split_part(a.scope, '/', 1) || '/' || split_part(a.scope, '/', 2) END,
           true, a.n, a.last_content, :revision, a.first_at, a.last_at
    FROM agg AS a
    WHERE NOT EXISTS (
        SELECT 1 FROM existing AS e
        WHERE e.tenant_id = a.tenant_id
          AND e.agent_id = a.agent_id COLLATE "C"
          AND e.scope = a.scope COLLATE "C"
    )
    -- A default created meanwhile by the new release: this conversation sits
    -- out this batch and joins that default on the next pass.
    ON CONFLICT (tenant_id, agent_id, scope) WHERE is_default DO NOTHING
    RETURNING tenant_id, id, agent_id, scope, 0 AS base
),
joined AS (
    UPDATE sessions AS s
    SET message_count = s.message_count + a.n,
        last_message = a.last_content,
        updated_at = greatest(s.updated_at, a.last_at)
    FROM existing AS e
    JOIN agg AS a
      ON e.tenant_id = a.tenant_id
     AND e.agent_id = a.agent_id COLLATE "C"
     AND e.scope = a.scope COLLATE "C"
    WHERE s.tenant_id = e.tenant_id AND s.id = e.id
    RETURNING s.id
),
target AS (
    SELECT tenant_id, id, agent_id, scope, base FROM created
    UNION ALL
    SELECT tenant_id, id, agent_id, scope, base FROM existing
),
numbered AS (
    SELECT r.tenant_id, r.id, t.id AS session_id,
           t.base + row_number() OVER (PARTITION BY t.id ORDER BY r.created_at, r.id) AS seq
    FROM rows AS r
    JOIN target AS t
      ON r.tenant_id = t.tenant_id
     AND r.agent_id COLLATE "C" = t.agent_id
     AND r.scope COLLATE "C" = t.scope
),
moved AS (
    UPDATE messages AS m
    SET session_id = n.session_id, seq = n.seq
    FROM numbered AS n
    WHERE m.tenant_id = n.tenant_id AND m.id = n.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM joined) AS joined,
       (SELECT count(*) FROM moved) AS moved
"""

_TEXTS = ARRAY(sa.Text())


def is_valid(agent_id: str, scope: str) -> bool:
    """Whether the API would accept this conversation key (its own rules, not a copy of them)."""
    try:
        check_identifier(agent_id, "agent_id")
        Scope.parse(scope)
    except InvalidInput:  # InvalidScope is an InvalidInput
        return False
    return True


@dataclass
class Totals:
    """What a backfill run did."""

    created: int = 0
    joined: int = 0
    moved: int = 0
    batches: int = 0
    seconds: float = 0.0
    # Conversations cortex would refuse (agent id or scope), left unsessioned: their rows.
    skipped: dict[tuple[str, str, str], int] = field(default_factory=dict)

    @property
    def skipped_rows(self) -> int:
        """Legacy messages left unsessioned because cortex would refuse their conversation."""
        return sum(self.skipped.values())

    @property
    def rate(self) -> float:
        """Messages moved per second."""
        return self.moved / self.seconds if self.seconds else 0.0


def _pass(
    conn: Connection,
    revision: str,
    batch_rows: int,
    max_rate: float | None,
    totals: Totals,
    advance: Callable[[int], None],
    started: float,
) -> int:
    cursor: dict[str, Any] = {"at": "", "aa": "", "as_": ""}
    moved = 0
    while True:
        bound = conn.execute(sa.text(_BOUND), {**cursor, "offset": batch_rows - 1}).first()
        where = _BOUNDED if bound else _RANGE
        limits = {"bt": bound[0], "ba": bound[1], "bs": bound[2]} if bound else {}
        conversations = conn.execute(
            sa.text(_CONVERSATIONS.format(range=where)), {**cursor, **limits}
        ).all()
        if not conversations:
            break
        valid = []
        for c in conversations:
            if is_valid(c.agent_id, c.scope):
                valid.append(c)
            else:
                totals.skipped[(c.tenant_id, c.agent_id, c.scope)] = c.n
        if valid:
            row = conn.execute(
                sa.text(_BATCH.format(range=where, preview=PREVIEW_LENGTH)).bindparams(
                    sa.bindparam("tenants", type_=_TEXTS),
                    sa.bindparam("agents", type_=_TEXTS),
                    sa.bindparam("scopes", type_=_TEXTS),
                ),
                {
                    **cursor,
                    **limits,
                    "tenants": [c.tenant_id for c in valid],
                    "agents": [c.agent_id for c in valid],
                    "scopes": [c.scope for c in valid],
                    "revision": revision,
                },
            ).one()
            totals.created += row.created
            totals.joined += row.joined
            totals.moved += row.moved
            totals.batches += 1
            moved += row.moved
            advance(row.moved)
        last = conversations[-1]
        cursor = {"at": last.tenant_id, "aa": last.agent_id, "as_": last.scope}
        if max_rate:
            # Throttle: hold the average at max_rate, leaving the server room for the application.
            ahead = totals.moved / max_rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
        if bound is None:
            break
    return moved


def backfill(
    conn: Connection,
    *,
    revision: str,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    max_rate: float | None = None,
) -> Totals:
    """Give every valid unsessioned legacy conversation its default session.

    ``conn`` must be in autocommit mode (each batch commits on its own) and
    see every tenant (run as the owner before row-level security, or as a
    role that bypasses it). ``max_rate`` caps messages per second.

    Raises:
        InvalidInput: ``batch_rows`` is below 1 or ``max_rate`` is not positive.
    """
    if batch_rows < 1:
        raise InvalidInput("backfill batch: 1 message or more")
    if max_rate is not None and max_rate <= 0:
        raise InvalidInput("backfill rate: a positive number of messages per second")
    totals = Totals()
    started = time.perf_counter()
    todo = int(conn.execute(sa.text(_TODO)).scalar_one())
    with progress("backfill", todo, unit="messages") as advance:
        for _ in range(MAX_PASSES):
            if _pass(conn, revision, batch_rows, max_rate, totals, advance, started) == 0:
                break
    totals.seconds = time.perf_counter() - started
    log.info(
        "backfill: %d messages moved in %.1fs (%.0f msg/s): %d sessions created, "
        "%d defaults joined, %d batches",
        totals.moved,
        totals.seconds,
        totals.rate,
        totals.created,
        totals.joined,
        totals.batches,
    )
    if totals.skipped:
        examples = ", ".join(f"({a!r}, {s!r})" for _, a, s in sorted(totals.skipped)[:5])
        log.warning(
            "backfill: %d conversations (%d messages) have an agent id or scope cortex refuses "
            "and stay unsessioned, e.g. %s",
            len(totals.skipped),
            totals.skipped_rows,
            examples,
        )
    return totals
