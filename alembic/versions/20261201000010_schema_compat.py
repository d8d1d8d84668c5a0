"""Record which code a database serves, so a rolling deploy can migrate first.

Revision ID: 20261201000010
Revises: 20261201000009
Create Date: 2026-12-01

Why it exists: ``cortex.connect`` refused any schema revision but its own,
so in a rolling deploy (migrate, then replace the processes) an instance of
the previous release that started after the migration refused to run,
although the revisions in between were written to be safe with it. Each
revision now states the oldest code it serves (``safe_with_code_from``:
the ``SCHEMA_REVISION`` of that code; a revision without it serves only code
of its own revision), and after every online run ``alembic/env.py`` stores,
in ``cortex_schema_compat``, the oldest code every applied revision serves.
A store whose revision lies between that and the database's accepts the
database (cortex._engine.check_schema).

Safe with: code of 20261201000009, which never reads the table. Online: a new, empty table. Safe to run twice. Its downgrade drops
the record, after which only code of the exact revision connects.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000010"
down_revision: str | Sequence[str] | None = "20261201000009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"


COLUMNS = ("singleton boolean", "oldest_code_revision text")


def upgrade() -> None:
    ddl.check(
        ddl.relation_check("cortex_schema_compat", columns=COLUMNS),
        ddl.relation_check("pk_cortex_schema_compat", "index", on="cortex_schema_compat"),
    )
    with op.get_context().autocommit_block():
        ddl.run(
            "CREATE TABLE IF NOT EXISTS cortex_schema_compat ("
            " singleton boolean DEFAULT true NOT NULL,"
            " oldest_code_revision text NOT NULL,"
            " CONSTRAINT pk_cortex_schema_compat PRIMARY KEY (singleton),"
            " CONSTRAINT ck_cortex_schema_compat_singleton CHECK (singleton))"
        )


def data_loss(bind: Connection) -> list[str]:
    """Nothing of the host's: the record is rewritten by the next upgrade run."""
    return []


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS cortex_schema_compat")
