"""Host-owned metadata stored verbatim: ``metadata_json`` (json) beside the jsonb column.

Revision ID: 20261201000009
Revises: 20261201000008
Create Date: 2026-12-01

Why it exists: jsonb normalises what it stores. ``1e16`` came back as an
int, ``1e300`` as 301 digits, ``-0.0`` as ``0.0``, and ``[5e-324]*9000``
grew from 63 KB sent to 2.95 MB stored, after which ``update_session`` of
the session as read failed cortex's own 64 KiB limit. The ``json`` type keeps
its input text exactly (it only checks the syntax), so cortex now writes the
JSON text it serialised from the host's value into ``sessions.metadata_json``
and ``messages.metadata_json`` and decodes that on read.

Safe with: this release. With the previous release (20261015000007)
still running beside it, this release reads everything the previous one
writes (a trigger drops the verbatim text of a session whose jsonb the
previous release rewrites, so the rewrite is what is read), but the
previous release reads ``{}`` as the metadata of rows this one wrote: it
reads only the jsonb column, and this release keeps no jsonb copy (the copy
is what grew ``[5e-324]*9000`` from 63 KB to 2.95 MB). Expand only, and
online: two nullable columns without a default are a catalog change (a
brief ACCESS EXCLUSIVE lock, no table rewrite, no scan). Rows written
before this revision keep their metadata in the jsonb ``metadata`` column,
which cortex reads when ``metadata_json`` is NULL; rows written since carry
``'{}'`` there. No backfill: jsonb already lost what
the old rows were sent, so copying it would keep nothing more. A later
revision may drop the jsonb column once no reader needs it.

Downgrade copies ``metadata_json`` back into ``metadata`` (one UPDATE per
table over the rows that have it; jsonb normalises the values again), then
drops the columns. Alembic records the revision; not re-entrant by hand.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000009"
# The oldest code (its SCHEMA_REVISION) that works on a database at this
# revision: see cortex._engine.check_schema and revision 20261201000010. Not
# the previous release: it would read this one's metadata as {}.
safe_with_code_from: str = "20261201000009"
down_revision: str | Sequence[str] | None = "20261201000008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("sessions", "messages")


# The previous release writes only the jsonb column. When it rewrites a
# session's metadata (its update_session), the verbatim text this release
# wrote is stale: drop it, so this release reads what the previous one wrote.
# Fires only for UPDATEs that name the column: appends never do.
FORGET_TEXT = """
CREATE OR REPLACE FUNCTION cortex_forget_metadata_text() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NEW.metadata IS DISTINCT FROM OLD.metadata
       AND NEW.metadata_json::text IS NOT DISTINCT FROM OLD.metadata_json::text THEN
        NEW.metadata_json := NULL;
    END IF;
    RETURN NEW;
END
$fn$
"""
TRIGGER = "cortex_sessions_metadata_as_jsonb"
# Not on Citus: it refuses triggers on distributed tables, and a Citus
# database serves only this release (citus_v1.distribute_sql).
CREATE_TRIGGER = ddl.unless_distributed_sql(
    "sessions",
    f"""
    DROP TRIGGER IF EXISTS {TRIGGER} ON sessions;
    CREATE TRIGGER {TRIGGER} BEFORE UPDATE OF metadata ON sessions
        FOR EACH ROW EXECUTE FUNCTION cortex_forget_metadata_text();""",
)


def upgrade() -> None:
    ddl.check(
        *(ddl.relation_check(table, having={"metadata_json": "json"}) for table in TABLES),
        ddl.function_check("cortex_forget_metadata_text", ""),
    )
    with op.get_context().autocommit_block():
        for table in TABLES:
            # A short lock timeout with retries (ddl_v1): the catalog change
            # must not queue the running release behind a long transaction.
            ddl.run(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS metadata_json json")
        ddl.run(FORGET_TEXT)
        ddl.run(CREATE_TRIGGER)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing; the values go back into jsonb.

    Only their spelling is normalised again (as before this revision).
    """
    return []


# Citus refuses even DROP TRIGGER IF EXISTS on a distributed table, where
# the trigger was never made: drop it only where it is.
DROP_TRIGGER = ddl.drop_trigger_sql(TRIGGER, "sessions")


def downgrade() -> None:
    op.execute(DROP_TRIGGER)
    op.execute("DROP FUNCTION IF EXISTS cortex_forget_metadata_text()")
    for table in TABLES:
        op.execute(
            f"UPDATE {table} SET metadata = metadata_json::jsonb WHERE metadata_json IS NOT NULL"
        )
        op.drop_column(table, "metadata_json")
