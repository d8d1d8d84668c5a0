"""A metadata filter finds its candidates in an index: ``ix_sessions_metadata_pairs``.

Revision ID: 20261205000024
Revises: 20261205000023
Create Date: 2026-12-05

Why it exists: ``ListFilter(metadata=...)`` was checked on each row the
listing walk read, so a filter matching 1 % of a tenant read about a
hundred rows for each one it listed (docs/benchmarks.md, 2026-12-02). This
revision adds:

- ``cortex_metadata_pairs(tenant, document, legacy)``: an ``IMMUTABLE`` SQL
  function giving, for each top-level key of a session's metadata (the
  verbatim ``json``, else a legacy row's ``jsonb``), one ``bigint``: a hash
  of the tenant, the key and the value's ``jsonb_hash_extended``. jsonb's
  hash agrees with jsonb equality (objects whatever their key order,
  numbers by value, ``true`` apart from ``1``), so two equal values give
  the same hash; a hash says nothing about a superset, unlike ``@>`` on
  the documents, and a collision only adds a candidate.
- ``ix_sessions_metadata_pairs``: a GIN index of those arrays, partial
  (``WHERE`` the metadata is not ``{}``), so an append to a session without
  metadata (most of them) gives it no entry. No update of a session is HOT,
  so an append to a session with metadata computes its pairs again.
- ``cortex_metadata_ids(tenant, filter, cap)``: a ``SECURITY DEFINER``
  function returning the ids of the bound tenant's sessions whose pairs
  contain the filter's (array containment, exact on the index: no recheck),
  or NULL when more than ``cap`` do, or when the planner's estimate from the
  index's statistics says so (a GIN scan reads every match: a common value
  is never probed). Extended statistics on the pairs
  (``cortex_sessions_metadata_pairs``) give that estimate its common values:
  the planner keeps none for a partial index's expression. They fill at the
  next ANALYZE (autovacuum's, or one run by hand after the upgrade). Row-level security keeps the
  application role's planner from running the non-leakproof ``@>`` inside
  the index, as for search (revision 20261015000007). Like
  ``cortex_tenant_search`` it answers only for the tenant bound to the
  transaction and filters ``tenant_id`` by its argument, so on Citus it is
  a router query to the tenant's shard. It uses the index when its owner is
  a superuser or has BYPASSRLS, and is otherwise as correct, and as slow,
  as the policy makes it. EXECUTE is granted only by ``cortex db grant``.

The store binds the ids in the listing, where the exact per-key check still
runs on them; a NULL (a filter matching many sessions) leaves the listing
walk as before, which finds a page early.

Safe with: every cortex release from 20261201000009 on (no statement of
theirs reads the index or calls the functions; their writes are indexed
like this release's). Online: the functions are created (no lock on any
table), the index is built ``CONCURRENTLY``; a run killed before the end
runs again from the top (an invalid index is rebuilt). On Citus the
functions propagate to every node and the index is built on every shard.

Downgrade drops the statistics, the index and both functions. Nothing is lost.
"""

from collections.abc import Sequence
from typing import Final

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261205000024"
down_revision: str | Sequence[str] | None = "20261205000023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

INDEX: Final = "ix_sessions_metadata_pairs"
# The planner keeps no statistics of a partial index's expressions; these give
# cortex_metadata_ids' estimate the pairs' most common values.
STATISTICS: Final = "cortex_sessions_metadata_pairs"
CREATE_STATISTICS: Final = (
    f"CREATE STATISTICS IF NOT EXISTS {STATISTICS}"
    " ON (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata)) FROM sessions"
)
# What a session's metadata reads as (cortex._sql.sessions.METADATA_TEXT) is not {}.
HAS_METADATA: Final = "COALESCE((metadata_json)::text, (metadata)::text) <> '{}'::text"
DEFINITION: Final = (
    "sessions USING gin (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata))"
    f" WHERE {HAS_METADATA}"
)

# search_path pinned with pg_temp last, every object schema-qualified, the
# schema resolved by the server when the migration runs (online and offline).
# The pairs' COST keeps a planner from computing them on each row it walks;
# the tenant's comparison in another (byte-order) collation than the column's
# keeps it out of the tenant-led trigram indexes, whose bitmap of every row of
# the tenant cost more than the candidates it narrowed.
FUNCTIONS: Final = """
DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_metadata_pairs(tenant text, document json, legacy jsonb)
        RETURNS bigint[]
        LANGUAGE sql IMMUTABLE PARALLEL SAFE COST 1000
        SET search_path = pg_catalog, pg_temp
        AS $body$
            SELECT pg_catalog.array_agg(
                pg_catalog.hashtextextended(
                    tenant OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) e.key,
                    pg_catalog.jsonb_hash_extended(e.value, 0)
                )
            )
            FROM pg_catalog.jsonb_each(
                CASE WHEN pg_catalog.jsonb_typeof(COALESCE(document::jsonb, legacy))
                          OPERATOR(pg_catalog.=) 'object'
                     THEN COALESCE(document::jsonb, legacy)
                     ELSE '{}'::jsonb END
            ) AS e
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_metadata_ids(tenant text, filter jsonb, cap integer)
        RETURNS uuid[]
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        SET plan_cache_mode = force_custom_plan
        SET enable_seqscan = off
        SET enable_indexscan = off
        SET max_parallel_workers_per_gather = 0
        AS $body$
        DECLARE
            found uuid[];
            plan json;
        BEGIN
            IF tenant IS DISTINCT FROM pg_catalog.current_setting('cortex.tenant', true) THEN
                RETURN '{}';
            END IF;
            -- The planner's estimate, from the index's statistics: a GIN scan
            -- reads every match, so a filter expected to match more than cap
            -- is not probed at all (EXPLAIN makes the function VOLATILE).
            EXECUTE pg_catalog.format(
                'EXPLAIN (FORMAT JSON) SELECT 1 FROM %1$I.sessions AS s'
                ' WHERE COALESCE(s.metadata_json::text, s.metadata::text)'
                ' OPERATOR(pg_catalog.<>) ''{}'''
                ' AND %1$I.cortex_metadata_pairs(s.tenant_id, s.metadata_json, s.metadata)'
                ' OPERATOR(pg_catalog.@>) %%L::bigint[]',
                %1$I.cortex_metadata_pairs(tenant, NULL, filter)
            ) INTO plan;
            IF (plan -> 0 -> 'Plan' ->> 'Plan Rows')::float8 OPERATOR(pg_catalog.>) cap THEN
                RETURN NULL;
            END IF;
            found := ARRAY(
                SELECT s.id FROM %1$I.sessions AS s
                WHERE s.tenant_id OPERATOR(pg_catalog.=) (tenant COLLATE "POSIX")
                  AND COALESCE(s.metadata_json::text, s.metadata::text)
                      OPERATOR(pg_catalog.<>) '{}'
                  AND %1$I.cortex_metadata_pairs(s.tenant_id, s.metadata_json, s.metadata)
                      OPERATOR(pg_catalog.@>) %1$I.cortex_metadata_pairs(tenant, NULL, filter)
                LIMIT cap OPERATOR(pg_catalog.+) 1
            );
            IF pg_catalog.cardinality(found) OPERATOR(pg_catalog.>) cap THEN
                RETURN NULL;
            END IF;
            RETURN found;
        END
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'REVOKE ALL ON FUNCTION %I.cortex_metadata_ids(text, jsonb, integer) FROM PUBLIC',
        pg_catalog.current_schema()
    );
END
$migration$
"""


def upgrade() -> None:
    ddl.check(
        ddl.function_check("cortex_metadata_pairs", "text, json, jsonb"),
        ddl.function_check("cortex_metadata_ids", "text, jsonb, integer"),
        ddl.relation_check(INDEX, "index", on="sessions"),
    )
    op.execute(FUNCTIONS)
    with op.get_context().autocommit_block():
        ddl.create_index(INDEX, DEFINITION)
        ddl.run(CREATE_STATISTICS)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (an index and two functions)."""
    return []


def downgrade() -> None:
    op.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    with op.get_context().autocommit_block():
        ddl.drop_index(INDEX)
    op.execute("DROP FUNCTION IF EXISTS cortex_metadata_ids(text, jsonb, integer)")
    op.execute("DROP FUNCTION IF EXISTS cortex_metadata_pairs(text, json, jsonb)")
