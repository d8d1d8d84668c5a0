"""Operator state: pending inputs and markers, kept on write so state is read by index.

Revision ID: 20261001000006
Revises: 20260901000005
Create Date: 2026-10-01

Why it exists: operators ask which sessions are paused waiting for input (and
on what question, expecting what answer), which a shutdown cut short, and
which were aborted. Deriving that by reading every session's history costs
one query per session; instead cortex keeps it current in the same
transaction as the messages and markers that change it:

- ``pending_inputs``: one row per requested input not yet answered by a later
  function response with the same id (deleted with its session);
- ``session_markers``: abort and interrupt markers with their reasons. No
  foreign key: an interrupt marker may be written before its session exists
  (it is parked, and shows once a session with that id appears in the same
  scope). ``delete_session`` removes a session's markers;
- on ``sessions``: ``pending_count``, ``is_aborted``, ``is_interrupted`` and
  ``state``, a stored generated column (aborted > paused > interrupted >
  idle) with a partial index over the non-idle sessions, so
  ``ListFilter(state=...)`` is one indexed query and cannot drift.

Safe with: the legacy release (it never reads ``sessions``; nothing here
locks ``messages`` for more than a catalog change) and every cortex release
before it (new columns have defaults, new tables are unused until the
operator release).

Online: on a database upgraded through today's 20260824000002 the four
columns already exist (``sessions`` is born with them, because adding a
stored generated column rewrites the table under an exclusive lock, and the
legacy release's inserts into ``messages`` lock ``sessions`` through their
foreign-key check); here they are added only where missing, i.e. on a
database whose ``sessions`` an older release created, which pays that
rewrite once. The check is added ``NOT VALID`` then validated, the state
index is built ``CONCURRENTLY``.

The data step fills ``pending_inputs`` from existing messages. A migrating
role that bypasses row-level security simply reads every tenant; any other
owner lifts FORCE ROW LEVEL SECURITY inside one transaction for the step
(so it sees every tenant) and restores it before committing, which holds
``messages`` for the length of the scan.

Safe to run twice: each step checks the catalog, the data step skips rows
already there. Downgrade: drops ``session_markers`` (abort and interrupt
markers: refused unless data loss is allowed, see :func:`data_loss`) and
``pending_inputs`` (derived from messages, rebuilt by the next upgrade).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.citus_v1 import distribute

revision: str = "20261001000006"
down_revision: str | Sequence[str] | None = "20260901000005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MATCH = "tenant_id = current_setting('cortex.tenant', true)"
_STATE = (
    "CASE WHEN is_aborted THEN 'aborted' WHEN pending_count > 0 THEN 'paused' "
    "WHEN is_interrupted THEN 'interrupted' ELSE 'idle' END"
)


def _protect(table: str) -> None:
    op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY tenant_isolation ON {table} USING ({_MATCH}) WITH CHECK ({_MATCH})")


_DERIVE = """
INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message,
                            author, raised_at, response_schema, payload)
SELECT m.tenant_id, m.session_id, m.seq, m.requested_input->>'interrupt_id',
       coalesce(m.requested_input->>'message', ''), m.author, m.created_at,
       m.requested_input->'response_schema', m.requested_input->'payload'
FROM messages AS m
WHERE m.requested_input IS NOT NULL AND m.session_id IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM messages AS r
      WHERE r.tenant_id = m.tenant_id AND r.session_id = m.session_id
        AND r.seq > m.seq
        AND r.function_response->>'id' = m.requested_input->>'interrupt_id'
  )
ON CONFLICT DO NOTHING
"""

_COUNT = """
UPDATE sessions AS s SET pending_count = p.n
FROM (
    SELECT tenant_id, session_id, count(*) AS n FROM pending_inputs GROUP BY 1, 2
) AS p
WHERE s.tenant_id = p.tenant_id AND s.id = p.session_id AND s.pending_count <> p.n
"""


def _create_tables() -> None:
    op.create_table(
        "pending_inputs",
        sa.Column("tenant_id", sa.Text(collation="C"), nullable=False),
        sa.Column("session_id", UUID(as_uuid=True), nullable=False),
        sa.Column("raised_seq", sa.Integer(), nullable=False),
        sa.Column("interrupt_id", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("author", sa.Text(), nullable=False, server_default=""),
        sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("response_schema", JSONB(), nullable=True),
        sa.Column("payload", JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("tenant_id", "session_id", "raised_seq", name="pk_pending_inputs"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "session_id"],
            ["sessions.tenant_id", "sessions.id"],
            name="fk_pending_inputs_tenant_id_session_id_sessions",
            ondelete="CASCADE",
        ),
    )
    distribute("pending_inputs")  # on Citus only (citus_v1)
    op.create_index(
        "ix_pending_inputs_interrupt",
        "pending_inputs",
        ["tenant_id", "session_id", "interrupt_id"],
    )
    op.create_table(
        "session_markers",
        sa.Column("tenant_id", sa.Text(collation="C"), nullable=False),
        sa.Column("session_id", UUID(as_uuid=True), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(collation="C"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column("marked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "session_id", "kind", name="pk_session_markers"),
        sa.CheckConstraint("kind IN ('aborted', 'interrupted')", name="ck_session_markers_kind"),
    )
    distribute("session_markers")
    _protect("pending_inputs")
    _protect("session_markers")


# What upgrade finds in its way on a rerun (ddl_v1).
_COLUMNS = {
    "pending_inputs": (
        "tenant_id text",
        "session_id uuid",
        "raised_seq integer",
        "interrupt_id text",
        "message text",
        "author text",
        "raised_at timestamp with time zone",
        "response_schema jsonb",
        "payload jsonb",
    ),
    "session_markers": (
        "tenant_id text",
        "session_id uuid",
        "kind text",
        "scope text",
        "reason text",
        "marked_at timestamp with time zone",
    ),
}
_SESSIONS_ADDED = {
    "pending_count": "integer",
    "is_aborted": "boolean",
    "is_interrupted": "boolean",
    "state": "text",
}
_INDEXES = {
    "pk_pending_inputs": "pending_inputs",
    "ix_pending_inputs_interrupt": "pending_inputs",
    "pk_session_markers": "session_markers",
    "ix_sessions_state_recent": "sessions",
}


def _check() -> None:
    ddl.check(
        *(ddl.relation_check(table, columns=columns) for table, columns in _COLUMNS.items()),
        *(
            ddl.policies_check(table, {"tenant_isolation": ddl.TENANT_ISOLATION})
            for table in _COLUMNS
        ),
        ddl.relation_check("sessions", having=_SESSIONS_ADDED),
        *(ddl.relation_check(name, "index", on=table) for name, table in _INDEXES.items()),
    )


def upgrade() -> None:
    _check()
    # In this revision's transaction: the two new tables (nobody uses them yet).
    if (
        context.is_offline_mode()
        or op.get_bind().execute(sa.text("SELECT to_regclass('session_markers')")).scalar() is None
    ):
        _create_tables()
    with op.get_context().autocommit_block():
        # One statement, one rewrite of sessions (the generated column); the
        # other columns have constant defaults.
        ddl.run(
            "ALTER TABLE sessions "
            "ADD COLUMN IF NOT EXISTS pending_count integer NOT NULL DEFAULT 0, "
            "ADD COLUMN IF NOT EXISTS is_aborted boolean NOT NULL DEFAULT false, "
            "ADD COLUMN IF NOT EXISTS is_interrupted boolean NOT NULL DEFAULT false, "
            f"ADD COLUMN IF NOT EXISTS state text GENERATED ALWAYS AS ({_STATE}) STORED NOT NULL"
        )
        ddl.add_check("sessions", "ck_sessions_ck_sessions_pending_count", "pending_count >= 0")
        ddl.create_index(
            "ix_sessions_state_recent",
            "sessions (tenant_id, state, updated_at DESC, id DESC) WHERE state <> 'idle'",
        )
        if ddl.bypasses_rls():
            op.execute(_DERIVE)
            op.execute(_COUNT)
        else:
            # Lift FORCE for this step only, in one transaction, so a plain
            # owner sees every tenant; the same transaction restores it.
            ddl.run(
                "ALTER TABLE sessions NO FORCE ROW LEVEL SECURITY",
                "ALTER TABLE messages NO FORCE ROW LEVEL SECURITY",
                _DERIVE,
                _COUNT,
                "ALTER TABLE sessions FORCE ROW LEVEL SECURITY",
                "ALTER TABLE messages FORCE ROW LEVEL SECURITY",
            )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: the markers (pending inputs are re-derived)."""
    lost = []
    for kind in ("aborted", "interrupted"):
        n = ddl.count_rows(bind, "session_markers", f"kind = '{kind}'")
        if n:
            lost.append(f"{n} {kind} markers (session_markers): those sessions turn idle")
    return lost


def downgrade() -> None:
    op.drop_table("session_markers")
    op.drop_table("pending_inputs")
    op.drop_index("ix_sessions_state_recent", table_name="sessions")
    op.drop_constraint("ck_sessions_pending_count", "sessions", type_="check")
    for column in ("state", "is_interrupted", "is_aborted", "pending_count"):
        op.drop_column("sessions", column)
