"""Tenant-wide search that row-level security cannot defeat.

Revision ID: 20261015000007
Revises: 20261001000006
Create Date: 2026-10-15

Why it exists: under row-level security PostgreSQL evaluates the tenant
policy before any user condition that is not leakproof, and ``ILIKE`` is
not, so it never runs inside the trigram indexes: a search across a whole
large tenant scanned the tenant (260 ms for 200,000 sessions; see
docs/query-plans.md, P1). Two changes:

- the trigram indexes lead with ``tenant_id`` (``btree_gin``, a trusted
  extension), so a search touches only its tenant's matches (P2), and are
  keyed like every other index (Citus-ready);
- ``cortex_search_ids(pattern)``, a ``SECURITY DEFINER`` SQL function owned by
  the role that runs the migrations, returns the ids of the *bound tenant's*
  sessions whose title or preview matches. It reads ``cortex.tenant`` itself,
  exactly as the policy does, so it shows nothing the policy would not; the
  store ANDs its scope predicate on top. If the owner is a superuser or has
  BYPASSRLS the function uses the indexes; otherwise the policy still applies
  inside it and search is as correct, and as slow, as before. EXECUTE is
  granted only by ``cortex db grant``.

Safe with: the legacy release (it never touches ``sessions``) and every
cortex release: the old trigram indexes stay until the new ones are built
(both ``CONCURRENTLY``), so a search is never without its index. Safe to run
twice (each step checks the catalog). Downgrade: rebuilds the old indexes and
drops the function; no data is lost.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261015000007"
down_revision: str | Sequence[str] | None = "20261001000006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = """
CREATE OR REPLACE FUNCTION cortex_search_ids(pattern text) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, public
AS $$
    SELECT id FROM sessions
    WHERE tenant_id = current_setting('cortex.tenant', true)
      AND (title ILIKE pattern ESCAPE '/' OR last_message ILIKE pattern ESCAPE '/')
$$
"""


_INDEXES = ("ix_sessions_tenant_title_trgm", "ix_sessions_tenant_last_message_trgm")


def upgrade() -> None:
    ddl.check(
        ddl.extension_check("btree_gin"),
        ddl.function_check("cortex_search_ids", "text"),
        *(ddl.relation_check(name, "index", on="sessions") for name in _INDEXES),
    )
    with op.get_context().autocommit_block():
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
        ddl.create_index(
            "ix_sessions_tenant_title_trgm",
            "sessions USING gin (tenant_id, title gin_trgm_ops)",
        )
        ddl.create_index(
            "ix_sessions_tenant_last_message_trgm",
            "sessions USING gin (tenant_id, last_message gin_trgm_ops)",
        )
        ddl.drop_index("ix_sessions_title_trgm")
        ddl.drop_index("ix_sessions_last_message_trgm")
        op.execute(FUNCTION)
        op.execute("REVOKE ALL ON FUNCTION cortex_search_ids(text) FROM PUBLIC")


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing."""
    return []


def downgrade() -> None:
    op.execute("DROP FUNCTION cortex_search_ids(text)")
    op.drop_index("ix_sessions_tenant_last_message_trgm", table_name="sessions")
    op.drop_index("ix_sessions_tenant_title_trgm", table_name="sessions")
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
