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
- Conversations whose agent id or scope the API would refuse (checked with
  cortex's own rules, ``cortex.models.check_identifier`` and
  ``cortex.scope.Scope``) are left unsessioned and reported.

Safe with: the legacy release, writing throughout (its rows are sessioned by a
later pass of this run, or by the next ``cortex db backfill``), and every
cortex release (defaults it joins are locked for the batch).

Batches: set-based, sized by legacy *messages* (``-x backfill_batch=N``,
default 20,000; a conversation is never split), one atomic statement each in
autocommit mode; ``-x backfill_rate=R`` caps messages per second. Progress
(messages/s, ETA) goes to stderr. Resumable and idempotent: it works only on
rows whose ``session_id`` is still NULL, so a run killed at any point (even
SIGKILL) continues where the last committed batch ended, and a second run
finds nothing to do. The batch SQL and loop live in ``cortex._revision_helpers.backfill_v1``.

Offline SQL (``cortex db sql``) cannot run Python's rules: it prints a note;
run ``cortex db backfill`` online.

Downgrade: detaches every legacy-origin message (``scope IS NOT NULL``) from
its session, deletes backfilled sessions left empty, and renumbers and
recounts the sessions that keep messages. Messages are never deleted; the
deleted sessions' ids, titles and metadata are (see :func:`data_loss`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.backfill_v1 import DEFAULT_BATCH_ROWS, backfill

revision: str = "20260824000004"
down_revision: str | Sequence[str] | None = "20260824000003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PREVIEW_LENGTH = 256  # cortex.models.PREVIEW_LENGTH when this revision was written


def _options() -> tuple[int, float | None]:
    args = context.get_x_argument(as_dictionary=True)
    try:
        batch = int(args.get("backfill_batch", DEFAULT_BATCH_ROWS))
        rate = float(args["backfill_rate"]) if args.get("backfill_rate") else None
    except ValueError:
        raise SystemExit("backfill_batch and backfill_rate must be numbers") from None
    return batch, rate


def upgrade() -> None:
    if context.is_offline_mode():
        op.execute(
            "-- 20260824000004: the backfill validates agent ids and scopes with cortex's own "
            "rules (Python); run `cortex db backfill` online"
        )
        return
    batch, rate = _options()
    with op.get_context().autocommit_block():
        backfill(op.get_bind(), revision=revision, batch_rows=batch, max_rate=rate)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: the backfilled sessions it deletes."""
    deleted = ddl.count_rows(
        bind,
        "sessions",
        f"backfilled_by = '{revision}' AND NOT EXISTS (SELECT 1 FROM messages AS m "
        "WHERE m.tenant_id = sessions.tenant_id AND m.session_id = sessions.id "
        "AND m.scope IS NULL)",
    )
    if not deleted:
        return []
    return [
        f"{deleted} backfilled sessions (their ids, titles, metadata and defaults; "
        "an upgrade creates new ones with new ids)"
    ]


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
                       (pg_catalog.array_agg(left(m.content, {PREVIEW_LENGTH}) ORDER BY m.seq DESC))[1]
                           AS last_content
                FROM messages AS m
                WHERE m.tenant_id = t.tenant_id AND m.session_id = t.id
            ) AS c ON true
            WHERE s.tenant_id = t.tenant_id AND s.id = t.id
            """
        ).bindparams(revision=revision)
    )
