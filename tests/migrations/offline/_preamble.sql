DO $check$
DECLARE
    hit record;
BEGIN

IF pg_catalog.current_schema() IS DISTINCT FROM 'public' THEN
    SELECT n.nspowner INTO hit FROM pg_catalog.pg_namespace AS n
    WHERE n.nspname = pg_catalog.current_schema();
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('cortex''s tables would be created in schema %s, owned by %s, which comes before public on the search path of %s: cortex lives in public; drop or rename that schema, or set the role''s search_path, then run the migration again', pg_catalog.current_schema(), pg_catalog.pg_get_userbyid(hit.nspowner), current_user);
END IF;
SELECT f.kind, f.name, f.owner INTO hit FROM (
    SELECT 'function' AS kind, p.oid::pg_catalog.regprocedure::text AS name,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.pronamespace IN (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = ANY (pg_catalog.current_schemas(false)) AND n.nspname <> 'pg_catalog') AND NOT (r.rolname = current_user OR r.rolsuper)
      AND (p.proname LIKE 'cortex%' OR EXISTS (
          SELECT FROM pg_catalog.pg_proc AS q
          WHERE q.pronamespace = 'pg_catalog'::regnamespace AND q.proname = p.proname))
    UNION ALL
    SELECT 'operator', o.oid::pg_catalog.regoperator::text, pg_catalog.pg_get_userbyid(o.oprowner)
    FROM pg_catalog.pg_operator AS o JOIN pg_catalog.pg_roles AS r ON r.oid = o.oprowner
    WHERE o.oprnamespace IN (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = ANY (pg_catalog.current_schemas(false)) AND n.nspname <> 'pg_catalog') AND NOT (r.rolname = current_user OR r.rolsuper)
      AND EXISTS (
          SELECT FROM pg_catalog.pg_operator AS q
          WHERE q.oprnamespace = 'pg_catalog'::regnamespace AND q.oprname = o.oprname)
    UNION ALL
    SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END, c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)
    FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
    WHERE c.relnamespace = pg_catalog.current_schema()::regnamespace AND NOT (r.rolname = current_user OR r.rolsuper) AND c.relname IN ('alembic_version', 'cortex_schema_compat', 'sessions', 'messages', 'pending_inputs', 'session_markers', 'scope_data')
) AS f ORDER BY f.kind, f.name LIMIT 1;
IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it, and its statements could reach it; drop or rename it, then run the migration again', hit.kind, hit.name, hit.owner, current_user);
END IF;
END
$check$;

DO $console$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
       OR pg_catalog.to_regclass('pending_inputs') IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = pg_catalog.to_regclass('pending_inputs'))
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_policy
                      WHERE polrelid = pg_catalog.to_regclass('pending_inputs')
                        AND polname = 'console_scope') THEN
        RETURN;
    END IF;
    DROP POLICY console_scope ON pending_inputs;
    CREATE POLICY console_scope ON pending_inputs FOR SELECT TO cortex_console
        USING (public.cortex_console_sees(tenant_id));
END
$console$;

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

BEGIN;

CREATE TABLE alembic_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
