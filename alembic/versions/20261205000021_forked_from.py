"""A session forked from another names its source: ``sessions.forked_from_id`` and ``forked_from_seq``.

Revision ID: 20261205000021
Revises: 20261205000020
Create Date: 2026-12-05

Why it exists: ``Store.fork_session`` makes a new session holding copies of
another's messages up to a position, and the new session says where it came
from (``Session.forked_from``: the source's id and that position). The
source may be deleted later, so the lineage is kept on the fork itself, not
derived from the source:

- ``sessions.forked_from_id`` (uuid): the source session's id, in the same
  tenant; NULL on every session not made by a fork. No foreign key: the
  lineage outlives its source;
- ``sessions.forked_from_seq`` (integer): the source's last copied ``seq``
  (0 for an empty fork); NULL exactly when ``forked_from_id`` is.

Safe with: every release from 20261201000009 on (they never read the
columns and leave them NULL on what they write). Online: two nullable
columns without defaults in one statement, a catalog change under a short
lock timeout with retries; on Citus the change propagates to every shard.

Downgrade drops both columns: the forks stay, with their messages, as
plain sessions; only their lineage is lost (``data_loss`` counts them).
"""

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex.errors import SchemaMismatch

revision: str = "20261205000021"
down_revision: str | Sequence[str] | None = "20261205000020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

ADD: Final = (
    "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS forked_from_id uuid,"
    " ADD COLUMN IF NOT EXISTS forked_from_seq integer"
)
DROP: Final = (
    "ALTER TABLE sessions DROP COLUMN IF EXISTS forked_from_id,"
    " DROP COLUMN IF EXISTS forked_from_seq"
)

# Each column this revision adds, and its type: one of that name and another type is not cortex's.
COLUMNS: Final = (("forked_from_id", "uuid"), ("forked_from_seq", "integer"))


def _check_types() -> None:
    """Refuse a column of this revision's names and another type (nothing is changed)."""
    if op.get_context().as_sql:
        return
    for column, wanted in COLUMNS:
        found = (
            op.get_bind()
            .execute(
                sa.text(
                    "SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)"
                    " FROM pg_catalog.pg_attribute AS a"
                    " WHERE a.attrelid = pg_catalog.to_regclass('public.sessions')"
                    " AND a.attname = :c AND NOT a.attisdropped"
                ),
                {"c": column},
            )
            .scalar()
        )
        if found is not None and found != wanted:
            raise SchemaMismatch(
                f"column sessions.{column} exists with type {found}, not {wanted}: cortex did"
                " not make it; drop or rename it, then run the migration again"
            )


def upgrade() -> None:
    _check_types()
    with op.get_context().autocommit_block():
        ddl.run(ADD)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: the lineage of forked sessions."""
    n = ddl.count_rows(bind, "sessions", "forked_from_id IS NOT NULL")
    return [f"{n} forked sessions' lineage (sessions.forked_from_id, forked_from_seq)"] if n else []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        ddl.run(DROP)
