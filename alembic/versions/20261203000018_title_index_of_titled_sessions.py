"""The title search index holds titled sessions only: an append to an untitled session skips it.

Revision ID: 20261203000018
Revises: 20261202000017
Create Date: 2026-12-03

Why it exists: no update of a session's row is HOT (``updated_at`` leads
every listing index), so every append gives every index on ``sessions`` an
entry for the row's new version, ``ix_sessions_tenant_title_trgm`` included,
whether or not the session has a title. Sessions created by agent frameworks
(ADK's, the Agents SDK's, a run's default session) have none, and for them
that entry (the tenant's key and the empty title's, into the GIN's pending
list, later merged into the index) bought nothing. Measured with 8 tasks
appending to their own untitled sessions (``python -m benchmarks indexes``,
docs/benchmarks.md): 3,483 bytes of WAL per append with the full index,
3,298 with the partial one, the same as with no title index at all; the
index's pages are no longer touched (``tests/integration/test_title_index.py``).
The machine's CPU per append moved less than the measurement's spread.

The index becomes partial, ``WHERE title <> ''``, and the two functions
that search a whole tenant through it (``cortex_search_ids``,
``cortex_tenant_search``) test ``title <> ''`` in the title's arm of their
match, which is what lets the planner use a partial index there. The match
is the same: an empty title contains no term, and a search term is never
empty (``ListFilter.search``: an empty one is no search).

Safe with: every cortex release from 20261201000009 on (the functions keep
their signatures and results; no statement of cortex's reads the index but
theirs). Online: the functions are replaced first (their new form is served
by the old index as well), then the partial index is built ``CONCURRENTLY``
beside the old one, the old one dropped ``CONCURRENTLY`` and the new one
renamed under a short lock timeout with retries; a run killed at any step
runs again from the top. On Citus ``CREATE OR REPLACE FUNCTION`` and the
index build propagate to every node and shard.

Downgrade rebuilds the full index the same way, then restores the functions'
earlier text. Nothing is lost.
"""

from collections.abc import Sequence
from typing import Final

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261203000018"
down_revision: str | Sequence[str] | None = "20261202000017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

NAME: Final = "ix_sessions_tenant_title_trgm"
PARTIAL: Final = "sessions USING gin (tenant_id, title gin_trgm_ops) WHERE title <> ''"
FULL: Final = "sessions USING gin (tenant_id, title gin_trgm_ops)"

# The title's arm of the match, before and after.
MATCH_ANY_TITLE: Final = "s.title ILIKE pattern ESCAPE '/'"
MATCH_TITLED: Final = "(s.title <> '' AND s.title ILIKE pattern ESCAPE '/')"

# As revisions 20261201000008 (cortex_search_ids) and 20261201000012
# (cortex_tenant_search) left them, the title's arm a placeholder: search_path
# pinned with pg_temp last, every object schema-qualified, the schema resolved
# by the server when the migration runs (online and in offline SQL alike).
FUNCTIONS: Final = """
DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_search_ids(pattern text) RETURNS SETOF uuid
        LANGUAGE sql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
            SELECT s.id FROM %1$I.sessions AS s
            WHERE s.tenant_id = pg_catalog.current_setting('cortex.tenant', true)
              AND ({title} OR s.last_message ILIKE pattern ESCAPE '/')
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_tenant_search(tenant text, pattern text)
        RETURNS uuid[]
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        BEGIN
            IF tenant IS DISTINCT FROM pg_catalog.current_setting('cortex.tenant', true) THEN
                RETURN '{{}}';
            END IF;
            RETURN ARRAY(
                SELECT s.id FROM %1$I.sessions AS s
                WHERE s.tenant_id = tenant
                  AND ({title} OR s.last_message ILIKE pattern ESCAPE '/')
            );
        END
        $body$
    $function$, pg_catalog.current_schema());
END
$migration$
"""


def upgrade() -> None:
    ddl.check(
        ddl.function_check("cortex_search_ids", "text"),
        ddl.function_check("cortex_tenant_search", "text, text"),
        ddl.relation_check(NAME, "index", on="sessions"),
        ddl.relation_check(f"{NAME}_next", "index", on="sessions"),
    )
    op.execute(FUNCTIONS.format(title=MATCH_TITLED))
    with op.get_context().autocommit_block():
        if ddl.is_partial(NAME) is not True:
            ddl.replace_index(NAME, PARTIAL)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (an index and two functions' text)."""
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        if ddl.is_partial(NAME) is not False:
            ddl.replace_index(NAME, FULL)
    op.execute(FUNCTIONS.format(title=MATCH_ANY_TITLE))
