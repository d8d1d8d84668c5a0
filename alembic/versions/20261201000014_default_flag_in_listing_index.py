"""The whole-tenant listing index carries ``is_default``, so a default-only page reads only defaults.

Revision ID: 20261201000014
Revises: 20261201000013
Create Date: 2026-12-01

Why it exists: ``default_only`` across a whole tenant walked
``ix_sessions_tenant_recent (tenant_id, updated_at DESC, id DESC)`` and read
each session's row to test ``is_default``: at 1,000,000 sessions, 2.13 ms p95
in a 200,000-session tenant (about 8 rows read per default), the one page
shape over the 2 ms target. With ``is_default`` as the index's
last key column the test runs on the index entry, and only defaults are
read; the order the listing walks is unchanged (``(updated_at, id)`` is
unique). Not a partial index of defaults: that would add an index write to
every append to a default session, the hottest write there is; this is the
same number of indexes, one byte wider per entry.

Safe with: every cortex release from 20261201000009 on (an index change
only; every listing plan keeps a tenant-led index in the same order).
Online: the new index is built ``CONCURRENTLY`` beside the old one, the old
one dropped ``CONCURRENTLY``, and the new one renamed under a short lock
timeout with retries. Each step checks the catalog, so a run killed half way
runs again from the top. Downgrade rebuilds the old form the same way.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000014"
down_revision: str | Sequence[str] | None = "20261201000013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

NAME = "ix_sessions_tenant_recent"
WITH_FLAG = "sessions (tenant_id, updated_at DESC, id DESC, is_default)"
WITHOUT_FLAG = "sessions (tenant_id, updated_at DESC, id DESC)"


def upgrade() -> None:
    ddl.check(ddl.relation_check(f"{NAME}_next", "index", on="sessions"))
    with op.get_context().autocommit_block():
        ddl.rebuild_index(NAME, WITH_FLAG, 4)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (an index)."""
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        ddl.rebuild_index(NAME, WITHOUT_FLAG, 3)
