"""At most one default session per (agent, exact scope), enforced by the database.

Revision ID: 20260824000003
Revises: 20260824000002
Create Date: 2026-08-24

Why it exists: "the thread a run uses when it names none" must be unique even
under concurrent get-or-create. A partial unique index (not a constraint) is
what ``INSERT ... ON CONFLICT (tenant_id, agent_id, scope) WHERE is_default``
infers as its arbiter; a deferrable exclusion constraint would break that
(postgres-design.md, Q5). Its own revision so a database holding duplicate
defaults fails here, clearly, before any data moves.

Safe with: the legacy release (it never reads ``sessions``) and every cortex
release. Online: the index is built ``CONCURRENTLY``; a build killed half way
leaves an invalid index, which a rerun drops and builds again.

Downgrade: drops the index; no data is lost.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20260824000003"
down_revision: str | Sequence[str] | None = "20260824000002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        ddl.create_index(
            "uq_sessions_default",
            "sessions (tenant_id, agent_id, scope) WHERE is_default",
            unique=True,
        )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing."""
    return []


def downgrade() -> None:
    op.drop_index("uq_sessions_default", table_name="sessions")
