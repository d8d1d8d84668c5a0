"""The backfill: legacy conversations become default sessions, in set-based batches sized by rows.

Used by revision 20260824000004 and by ``cortex db backfill`` (the catch-up
for legacy rows the old release wrote after the revision ran). It owns the
batch SQL and the loop; it must not hold a transaction across batches: the
connection is in autocommit mode and each batch is one atomic statement.

How a batch is chosen: the partial index ``ix_messages_unsessioned`` holds
exactly the legacy rows still to do, ordered by conversation (tenant, agent,
scope). From the cursor, the next conversations are read in index order, as
many as hold about ``batch_rows`` messages (the rows per conversation are
learnt as batches go); a conversation is never split. Each
conversation is checked with the API's rules as they were when the backfill
was written (:func:`is_valid`, a copy of :func:`cortex.models.check_identifier`
for the agent id and :class:`cortex.scope.Scope` for the scope): one that
cortex would refuse is skipped, reported, and left alone.

Resumable: a batch either committed or did not; the work list is "rows whose
``session_id`` is NULL", so a run killed at any point continues from what is
left. Runnable while the old release writes: its new rows are unsessioned, so
a later pass (passes repeat while the previous one moved rows) or the next run
picks them up, joining the default session created earlier.

Why it is fast: each batch is one index range read twice (list, then move),
every join in the batch statement is on a small integer or by index, and the
rows are moved by ``ctid``. What remains is the cost of the rows themselves:
a new tuple, two index entries and the foreign-key check per message.

Frozen once released (see :mod:`cortex._revision_helpers`).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from cortex._revision_helpers.progress_v1 import progress
from cortex.errors import InvalidInput

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

_SUPERUSER = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"

_PENDING_SQL = (
    "SELECT count(*) FROM messages AS m WHERE m.session_id IS NULL AND m.scope IS NOT NULL"
)

# The work list after the cursor, in the order of ix_messages_unsessioned.
_RANGE = f"m.session_id IS NULL AND m.scope IS NOT NULL AND {_KEY} > (:at, :aa, :as_)"

# The next conversations after the cursor, in index order (a streaming
# aggregate that stops at the limit). The limit is sized from the rows per
# conversation seen so far, so a batch carries about batch_rows messages.
_CONVERSATIONS = f"""
SELECT m.tenant_id, m.agent_id, m.scope, count(*) AS n, min(m.created_at) AS first_at
FROM messages AS m
WHERE {_RANGE}
GROUP BY m.tenant_id, m.agent_id, m.scope
ORDER BY m.tenant_id, m.agent_id, m.scope
LIMIT :limit
"""

# One batch, one statement: every CTE runs once, on one snapshot, atomically.
# Each conversation comes with its ordinal ``i`` and the id its new session
# gets (a UUIDv7 stamped with its first message's time, made in Python), so
# every join below is on the small integer ``i`` or by index: CTE row counts
# are estimated at 1, and a join on text keys would become a nested loop over
# rows x conversations.
_BATCH = """
WITH conv AS (
    SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:agents AS text[]),
                         CAST(:scopes AS text[]), CAST(:ids AS uuid[]))
                  WITH ORDINALITY AS k(tenant_id, agent_id, scope, new_id, i)
),
rows AS MATERIALIZED (
    -- One index lookup per conversation (ix_messages_unsessioned, all three
    -- key columns equal): a range predicate here lets the planner pick an
    -- index led by tenant_id alone and read a large tenant whole, per batch.
    SELECT m.ctid AS row_ctid, m.tenant_id, m.id, m.created_at, m.content, c.i, c.new_id,
           row_number() OVER (PARTITION BY c.i ORDER BY m.created_at, m.id) AS pos
    FROM conv AS c
    CROSS JOIN LATERAL (
        SELECT m.ctid, m.tenant_id, m.id, m.created_at, m.content
        FROM messages AS m
        WHERE m.tenant_id = c.tenant_id AND m.agent_id = c.agent_id AND m.scope = c.scope
          AND m.session_id IS NULL
    ) AS m
),
existing AS (
    -- Lock the defaults we join, so a concurrent append cannot take the seqs we number.
    SELECT c.i, s.tenant_id, s.id, s.message_count AS base
    FROM conv AS c
    JOIN sessions AS s
      ON s.tenant_id = c.tenant_id
     AND s.agent_id = c.agent_id COLLATE "C"
     AND s.scope = c.scope COLLATE "C"
     AND s.is_default
    FOR UPDATE OF s
),
agg AS (
    SELECT r.i, r.new_id, r.tenant_id, count(*) AS n,
           min(r.created_at) AS first_at, max(r.created_at) AS last_at,
           (pg_catalog.array_agg(left(r.content, {preview}) ORDER BY r.created_at DESC, r.id DESC))[1]
               AS last_content
    FROM rows AS r
    GROUP BY r.i, r.new_id, r.tenant_id
),
created AS (
    -- No ON CONFLICT: a default the new release created meanwhile makes the
    -- batch fail on uq_sessions_default; it is retried and joins that default.
    INSERT INTO sessions (
        tenant_id, id, agent_id, scope, scope_depth, scope_l2, is_default,
        message_count, last_message, backfilled_by, created_at, updated_at
    )
    SELECT a.tenant_id, a.new_id, c.agent_id, c.scope,
           pg_catalog.array_length(pg_catalog.string_to_array(c.scope, '/'), 1),
           CASE WHEN strpos(c.scope, '/') > 0
                THEN split_part(c.scope, '/', 1) || '/' || split_part(c.scope, '/', 2) END,
           true, a.n, a.last_content, :revision, a.first_at, a.last_at
    FROM agg AS a
    JOIN conv AS c ON c.i = a.i
    WHERE a.i NOT IN (SELECT i FROM existing)
    RETURNING 1
),
joined AS (
    UPDATE sessions AS s
    SET message_count = s.message_count + a.n,
        last_message = a.last_content,
        updated_at = greatest(s.updated_at, a.last_at)
    FROM existing AS e
    JOIN agg AS a ON a.i = e.i
    WHERE s.tenant_id = e.tenant_id AND s.id = e.id
    RETURNING 1
),
moved AS (
    UPDATE messages AS m
    SET session_id = coalesce(e.id, r.new_id), seq = coalesce(e.base, 0) + r.pos
    FROM rows AS r
    LEFT JOIN existing AS e ON e.i = r.i
    -- By ctid (a TID scan, not an index probe per row): nothing else updates
    -- an unsessioned legacy row, and the guard below proves every one moved.
    WHERE m.ctid = r.row_ctid AND m.id = r.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM joined) AS joined,
       -- Guard: the counters count `rows`; if any row did not move, divide by
       -- zero so the whole statement (and batch) rolls back.
       (SELECT count(*) FROM moved)
           / CASE WHEN (SELECT count(*) FROM moved) = (SELECT count(*) FROM rows) THEN 1 ELSE 0 END
           AS moved
"""

_TEXTS = ARRAY(sa.Text())
_UUIDS = ARRAY(UUID(as_uuid=True))
_UNIQUE_VIOLATION: Final = "23505"
# Tries of one batch that meets a default created meanwhile (each sees it and joins).
_BATCH_TRIES: Final = 3


def uuid7_at(moment: datetime) -> uuid.UUID:
    """A UUIDv7 whose timestamp is ``moment`` (k-sortable with the conversation's first message)."""
    millis = int(moment.timestamp() * 1000)
    raw = bytearray(millis.to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70  # version 7
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return uuid.UUID(bytes=bytes(raw))


# The API's rules when the backfill was written (cortex.models.MAX_AGENT_ID_LENGTH,
# cortex.scope's grammar), copied so that a change to live code never reaches a revision.
_MAX_AGENT_ID_LENGTH: Final = 128
_MAX_SCOPE_DEPTH: Final = 8
_SCOPE_SEGMENT: Final = re.compile(r"[A-Za-z0-9._:\-]{1,64}")


def _valid_agent_id(agent_id: str) -> bool:
    if (
        not agent_id
        or len(agent_id) > _MAX_AGENT_ID_LENGTH
        or "\x00" in agent_id
        or not agent_id.isprintable()
        or any(c.isspace() for c in agent_id)
    ):
        return False
    try:
        agent_id.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _valid_scope(scope: str) -> bool:
    segments = scope.split("/")
    return len(segments) <= _MAX_SCOPE_DEPTH and all(
        _SCOPE_SEGMENT.fullmatch(segment) for segment in segments
    )


def is_valid(agent_id: str, scope: str) -> bool:
    """Whether the API accepted this conversation key when the backfill was written.

    An agent id: 1-128 printable characters, no whitespace. A scope: 1-8
    segments joined by ``/``, each 1-64 characters of ``A-Z a-z 0-9 . _ : -``.
    """
    return _valid_agent_id(agent_id) and _valid_scope(scope)


def _sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, raw or wrapped, or None (cortex.errors.sqlstate_of)."""
    state = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "orig", None), "sqlstate", None)
    return state if isinstance(state, str) else None


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


def _batch(conn: Connection, valid: list[Any], revision: str) -> Any:
    stmt = sa.text(_BATCH.format(preview=PREVIEW_LENGTH)).bindparams(
        sa.bindparam("tenants", type_=_TEXTS),
        sa.bindparam("agents", type_=_TEXTS),
        sa.bindparam("scopes", type_=_TEXTS),
        sa.bindparam("ids", type_=_UUIDS),
    )
    params = {
        "tenants": [c.tenant_id for c in valid],
        "agents": [c.agent_id for c in valid],
        "scopes": [c.scope for c in valid],
        "ids": [uuid7_at(c.first_at) for c in valid],
        "revision": revision,
    }
    for attempt in range(1, _BATCH_TRIES + 1):
        try:
            return conn.execute(stmt, params).one()
        except DBAPIError as exc:
            # The statement is atomic: nothing of it committed. Run it again:
            # it now sees the default that won, and joins it.
            if _sqlstate_of(exc) != _UNIQUE_VIOLATION or attempt == _BATCH_TRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


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
    # Messages per conversation, learnt as batches go; the first guess keeps
    # the first batch small whatever the data.
    per_conversation = 50.0
    while True:
        limit = max(1, int(batch_rows / per_conversation))
        conversations = conn.execute(sa.text(_CONVERSATIONS), {**cursor, "limit": limit}).all()
        if not conversations:
            break
        last = conversations[-1]
        per_conversation = max(1.0, sum(c.n for c in conversations) / len(conversations))
        valid = []
        for c in conversations:
            if is_valid(c.agent_id, c.scope):
                valid.append(c)
            else:
                totals.skipped[(c.tenant_id, c.agent_id, c.scope)] = c.n
        if valid:
            row = _batch(conn, valid, revision)
            totals.created += row.created
            totals.joined += row.joined
            totals.moved += row.moved
            totals.batches += 1
            moved += row.moved
            advance(row.moved)
        cursor = {"at": last.tenant_id, "aa": last.agent_id, "as_": last.scope}
        if max_rate:
            # Throttle: hold the average at max_rate, leaving the server room for the application.
            ahead = totals.moved / max_rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
        if len(conversations) < limit:
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
    pending = int(conn.execute(sa.text(_PENDING_SQL)).scalar_one())
    # A superuser skips the per-row foreign-key check (about a quarter of a
    # batch): every session_id a batch writes is a session the same statement
    # inserted, or a default it holds locked, so the reference holds by
    # construction. Other roles keep the check (only a superuser may skip it).
    skip_checks = bool(conn.execute(sa.text(_SUPERUSER)).scalar())
    if skip_checks:
        conn.execute(sa.text("SET session_replication_role = replica"))
    try:
        with progress("backfill", pending, unit="messages") as advance:
            # Nothing pending, no pass: on Citus a batch (it reads across
            # tenants to find its conversations) cannot even be planned.
            for _ in range(MAX_PASSES if pending else 0):
                if _pass(conn, revision, batch_rows, max_rate, totals, advance, started) == 0:
                    break
    finally:
        if skip_checks:
            conn.execute(sa.text("RESET session_replication_role"))
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
