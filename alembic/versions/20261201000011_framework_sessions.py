"""What agent frameworks need of a session store: keys, payloads, state documents.

Revision ID: 20261201000011
Revises: 20261201000009
Create Date: 2026-12-01

Why it exists: Google ADK and the OpenAI Agents SDK name a session with any
string the host picks, store structured events or items rather than text,
and keep state (per session, per app, per user) that changes atomically with
the events that carry it. This revision adds, expand only:

- ``sessions.session_key``: the host-chosen key (unique per tenant, agent and
  exact scope, by the partial unique index ``uq_sessions_key``);
- ``sessions.data``: the session's state document (jsonb object whose values
  are each the JSON text of the host's value, so a value comes back exactly
  as it was sent and a delta merges key by key with ``||``);
- ``messages.payload_json``: a message's structured payload, the JSON text
  verbatim (``json`` keeps its input text);
- ``scope_data``: one state document per scope, shared by every session
  beneath it; tenant first in its key, row-level security like every table.

Safe for the previous release, which neither reads nor writes the new
columns or table: nullable columns without defaults are catalog-only
changes; the size check is added ``NOT VALID`` (no scan under the table
lock) and validated afterwards under a lock that lets reads and writes
through. The partial unique index ``uq_sessions_key`` is built in the
migration's transaction: writes to ``sessions`` wait for one scan of the
table (reads go on). On a large table, build it beforehand with ``CREATE
UNIQUE INDEX CONCURRENTLY`` and the same definition; the migration then
finds it (``IF NOT EXISTS``) and only records the revision.

Downgrade drops what upgrade added (the data in it is lost).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSON, JSONB

from alembic import op

revision: str = "20261201000011"
down_revision: str | Sequence[str] | None = "20261201000009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MATCH = "tenant_id = current_setting('cortex.tenant', true)"
# cortex.models.MAX_DATA_BYTES, as stored (jsonb's text form).
_DATA_LIMIT = "octet_length(data::text) <= 1048576"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("session_key", sa.Text(collation="C"), nullable=True))
    op.add_column("sessions", sa.Column("data", JSONB(), nullable=True))
    op.add_column("messages", sa.Column("payload_json", JSON(), nullable=True))
    op.execute(
        f"ALTER TABLE sessions ADD CONSTRAINT ck_sessions_data_size CHECK ({_DATA_LIMIT}) NOT VALID"
    )
    op.create_table(
        "scope_data",
        sa.Column("tenant_id", sa.Text(collation="C"), nullable=False),
        sa.Column("scope", sa.Text(collation="C"), nullable=False),
        sa.Column("data", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("tenant_id", "scope", name="pk_scope_data"),
        sa.CheckConstraint(
            "tenant_id = split_part(scope, '/', 1)", name="ck_scope_data_scope_tenant"
        ),
        sa.CheckConstraint(_DATA_LIMIT, name="ck_scope_data_data_size"),
    )
    op.execute("ALTER TABLE scope_data ENABLE ROW LEVEL SECURITY")
    op.execute("ALTER TABLE scope_data FORCE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY tenant_isolation ON scope_data USING ({_MATCH}) WITH CHECK ({_MATCH})"
    )
    # VALIDATE takes SHARE UPDATE EXCLUSIVE: reads and writes go on while it scans.
    op.execute("ALTER TABLE sessions VALIDATE CONSTRAINT ck_sessions_data_size")
    # Not CONCURRENTLY: that cannot run while a second deploy job waits on the
    # migration lock (it waits for that job's transaction, which waits for it).
    # IF NOT EXISTS: on a large table, build it by hand first with
    # CREATE UNIQUE INDEX CONCURRENTLY (same definition); this then skips it.
    op.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS uq_sessions_key"
        " ON sessions (tenant_id, agent_id, scope, session_key)"
        " WHERE session_key IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index("uq_sessions_key", table_name="sessions")
    op.drop_table("scope_data")
    op.execute("ALTER TABLE sessions DROP CONSTRAINT ck_sessions_data_size")
    op.drop_column("messages", "payload_json")
    op.drop_column("sessions", "data")
    op.drop_column("sessions", "session_key")
