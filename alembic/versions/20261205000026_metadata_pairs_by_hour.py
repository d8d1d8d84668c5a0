"""A metadata filter reads its matches newest hour first: the table ``metadata_pairs``.

Revision ID: 20261205000026
Revises: 20261205000025
Create Date: 2026-12-05

Why it exists: revision 20261205000024's GIN index gave a filter its
matches in no order, so a page of a common value (1 % of a tenant of
200,000 sessions: 2,000 matches) read every match or walked the listing,
about 5,500 rows for a page of 50 (docs/benchmarks.md, 2026-12-02); and
an append to a session with metadata computed its pairs again for the
index (no update of a session is HOT). This revision adds:

- ``metadata_pairs (tenant_id, pair, hour, session_id)``, its primary key
  in that order: one row per top-level key of a session's metadata, the
  key's pair hash (``cortex_metadata_pairs``, revision …24) and the hour
  of the session's ``updated_at`` (whole hours since the epoch). A filter
  reads a value's rows newest hour first and stops once it has a page's
  worth of whole hours: a page reads about a page of sessions.
- ``cortex_metadata_pairs_sync()``, a ``SECURITY DEFINER`` trigger function
  (``search_path = pg_catalog, pg_temp``, every object qualified), and
  three row triggers on ``sessions`` that keep the rows of a session with
  metadata: on insert, on delete, and on an update that moves
  ``updated_at`` into another hour or changes the metadata or the
  session's key. Every other update (an append within the hour) tests the
  trigger's ``WHEN`` only.
  The function runs as the table's owner, so the application role is
  granted ``SELECT`` only, and the table has row-level security enabled
  (the tenant policy) without FORCE: its owner writes it for whichever
  tenant a statement touches, as the triggers' writers see it.

A row is written in the transaction that writes the session, so the table
holds every (pair, hour) of every session with metadata. A row whose
session has moved on (an update racing the fill below) only adds a
candidate: the listing checks every key exactly, and bounds the hours it
read by ``updated_at``. Existing sessions are filled in committed batches
of 2,000 in key order, after the triggers exist.

The GIN index ``ix_sessions_metadata_pairs``, its statistics and
``cortex_metadata_ids`` are dropped: nothing reads them from this release
on. ``cortex_metadata_pairs`` stays (the table's hashes are its).

On Citus there are no triggers (Citus refuses them on distributed tables):
the table is created and distributed, and stays empty; a metadata filter
walks the listing there, as before.

Safe with: every release from 20261201000009 on (the triggers keep their
writes too; none reads the table). Online: the table is new; each trigger
is one statement under a short lock timeout with retries; the index is
dropped ``CONCURRENTLY``. A killed run runs again from the top.

Downgrade drops the triggers, the function and the table, and builds
revision …24's index, statistics and function again (the index
``CONCURRENTLY``). Nothing is lost.
"""

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.citus_v1 import distribute

revision: str = "20261205000026"
down_revision: str | Sequence[str] | None = "20261205000025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

TABLE: Final = "metadata_pairs"
CREATE_TABLE: Final = (
    "CREATE TABLE metadata_pairs ("
    ' tenant_id text COLLATE "C" NOT NULL,'
    " pair bigint NOT NULL,"
    " hour bigint NOT NULL,"
    " session_id uuid NOT NULL,"
    " CONSTRAINT pk_metadata_pairs PRIMARY KEY (tenant_id, pair, hour, session_id))"
)
_MATCH: Final = "tenant_id = current_setting('cortex.tenant', true)"
_COLUMNS: Final = ("tenant_id text", "pair bigint", "hour bigint", "session_id uuid")

FUNCTION: Final = "cortex_metadata_pairs_sync"
# Made in this order, each in its own statement: until the insert trigger
# exists no session has rows, so no write between two of them can leave one
# behind. An update that changes a session's key moves its rows too.
TRIGGERS: Final = {
    "cortex_metadata_pairs_delete": "AFTER DELETE",
    "cortex_metadata_pairs_update": (
        "AFTER UPDATE OF tenant_id, id, updated_at, metadata, metadata_json"
    ),
    "cortex_metadata_pairs_insert": "AFTER INSERT",
}


def _hour(moment: str) -> str:
    """Whole hours since the epoch of a ``timestamptz`` (exact: ``EXTRACT`` gives numeric)."""
    return f"(pg_catalog.floor(EXTRACT(epoch FROM {moment}) / 3600))::bigint"


def _has_metadata(row: str) -> str:
    """What the session shows as its metadata (verbatim json, else jsonb) is not ``{}``."""
    return f"COALESCE(({row}.metadata_json)::text, ({row}.metadata)::text) <> '{{}}'::text"


_WHEN: Final = {
    "cortex_metadata_pairs_insert": _has_metadata("NEW"),
    "cortex_metadata_pairs_update": (
        f"({_has_metadata('OLD')} OR {_has_metadata('NEW')})"
        f" AND ({_hour('OLD.updated_at')} <> {_hour('NEW.updated_at')}"
        " OR (OLD.metadata_json)::text IS DISTINCT FROM (NEW.metadata_json)::text"
        " OR OLD.metadata IS DISTINCT FROM NEW.metadata"
        " OR OLD.id <> NEW.id OR OLD.tenant_id <> NEW.tenant_id)"
    ),
    "cortex_metadata_pairs_delete": _has_metadata("OLD"),
}

# search_path pinned with pg_temp last, every object schema-qualified, the
# schema resolved by the server when the migration runs (online and offline).
CREATE_FUNCTION: Final = f"""
DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.{FUNCTION}()
        RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        DECLARE
            old_pair bigint;
            old_hour bigint;
        BEGIN
            -- One probe of the whole key a pair: the routines' generic plans
            -- reach this function, and there a pair array in one statement's
            -- condition was a filter over the tenant's whole range of the key
            -- (and, computed inline, every key hashed again for each row).
            IF TG_OP OPERATOR(pg_catalog.<>) 'INSERT' THEN
                old_hour := {_hour("OLD.updated_at")};
                FOREACH old_pair IN ARRAY COALESCE(
                    %1$I.cortex_metadata_pairs(OLD.tenant_id, OLD.metadata_json, OLD.metadata),
                    '{{}}'
                ) LOOP
                    DELETE FROM %1$I.metadata_pairs AS m
                    WHERE m.tenant_id OPERATOR(pg_catalog.=) OLD.tenant_id
                      AND m.pair OPERATOR(pg_catalog.=) old_pair
                      AND m.hour OPERATOR(pg_catalog.=) old_hour
                      AND m.session_id OPERATOR(pg_catalog.=) OLD.id;
                END LOOP;
            END IF;
            IF TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
                INSERT INTO %1$I.metadata_pairs AS m (tenant_id, pair, hour, session_id)
                SELECT NEW.tenant_id, p.pair, {_hour("NEW.updated_at")}, NEW.id
                FROM pg_catalog.unnest(
                    %1$I.cortex_metadata_pairs(NEW.tenant_id, NEW.metadata_json, NEW.metadata)
                ) AS p(pair)
                ON CONFLICT DO NOTHING;
            END IF;
            RETURN NULL;
        END
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'REVOKE ALL ON FUNCTION %I.{FUNCTION}() FROM PUBLIC', pg_catalog.current_schema()
    );
END
$migration$
"""


def _create_trigger(name: str) -> str:
    # Not on Citus: it refuses triggers on distributed tables.
    return ddl.unless_distributed_sql(
        "sessions",
        f"""
    DROP TRIGGER IF EXISTS {name} ON sessions;
    CREATE TRIGGER {name} {TRIGGERS[name]} ON sessions FOR EACH ROW
        WHEN ({_WHEN[name]})
        EXECUTE FUNCTION {FUNCTION}();""",
    )


BATCH: Final = 2000
_PAIRS_OF: Final = (
    "SELECT s.tenant_id, p.pair, {hour}, s.id"
    " FROM {source} AS s,"
    " pg_catalog.unnest(public.cortex_metadata_pairs(s.tenant_id, s.metadata_json, s.metadata)) AS p(pair)"
    " WHERE {has}"
)
_FILL_ALL: Final = (
    "INSERT INTO metadata_pairs (tenant_id, pair, hour, session_id) "
    + _PAIRS_OF.format(hour=_hour("s.updated_at"), source="sessions", has=_has_metadata("s"))
    + " ON CONFLICT DO NOTHING"
)
# One batch, one statement: the pairs of the next BATCH sessions after the key
# left in the session's cortex.pairs_after_* settings; their key is left there.
_FILL_BATCH: Final = f"""
DO $fill$
DECLARE
    last_tenant text;
    last_id uuid;
BEGIN
    WITH batch AS (
        SELECT tenant_id, id, metadata_json, metadata, updated_at FROM sessions
        WHERE (tenant_id, id) > (pg_catalog.current_setting('cortex.pairs_after_tenant'),
                                 pg_catalog.current_setting('cortex.pairs_after_id')::uuid)
        ORDER BY tenant_id, id
        LIMIT {BATCH}
    ), filled AS (
        INSERT INTO metadata_pairs (tenant_id, pair, hour, session_id)
        {_PAIRS_OF.format(hour=_hour("s.updated_at"), source="batch", has=_has_metadata("s"))}
        ON CONFLICT DO NOTHING
    )
    SELECT tenant_id, id INTO last_tenant, last_id
    FROM batch ORDER BY tenant_id DESC, id DESC LIMIT 1;
    PERFORM pg_catalog.set_config('cortex.pairs_after_tenant', coalesce(last_tenant, ''), false);
    PERFORM pg_catalog.set_config('cortex.pairs_after_id', coalesce(last_id::text, ''), false);
END
$fill$
"""
# Row-level security holds an owner that is neither superuser nor BYPASSRLS
# (FORCE on sessions): for the fill only, a permissive policy lets the
# migrating role itself read every session (revision 20261201000016's way).
FILL_POLICY: Final = "cortex_fill_metadata_pairs"
_OPEN_FILL: Final = (
    f"DROP POLICY IF EXISTS {FILL_POLICY} ON sessions",
    f"CREATE POLICY {FILL_POLICY} ON sessions FOR SELECT TO CURRENT_USER USING (true)",
)
_CLOSE_FILL: Final = f"DROP POLICY IF EXISTS {FILL_POLICY} ON sessions"

# Revision 20261205000024's objects, dropped here and made again by the downgrade.
OLD_INDEX: Final = "ix_sessions_metadata_pairs"
OLD_STATISTICS: Final = "cortex_sessions_metadata_pairs"
_OLD_HAS_METADATA: Final = "COALESCE((metadata_json)::text, (metadata)::text) <> '{}'::text"
OLD_DEFINITION: Final = (
    "sessions USING gin (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata))"
    f" WHERE {_OLD_HAS_METADATA}"
)
OLD_CREATE_STATISTICS: Final = (
    f"CREATE STATISTICS IF NOT EXISTS {OLD_STATISTICS}"
    " ON (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata)) FROM sessions"
)
OLD_FUNCTION: Final = """
DO $migration$
BEGIN
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


def _missing() -> bool:
    if context.is_offline_mode():
        return True
    found = op.get_bind().execute(sa.text("SELECT to_regclass(:t)"), {"t": f"public.{TABLE}"})
    return found.scalar() is None


def _fill() -> None:
    """The pairs of every existing session with metadata, under the fill policy.

    In batches on plain PostgreSQL; one INSERT offline (``cortex db sql``).
    On Citus nothing: no trigger keeps the table there, and nothing reads it.
    """
    bind = None if op.get_context().as_sql else op.get_bind()
    if bind is not None and ddl.sessions_distributed(bind):
        return
    ddl.run(*_OPEN_FILL)
    if bind is None:
        ddl.run(_FILL_ALL)
    else:
        _fill_in_batches(bind)
    ddl.run(_CLOSE_FILL)


def _fill_in_batches(bind: Connection) -> None:
    bind.execute(sa.text("SELECT pg_catalog.set_config('cortex.pairs_after_tenant', '', false)"))
    bind.execute(
        sa.text(
            "SELECT pg_catalog.set_config('cortex.pairs_after_id',"
            " '00000000-0000-0000-0000-000000000000', false)"
        )
    )
    while True:
        ddl.run(_FILL_BATCH)
        if not bind.execute(sa.text("SELECT current_setting('cortex.pairs_after_id')")).scalar():
            break


def upgrade() -> None:
    ddl.check(
        ddl.relation_check(TABLE, columns=_COLUMNS),
        ddl.relation_check("pk_metadata_pairs", "index", on=TABLE),
        ddl.policies_check(TABLE, {"tenant_isolation": ddl.TENANT_ISOLATION}),
        ddl.function_check(FUNCTION, ""),
        # The fill policy of a killed run is dropped and made again, whatever its form.
        ddl.policies_check(
            "sessions",
            {"tenant_isolation": ddl.TENANT_ISOLATION, "console_scope": None, FILL_POLICY: None},
        ),
        ddl.relation_check(OLD_INDEX, "index", on="sessions"),
    )
    # The function first: Citus refuses a function command after the table's
    # parallel DDL in one transaction (its body names the table only when run).
    op.execute(CREATE_FUNCTION)
    if _missing():
        op.execute(CREATE_TABLE)
        distribute(TABLE)  # on Citus only (citus_v1)
        op.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {TABLE} USING ({_MATCH}) WITH CHECK ({_MATCH})"
        )
    with op.get_context().autocommit_block():
        for name in TRIGGERS:
            ddl.run(_create_trigger(name))
        _fill()
        ddl.run(f"DROP STATISTICS IF EXISTS {OLD_STATISTICS}")
        ddl.drop_index(OLD_INDEX)
    op.execute("DROP FUNCTION IF EXISTS cortex_metadata_ids(text, jsonb, integer)")


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (the table is derived from sessions)."""
    return []


def downgrade() -> None:
    op.execute(OLD_FUNCTION)
    with op.get_context().autocommit_block():
        ddl.run(_CLOSE_FILL)
        for name in TRIGGERS:
            ddl.run(ddl.drop_trigger_sql(name, "sessions"))
        ddl.create_index(OLD_INDEX, OLD_DEFINITION)
        ddl.run(OLD_CREATE_STATISTICS)
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    op.execute(f"DROP TABLE IF EXISTS {TABLE}")
