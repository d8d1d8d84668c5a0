"""Tenant-wide search that a Citus coordinator can route: the tenant as an argument.

Revision ID: 20261201000012
Revises: 20261201000011
Create Date: 2026-12-01

Why it exists: a whole-tenant search finds its candidates through a
``SECURITY DEFINER`` function (revision 20261015000007), because under
row-level security PostgreSQL will not run the non-leakproof ``ILIKE`` inside
the tenant-led trigram indexes. ``cortex_search_ids(pattern)`` reads the
tenant from ``cortex.tenant`` and is called inside the listing statement.
On Citus neither works: a function that reads a distributed table cannot
run inside a query routed to a shard, and a tenant taken from a setting
cannot route the function's own query. Searches on Citus filtered the
listing walk instead, which reads every session of the tenant that does not
match.

``cortex_tenant_search(tenant, pattern)`` returns the matching ids as one
array, for its own statement. Its query filters ``tenant_id`` by the
argument, so on Citus it is a router query to the tenant's shard, where the
trigram indexes serve it; it returns nothing unless ``tenant`` is the tenant
bound to the transaction (``cortex.tenant`` on the node that runs it): the
ids of the tenant the caller is bound to, which the policy shows it. (On
Citus a binding made with ``set_config()`` rather than ``SET LOCAL`` is not
replayed on the workers, so the policy there shows nothing while this
function still answers for the bound tenant: no more than the caller could
read by binding the same tenant with ``SET LOCAL``.) Like ``cortex_search_ids`` it uses the indexes when its owner is
a superuser or has BYPASSRLS, and is otherwise as correct, and as slow, as
the policy makes it. EXECUTE is granted only by ``cortex db grant``.

Safe with: every cortex release from 20261201000009 on (nothing reads or
writes differently; older code never calls the function). One catalog
change; safe to run twice. Downgrade drops the function; no data is lost.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000012"
down_revision: str | Sequence[str] | None = "20261201000011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

# As revision 20261201000008 left cortex_search_ids: search_path pinned with
# pg_temp last, every object schema-qualified, the schema resolved by the
# server when the migration runs (online and in the offline SQL alike).
FUNCTION = """
DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_tenant_search(tenant text, pattern text)
        RETURNS uuid[]
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        BEGIN
            IF tenant IS DISTINCT FROM pg_catalog.current_setting('cortex.tenant', true) THEN
                RETURN '{}';
            END IF;
            RETURN ARRAY(
                SELECT s.id FROM %1$I.sessions AS s
                WHERE s.tenant_id = tenant
                  AND (s.title ILIKE pattern ESCAPE '/' OR s.last_message ILIKE pattern ESCAPE '/')
            );
        END
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'REVOKE ALL ON FUNCTION %I.cortex_tenant_search(text, text) FROM PUBLIC',
        pg_catalog.current_schema()
    );
END
$migration$
"""


def upgrade() -> None:
    ddl.check(ddl.function_check("cortex_tenant_search", "text, text"))
    op.execute(FUNCTION)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing."""
    return []


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS cortex_tenant_search(text, text)")
