"""Sessions: the sessions table, and messages reshaped to belong to one.

Revision ID: 20260824000002
Revises: 20260801000001
Create Date: 2026-08-24

Why it exists: a conversation becomes a first-class *session* with a title,
metadata, counters and listing indexes; a message gets its session, a gap-free
``seq``, and the fields the operator surface needs. Legacy rows keep their
(agent_id, scope) and stay unsessioned (session_id NULL) until the backfill
revision gives them a session.

Citus-ready: ``tenant_id`` (first scope segment) leads every key. Legacy rows
get theirs from their scope in one UPDATE here (a full rewrite of the legacy
table, done once, inside this revision's transaction).

Downgrade: cortex-written messages get their session's (agent_id, scope) so
the legacy schema's NOT NULLs hold again; conversations stay readable by the
old release. Safe to run twice? Alembic records it; it is not re-entrant by hand.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from alembic import op
from cortex.migrate import distribute

revision: str = "20260824000002"
down_revision: str | Sequence[str] | None = "20260801000001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ORDER = (sa.text("updated_at DESC"), sa.text("id DESC"))


def upgrade() -> None:
    # pg_trgm is a trusted extension (PostgreSQL 13+): the database owner may create it.
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.create_table(
        "sessions",
        sa.Column("tenant_id", sa.Text(collation="C"), nullable=False),
        sa.Column("id", UUID(as_uuid=True), nullable=False),
        sa.Column("agent_id", sa.Text(collation="C"), nullable=False),
        sa.Column("scope", sa.Text(collation="C"), nullable=False),
        sa.Column("scope_depth", sa.SmallInteger(), nullable=False),
        sa.Column("scope_l2", sa.Text(collation="C"), nullable=True),
        sa.Column("title", sa.Text(), nullable=False, server_default=""),
        sa.Column("metadata", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("message_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_message", sa.Text(), nullable=False, server_default=""),
        sa.Column("backfilled_by", sa.Text(), nullable=False, server_default=""),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_sessions"),
        sa.CheckConstraint("scope_depth BETWEEN 1 AND 8", name="ck_sessions_scope_depth"),
        sa.CheckConstraint("message_count >= 0", name="ck_sessions_message_count"),
        sa.CheckConstraint(
            "tenant_id = split_part(scope, '/', 1)", name="ck_sessions_scope_tenant"
        ),
    )
    distribute("sessions")  # on Citus only (cortex.migrate)
    op.create_index("ix_sessions_tenant_recent", "sessions", ["tenant_id", *_ORDER])
    op.create_index("ix_sessions_agent_recent", "sessions", ["tenant_id", "agent_id", *_ORDER])
    op.create_index("ix_sessions_scope_recent", "sessions", ["tenant_id", "scope", *_ORDER])
    op.create_index(
        "ix_sessions_agent_scope_recent", "sessions", ["tenant_id", "agent_id", "scope", *_ORDER]
    )
    op.create_index(
        "ix_sessions_l2_recent",
        "sessions",
        ["tenant_id", "scope_l2", *_ORDER],
        postgresql_where=sa.text("scope_depth >= 2"),
    )
    op.create_index(
        "ix_sessions_agent_l2_recent",
        "sessions",
        ["tenant_id", "agent_id", "scope_l2", *_ORDER],
        postgresql_where=sa.text("scope_depth >= 2"),
    )
    op.create_index(
        "ix_sessions_title_trgm",
        "sessions",
        ["title"],
        postgresql_using="gin",
        postgresql_ops={"title": "gin_trgm_ops"},
    )
    op.create_index(
        "ix_sessions_last_message_trgm",
        "sessions",
        ["last_message"],
        postgresql_using="gin",
        postgresql_ops={"last_message": "gin_trgm_ops"},
    )

    # Reshape messages. Legacy rows: tenant from the scope's first segment.
    op.add_column("messages", sa.Column("tenant_id", sa.Text(collation="C"), nullable=True))
    op.execute("UPDATE messages SET tenant_id = split_part(scope, '/', 1)")
    op.alter_column("messages", "tenant_id", nullable=False)
    op.add_column("messages", sa.Column("session_id", UUID(as_uuid=True), nullable=True))
    op.add_column("messages", sa.Column("seq", sa.Integer(), nullable=True))
    op.add_column("messages", sa.Column("author", sa.Text(), nullable=False, server_default=""))
    op.add_column("messages", sa.Column("requested_input", JSONB(), nullable=True))
    op.add_column("messages", sa.Column("function_response", JSONB(), nullable=True))
    op.add_column(
        "messages",
        sa.Column("metadata", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.alter_column("messages", "agent_id", nullable=True)
    op.alter_column("messages", "scope", nullable=True)
    op.drop_constraint("messages_pkey", "messages", type_="primary")
    op.create_primary_key("pk_messages", "messages", ["tenant_id", "id"])
    distribute("messages")  # keyed by tenant now; before its foreign key into sessions
    op.create_foreign_key(
        "fk_messages_tenant_id_session_id_sessions",
        "messages",
        "sessions",
        ["tenant_id", "session_id"],
        ["tenant_id", "id"],
        ondelete="CASCADE",
    )
    op.create_check_constraint(
        "ck_messages_session_seq", "messages", "(session_id IS NULL) = (seq IS NULL)"
    )
    op.create_index(
        "uq_messages_session_seq", "messages", ["tenant_id", "session_id", "seq"], unique=True
    )
    op.create_index(
        "ix_messages_unsessioned",
        "messages",
        ["tenant_id", "agent_id", "scope", "created_at"],
        postgresql_where=sa.text("session_id IS NULL"),
    )


def downgrade() -> None:
    # Give cortex-written rows the legacy conversation key of their session.
    op.execute(
        """
        UPDATE messages AS m
        SET agent_id = s.agent_id, scope = s.scope
        FROM sessions AS s
        WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id AND m.scope IS NULL
        """
    )
    op.drop_index("ix_messages_unsessioned", table_name="messages")
    op.drop_index("uq_messages_session_seq", table_name="messages")
    op.drop_constraint("ck_messages_session_seq", "messages", type_="check")
    op.drop_constraint("fk_messages_tenant_id_session_id_sessions", "messages", type_="foreignkey")
    op.drop_constraint("pk_messages", "messages", type_="primary")
    op.create_primary_key("messages_pkey", "messages", ["id"])
    op.alter_column("messages", "agent_id", nullable=False)
    op.alter_column("messages", "scope", nullable=False)
    for column in (
        "metadata",
        "function_response",
        "requested_input",
        "author",
        "seq",
        "session_id",
        "tenant_id",
    ):
        op.drop_column("messages", column)
    op.drop_table("sessions")
