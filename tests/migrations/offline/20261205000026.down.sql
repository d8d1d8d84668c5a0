-- Running downgrade 20261205000026 -> 20261205000025

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
$migration$;

COMMIT;

DROP POLICY IF EXISTS cortex_fill_metadata_pairs ON sessions;

DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = 'cortex_metadata_pairs_delete' AND tgrelid = pg_catalog.to_regclass('sessions')
    ) THEN
        DROP TRIGGER cortex_metadata_pairs_delete ON sessions;
    END IF;
END
$ddl$;

DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = 'cortex_metadata_pairs_update' AND tgrelid = pg_catalog.to_regclass('sessions')
    ) THEN
        DROP TRIGGER cortex_metadata_pairs_update ON sessions;
    END IF;
END
$ddl$;

DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = 'cortex_metadata_pairs_insert' AND tgrelid = pg_catalog.to_regclass('sessions')
    ) THEN
        DROP TRIGGER cortex_metadata_pairs_insert ON sessions;
    END IF;
END
$ddl$;

DO $check$
DECLARE
    hit record;
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'sessions' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'sessions' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'sessions', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'sessions', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'sessions', hit.kind);
END IF;
END
$check$;

DO $check$
DECLARE
    hit record;
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'ix_sessions_metadata_pairs' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_metadata_pairs', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_metadata_pairs', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_metadata_pairs', 'sessions');
END IF;
END
$check$;

CREATE INDEX CONCURRENTLY ix_sessions_metadata_pairs ON sessions USING gin (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata)) WHERE COALESCE((metadata_json)::text, (metadata)::text) <> '{}'::text;

CREATE STATISTICS IF NOT EXISTS cortex_sessions_metadata_pairs ON (public.cortex_metadata_pairs(tenant_id, metadata_json, metadata)) FROM sessions;

BEGIN;

DROP FUNCTION IF EXISTS cortex_metadata_pairs_sync();

DROP TABLE IF EXISTS metadata_pairs;

UPDATE alembic_version SET version_num='20261205000025' WHERE alembic_version.version_num = '20261205000026';
