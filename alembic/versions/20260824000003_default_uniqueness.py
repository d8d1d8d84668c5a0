"""At most one default session per (agent, exact scope), enforced by the database.

Revision ID: 20260824000003
Revises: 20260824000002
Create Date: 2026-08-24

Why it exists: "the thread a run uses when it names none" must be unique even
under concurrent get-or-create. A partial unique index (not a constraint) is
what ``INSERT ... ON CONFLICT (tenant_id, agent_id, scope) WHERE is_default``
infers as its arbiter; a deferrable exclusion constraint would break that
(postgres-design.md, Q5). Its own revision so a database holding duplicate
defaults fails here, clearly, before any data moves. Alembic records it; not
re-entrant by hand.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "20260824000003"
down_revision: str | Sequence[str] | None = "20260824000002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "uq_sessions_default",
        "sessions",
        ["tenant_id", "agent_id", "scope"],
        unique=True,
        postgresql_where=sa.text("is_default"),
    )


def downgrade() -> None:
    op.drop_index("uq_sessions_default", table_name="sessions")
