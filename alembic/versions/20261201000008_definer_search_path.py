"""Pin the search path of every SECURITY DEFINER function, and qualify what it reads.

Revision ID: 20261201000008
Revises: 20261015000007
Create Date: 2026-12-01

Why it exists: ``cortex_search_ids()`` (revision 20261015000007) runs with
its owner's rights and named ``sessions`` unqualified under
``search_path = pg_catalog, public``. PostgreSQL searches the caller's
temporary schema *first* for relations unless ``pg_temp`` is listed, so an
application role could create ``TEMP VIEW sessions`` over a ``pg_temp``
function and have the owner run it: ``ALTER TABLE sessions DISABLE ROW LEVEL
SECURITY`` as a non-superuser owner, ``ALTER ROLE app BYPASSRLS`` as a
superuser one. The function is replaced with ``search_path = pg_catalog,
pg_temp`` (``pg_temp`` last, as the PostgreSQL manual prescribes for
SECURITY DEFINER functions) and every object it touches schema-qualified,
with the schema the tables live in resolved when the migration runs.

Safe with the previous release: the signature and result are unchanged, and
``CREATE OR REPLACE`` keeps the function's owner and its EXECUTE grants.
Safe to run twice. Its downgrade keeps the safe definition on purpose: the
old one is exploitable, and the two are otherwise the same.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000008"
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261015000007"
down_revision: str | Sequence[str] | None = "20261015000007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A DO block so the schema is resolved by the server at run time, the same in
# online runs and in the offline SQL `cortex db sql` prints.
SAFE_SEARCH_FUNCTION = """
DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_search_ids(pattern text) RETURNS SETOF uuid
        LANGUAGE sql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
            SELECT s.id FROM %1$I.sessions AS s
            WHERE s.tenant_id = pg_catalog.current_setting('cortex.tenant', true)
              AND (s.title ILIKE pattern ESCAPE '/' OR s.last_message ILIKE pattern ESCAPE '/')
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'REVOKE ALL ON FUNCTION %I.cortex_search_ids(text) FROM PUBLIC',
        pg_catalog.current_schema()
    );
END
$migration$
"""


def upgrade() -> None:
    ddl.check(ddl.function_check("cortex_search_ids", "text"))
    op.execute(SAFE_SEARCH_FUNCTION)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (it keeps the safe definition)."""
    return []


def downgrade() -> None:
    # Deliberately nothing: 20261015000007's definition differs only in being unsafe.
    pass
