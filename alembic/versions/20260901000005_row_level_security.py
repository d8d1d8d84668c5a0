"""Row-level security: the database's own wall between tenants.

Revision ID: 20260901000005
Revises: 20260824000004
Create Date: 2026-09-01

Why it exists: every cortex statement already carries its tenant and scope
predicate; this is the second wall, for a query that forgets it. Each table
gets ENABLE + FORCE ROW LEVEL SECURITY (FORCE: the owner is held to it too)
and one policy comparing ``tenant_id`` with the transaction-local setting
``cortex.tenant``, which the store sets with ``set_config(..., true)`` at the
start of every transaction. With no tenant bound the setting is NULL or ''
and matches no row: a plain role sees nothing. Superusers and BYPASSRLS
roles are exempt by PostgreSQL's design, so the service must not connect as one.

It comes after the backfill so the backfill, run as the owner, still sees
every tenant's rows; later data migrations can lift FORCE inside their own
transaction (DDL is transactional).

Safe with: every cortex release; the legacy release too when it connects as a
superuser or BYPASSRLS role (as its single database user usually did). A
legacy release connecting as a plain owner is held to FORCE and its inserts
are refused from here on: stop it before this revision.

Online: per table, ENABLE, FORCE and the policy are one statement (a DO block)
with a short lock timeout and retries; a rerun skips what is there.

Downgrade: drops the policies; no data is lost.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20260901000005"
down_revision: str | Sequence[str] | None = "20260824000004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("sessions", "messages")
_MATCH = "tenant_id = current_setting('cortex.tenant', true)"


def upgrade() -> None:
    # No policy but cortex's (replaced below): another one would open the table.
    ddl.check(
        *(ddl.relation_check(table) for table in _TABLES),
        *(ddl.policies_check(table, {"tenant_isolation": None}) for table in _TABLES),
    )
    with op.get_context().autocommit_block():
        for table in _TABLES:
            ddl.run(
                f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
                f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY",
                f"DROP POLICY IF EXISTS tenant_isolation ON {table}",
                f"CREATE POLICY tenant_isolation ON {table} USING ({_MATCH}) WITH CHECK ({_MATCH})",
            )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing."""
    return []


def downgrade() -> None:
    for table in _TABLES:
        op.execute(f"DROP POLICY tenant_isolation ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
