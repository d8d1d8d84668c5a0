"""The pre-sessions schema: one messages table, a conversation per (agent_id, scope).

Revision ID: 20260801000001
Revises:
Create Date: 2026-08-01

Why it exists: cortex's history starts from the schema of the release before
sessions existed, so databases created by that release upgrade in place. On
such a database this revision is already recorded (or is stamped); on a new
one it creates the legacy table that later revisions reshape. Not safe to run
twice by hand: Alembic records it and never does.

Safe with: the legacy release (it is that release's schema). Downgrade: drops
``messages`` and every message in it (see :func:`data_loss`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20260801000001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    ddl.check(ddl.relation_check("messages"), ddl.relation_check("messages_pkey", "index"))
    op.create_table(
        "messages",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("agent_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="messages_pkey"),
    )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: every message."""
    n = ddl.count_rows(bind, "messages")
    return [f"{n} messages"] if n else []


def downgrade() -> None:
    op.drop_table("messages")
