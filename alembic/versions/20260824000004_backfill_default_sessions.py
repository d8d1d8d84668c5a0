"""Backfill: give every pre-existing unsessioned conversation its first default session.

Revision ID: 20260824000004
Revises: 20260824000003
Create Date: 2026-08-24

Why it exists: messages written before sessions existed belong to a
conversation, (agent_id, scope), but to no session. This revision gives each
such conversation a default session, or joins the default it already has.

- New sessions get ``backfilled_by = '20260824000004'``, ``created_at``/
  ``updated_at`` from their first/last message, a UUIDv7 id stamped with the
  first message's time, counters and preview computed from the messages.
- ``seq`` follows created order (``created_at``, then ``id``). A conversation
  whose default already exists is appended after that session's messages, so
  no ``seq`` a reader has seen ever changes.
- Conversations whose scope or agent id falls outside cortex's grammar are
  left unsessioned and reported; nothing else is touched.

Batches: one statement per batch of conversations (``-x backfill_batch=N``,
default 1000) in autocommit mode, so each batch is atomic and committed on its
own. Restartable and idempotent: it works only on rows whose ``session_id`` is
still NULL, so a rerun after a crash continues where the last committed batch
ended, and a second run finds nothing to do. Progress goes to stderr.

Downgrade: detaches every legacy-origin message (``scope IS NOT NULL``) from
its session, deletes backfilled sessions left empty, and renumbers and
recounts the sessions that keep messages. Messages are never deleted.
"""

import logging
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from alembic import context, op
from cortex._progress import progress

revision: str = "20260824000004"
down_revision: str | Sequence[str] | None = "20260824000003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PREVIEW_LENGTH = 256  # cortex.models.PREVIEW_LENGTH when this revision was written
DEFAULT_BATCH = 1000

log = logging.getLogger("cortex")

# Legacy rows had no grammar; cortex's scopes and agent ids do (contract §1, §2).
_VALID = r"""
      m.scope ~ '^[A-Za-z0-9._:-]{1,64}(/[A-Za-z0-9._:-]{1,64}){0,7}$'
  AND m.agent_id ~ '^[^[:space:][:cntrl:]]{1,128}$'
"""

_PENDING = f"""
SELECT count(*) FROM (
    SELECT DISTINCT m.tenant_id, m.agent_id, m.scope
    FROM messages AS m
    WHERE m.session_id IS NULL AND {_VALID}
) AS pending
"""

# One batch, one statement: every CTE runs exactly once, atomically. Sibling
# CTEs cannot see each other's writes, so new sessions are inserted with their
# final counters instead of being inserted and then bumped.
_BATCH = f"""
WITH conv AS (
    SELECT m.tenant_id, m.agent_id, m.scope, count(*) AS n,
           min(m.created_at) AS first_at, max(m.created_at) AS last_at
    FROM messages AS m
    WHERE m.session_id IS NULL
      AND (m.tenant_id, m.agent_id, m.scope) > (:after_tenant, :after_agent, :after_scope)
      AND {_VALID}
    GROUP BY m.tenant_id, m.agent_id, m.scope
    ORDER BY m.tenant_id, m.agent_id, m.scope
    LIMIT :batch
),
preview AS (
    SELECT c.*, p.content AS last_content
    FROM conv AS c
    CROSS JOIN LATERAL (
        SELECT left(m.content, {PREVIEW_LENGTH}) AS content
        FROM messages AS m
        WHERE m.tenant_id = c.tenant_id AND m.agent_id = c.agent_id AND m.scope = c.scope
          AND m.session_id IS NULL
        ORDER BY m.created_at DESC, m.id DESC
        LIMIT 1
    ) AS p
),
existing AS (
    -- Lock the defaults we join so a concurrent append cannot take the seqs we number.
    SELECT s.tenant_id, s.id, s.agent_id, s.scope, s.message_count AS base
    FROM sessions AS s
    JOIN conv AS c
      ON s.tenant_id = c.tenant_id
     AND s.agent_id = c.agent_id COLLATE "C"
     AND s.scope = c.scope COLLATE "C"
    WHERE s.is_default
    FOR UPDATE OF s
),
created AS (
    INSERT INTO sessions (
        tenant_id, id, agent_id, scope, scope_depth, scope_l2, is_default,
        message_count, last_message, backfilled_by, created_at, updated_at
    )
    SELECT p.tenant_id,
           -- UUIDv7 stamped with the first message's time (PostgreSQL 15 has no uuidv7()).
           encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING
               substring(int8send(floor(extract(epoch FROM p.first_at) * 1000)::bigint) FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
           p.agent_id, p.scope,
           array_length(string_to_array(p.scope, '/'), 1),
           CASE WHEN strpos(p.scope, '/') > 0
                THEN split_part(p.scope, '/', 1) || '/' || split_part(p.scope, '/', 2) END,
           true, p.n, p.last_content, :revision, p.first_at, p.last_at
    FROM preview AS p
    WHERE NOT EXISTS (
        SELECT 1 FROM existing AS e
        WHERE e.tenant_id = p.tenant_id
          AND e.agent_id = p.agent_id COLLATE "C"
          AND e.scope = p.scope COLLATE "C"
    )
    ON CONFLICT (tenant_id, agent_id, scope) WHERE is_default DO NOTHING
    RETURNING tenant_id, id, agent_id, scope, 0 AS base
),
joined AS (
    UPDATE sessions AS s
    SET message_count = s.message_count + p.n,
        last_message = p.last_content,
        updated_at = greatest(s.updated_at, p.last_at)
    FROM existing AS e
    JOIN preview AS p
      ON e.tenant_id = p.tenant_id
     AND e.agent_id = p.agent_id COLLATE "C"
     AND e.scope = p.scope COLLATE "C"
    WHERE s.tenant_id = e.tenant_id AND s.id = e.id
    RETURNING s.id
),
target AS (
    SELECT tenant_id, id, agent_id, scope, base FROM created
    UNION ALL
    SELECT tenant_id, id, agent_id, scope, base FROM existing
),
numbered AS (
    SELECT m.tenant_id, m.id, t.id AS session_id,
           t.base + row_number() OVER (PARTITION BY t.id ORDER BY m.created_at, m.id) AS seq
    FROM messages AS m
    JOIN target AS t
      ON m.tenant_id = t.tenant_id
     AND m.agent_id COLLATE "C" = t.agent_id
     AND m.scope COLLATE "C" = t.scope
    WHERE m.session_id IS NULL
),
moved AS (
    UPDATE messages AS m
    SET session_id = n.session_id, seq = n.seq
    FROM numbered AS n
    WHERE m.tenant_id = n.tenant_id AND m.id = n.id
    RETURNING 1
),
last_key AS (
    SELECT tenant_id, agent_id, scope FROM conv
    ORDER BY tenant_id DESC, agent_id DESC, scope DESC
    LIMIT 1
)
SELECT k.tenant_id, k.agent_id, k.scope,
       (SELECT count(*) FROM conv) AS conversations,
       (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM joined) AS joined,
       (SELECT count(*) FROM moved) AS moved
FROM (SELECT 1) AS one
LEFT JOIN last_key AS k ON true
"""

_SKIPPED = """
SELECT count(*) FROM (
    SELECT DISTINCT tenant_id, agent_id, scope FROM messages WHERE session_id IS NULL
) AS left_over
"""


def _batch_size() -> int:
    raw = context.get_x_argument(as_dictionary=True).get("backfill_batch", DEFAULT_BATCH)
    size = int(raw)
    if size < 1:
        raise SystemExit("backfill_batch must be 1 or more")
    return size


def upgrade() -> None:
    params: dict[str, Any] = {
        "after_tenant": "",
        "after_agent": "",
        "after_scope": "",
        "revision": revision,
    }
    if context.is_offline_mode():
        # Offline SQL for review: the whole backfill as one unbatched statement.
        op.execute(sa.text(_BATCH).bindparams(batch=None, **params))
        return
    batch = _batch_size()
    bind = op.get_bind()
    totals = {"created": 0, "joined": 0, "moved": 0}
    with op.get_context().autocommit_block():
        todo = int(bind.execute(sa.text(_PENDING)).scalar_one())
        with progress("backfill", todo, unit="conversations") as advance:
            # Passes repeat while a pass made progress: a default created
            # concurrently by the new release makes its conversation sit out
            # one pass (ON CONFLICT skipped it) and join on the next. Nothing
            # pending, no pass: on Citus the cross-tenant batch cannot run.
            while todo:
                cursor = dict(params)
                moved_this_pass = 0
                while True:
                    row = bind.execute(sa.text(_BATCH), {**cursor, "batch": batch}).one()
                    if row.conversations == 0:
                        break
                    advance(row.created + row.joined)
                    for key in totals:
                        totals[key] += getattr(row, key)
                    moved_this_pass += row.moved
                    cursor.update(
                        after_tenant=row.tenant_id, after_agent=row.agent_id, after_scope=row.scope
                    )
                if moved_this_pass == 0:
                    break
        left_over = int(bind.execute(sa.text(_SKIPPED)).scalar_one())
    log.info(
        "backfill: %d sessions created, %d defaults joined, %d messages moved",
        totals["created"],
        totals["joined"],
        totals["moved"],
    )
    if left_over:
        log.warning(
            "backfill: %d conversations have a scope or agent id outside cortex's grammar "
            "and stay unsessioned",
            left_over,
        )


def downgrade() -> None:
    # 1. Detach legacy-origin messages (cortex never writes agent_id/scope on messages).
    op.execute(
        """
        CREATE TEMPORARY TABLE backfill_touched ON COMMIT DROP AS
        WITH detached AS (
            -- RETURNING shows new values; the join keeps the session each row left.
            UPDATE messages AS m SET session_id = NULL, seq = NULL
            FROM (
                SELECT tenant_id, id, session_id FROM messages
                WHERE scope IS NOT NULL AND session_id IS NOT NULL
            ) AS old
            WHERE m.tenant_id = old.tenant_id AND m.id = old.id
            RETURNING old.tenant_id, old.session_id
        )
        SELECT DISTINCT tenant_id, session_id AS id FROM detached
        """
    )
    # 2. Backfilled sessions that now hold nothing go.
    op.execute(
        sa.text(
            """
            DELETE FROM sessions AS s
            WHERE s.backfilled_by = :revision
              AND NOT EXISTS (
                  SELECT 1 FROM messages AS m WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id
              )
            """
        ).bindparams(revision=revision)
    )
    # 3. Sessions that keep messages: close the seq gaps (through negatives, so
    #    the unique (tenant_id, session_id, seq) index never sees a collision
    #    mid-statement), then recount.
    op.execute(
        """
        UPDATE messages AS m SET seq = -r.rn
        FROM (
            SELECT m2.tenant_id, m2.id,
                   row_number() OVER (PARTITION BY m2.tenant_id, m2.session_id ORDER BY m2.seq) AS rn
            FROM messages AS m2
            JOIN backfill_touched AS t ON m2.tenant_id = t.tenant_id AND m2.session_id = t.id
        ) AS r
        WHERE m.tenant_id = r.tenant_id AND m.id = r.id
        """
    )
    op.execute("UPDATE messages SET seq = -seq WHERE seq < 0")
    op.execute(
        sa.text(
            f"""
            UPDATE sessions AS s
            SET message_count = coalesce(c.n, 0),
                last_message = coalesce(c.last_content, ''),
                backfilled_by = CASE WHEN s.backfilled_by = :revision THEN '' ELSE s.backfilled_by END
            FROM backfill_touched AS t
            LEFT JOIN LATERAL (
                SELECT count(*) AS n,
                       (array_agg(left(m.content, {PREVIEW_LENGTH}) ORDER BY m.seq DESC))[1]
                           AS last_content
                FROM messages AS m
                WHERE m.tenant_id = t.tenant_id AND m.session_id = t.id
            ) AS c ON true
            WHERE s.tenant_id = t.tenant_id AND s.id = t.id
            """
        ).bindparams(revision=revision)
    )
