
DO $citus$
DECLARE
    cortex_table text;
    trigger_name name;
    function_id oid;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
       OR pg_catalog.to_regclass('alembic_version') IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM alembic_version WHERE version_num >= '20260824000004') THEN
        RETURN;
    END IF;
    IF EXISTS (
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
          AND pg_catalog.starts_with(p.proname, 'cortex')
          AND NOT pg_catalog.starts_with(p.proname, 'cortex_r_')
          AND NOT EXISTS (
              SELECT FROM pg_catalog.pg_dist_object AS o
              WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.objid = p.oid
          )) THEN
        -- Citus propagates a function over one connection per node, which a
        -- parallel DDL earlier in the transaction forbids.
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    FOREACH cortex_table IN ARRAY ARRAY['sessions', 'messages', 'pending_inputs', 'session_markers', 'scope_data', 'erasures', 'retention_policies', 'console_actions', 'metadata_pairs']::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regclass(cortex_table) IS NULL OR EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition
            WHERE logicalrelid = pg_catalog.to_regclass(cortex_table)
        );
        -- Citus refuses triggers on distributed tables (citus.enable_unsafe_triggers).
        -- cortex's own serve the previous releases only (a legacy writer's tenant,
        -- an old release's metadata rewrite); a Citus database serves this one.
        FOR trigger_name IN
            SELECT tgname FROM pg_catalog.pg_trigger
            WHERE tgrelid = pg_catalog.to_regclass(cortex_table) AND NOT tgisinternal
              AND tgname LIKE 'cortex%'
        LOOP
            EXECUTE pg_catalog.format('DROP TRIGGER %I ON %I', trigger_name, cortex_table);
        END LOOP;
        PERFORM pg_catalog.create_distributed_table(
            pg_catalog.to_regclass(cortex_table), 'tenant_id',
            colocate_with => CASE cortex_table WHEN 'sessions' THEN 'none'
                                               ELSE 'sessions' END
        );
    END LOOP;
    -- Made before the extension, they are on the coordinator only, yet the
    -- shards call them; after the tables, which their bodies name.
    FOR function_id IN 
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
          AND pg_catalog.starts_with(p.proname, 'cortex')
          AND NOT pg_catalog.starts_with(p.proname, 'cortex_r_')
          AND NOT EXISTS (
              SELECT FROM pg_catalog.pg_dist_object AS o
              WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.objid = p.oid
          ) LOOP
        PERFORM pg_catalog.create_distributed_function(function_id::regprocedure);
    END LOOP;
END
$citus$;

COMMIT;

BEGIN;
