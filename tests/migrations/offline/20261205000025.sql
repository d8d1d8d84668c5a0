-- Running upgrade 20261205000024 -> 20261205000025

DO $check$
DECLARE
    hit record;
BEGIN

FOR hit IN
    SELECT p.oid::pg_catalog.regprocedure::text AS signature, p.prokind,
           pg_catalog.oidvectortypes(p.proargtypes) AS arguments,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.proname = 'cortex_console_sees' AND p.pronamespace = pg_catalog.current_schema()::regnamespace
LOOP
    IF NOT hit.trusted THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.signature, hit.owner, current_user);
    END IF;
    IF hit.arguments <> 'text' OR hit.prokind <> 'f' THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s (owned by %s) is not cortex''s %s(%s): a call meant for cortex''s could run it; drop or rename it, then run the migration again', hit.signature, hit.owner, 'cortex_console_sees', 'text');
    END IF;
END LOOP;
END
$check$;

DO $check$
DECLARE
    hit record;
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'console_actions' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'console_actions' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'console_actions', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'console_actions', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'console_actions', hit.kind);
END IF;
SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attnum > 0 AND NOT a.attisdropped;
IF listed IS DISTINCT FROM 'tenant_id text, id uuid, scope text, session_id uuid, subject text, action text, outcome text, detail jsonb, at timestamp with time zone' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('table %s has the columns (%s), not the ones cortex makes (%s); drop or rename it, then run the migration again', 'console_actions', listed, 'tenant_id text, id uuid, scope text, session_id uuid, subject text, action text, outcome text, detail jsonb, at timestamp with time zone');
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
WHERE c.relname = 'pk_console_actions' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'pk_console_actions', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'pk_console_actions', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'console_actions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'pk_console_actions', 'console_actions');
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
WHERE c.relname = 'ix_console_actions_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_console_actions_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_console_actions_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'console_actions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_console_actions_recent', 'console_actions');
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
WHERE c.relname = 'ix_console_actions_tenant_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_console_actions_tenant_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_console_actions_tenant_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'console_actions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_console_actions_tenant_recent', 'console_actions');
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
WHERE c.relname = 'ix_console_actions_session' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_console_actions_session', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_console_actions_session', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'console_actions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_console_actions_session', 'console_actions');
END IF;
END
$check$;

DO $check$
DECLARE
    hit record;
    relation oid;
    path text := pg_catalog.current_setting('search_path');
BEGIN

SELECT c.oid INTO relation FROM pg_catalog.pg_class AS c
WHERE c.relname = 'sessions' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ('tenant_isolation', 'console_scope') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'sessions');
    END IF;
    IF hit.name = 'tenant_isolation' AND (NOT hit.polpermissive OR hit.polcmd <> '*' OR hit.roles <> ARRAY['public'] OR hit.qual IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))' OR hit.checked IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not the one cortex makes (%s to %s, USING %s WITH CHECK %s); drop or rename it, then run the migration again', hit.name, 'sessions', CASE WHEN hit.polpermissive THEN 'permissive' ELSE 'restrictive' END, hit.roles, hit.qual, hit.checked);
    END IF;
END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);
END
$check$;

DO $check$
DECLARE
    hit record;
    relation oid;
    path text := pg_catalog.current_setting('search_path');
BEGIN

SELECT c.oid INTO relation FROM pg_catalog.pg_class AS c
WHERE c.relname = 'pending_inputs' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ('tenant_isolation', 'console_scope') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'pending_inputs');
    END IF;
    IF hit.name = 'tenant_isolation' AND (NOT hit.polpermissive OR hit.polcmd <> '*' OR hit.roles <> ARRAY['public'] OR hit.qual IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))' OR hit.checked IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not the one cortex makes (%s to %s, USING %s WITH CHECK %s); drop or rename it, then run the migration again', hit.name, 'pending_inputs', CASE WHEN hit.polpermissive THEN 'permissive' ELSE 'restrictive' END, hit.roles, hit.qual, hit.checked);
    END IF;
END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);
END
$check$;

DO $check$
DECLARE
    hit record;
    relation oid;
    path text := pg_catalog.current_setting('search_path');
BEGIN

SELECT c.oid INTO relation FROM pg_catalog.pg_class AS c
WHERE c.relname = 'session_markers' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ('tenant_isolation', 'console_scope') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'session_markers');
    END IF;
    IF hit.name = 'tenant_isolation' AND (NOT hit.polpermissive OR hit.polcmd <> '*' OR hit.roles <> ARRAY['public'] OR hit.qual IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))' OR hit.checked IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not the one cortex makes (%s to %s, USING %s WITH CHECK %s); drop or rename it, then run the migration again', hit.name, 'session_markers', CASE WHEN hit.polpermissive THEN 'permissive' ELSE 'restrictive' END, hit.roles, hit.qual, hit.checked);
    END IF;
END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);
END
$check$;

DO $check$
DECLARE
    hit record;
    relation oid;
    path text := pg_catalog.current_setting('search_path');
BEGIN

SELECT c.oid INTO relation FROM pg_catalog.pg_class AS c
WHERE c.relname = 'console_actions' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ('tenant_isolation', 'console_scope') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'console_actions');
    END IF;
    IF hit.name = 'tenant_isolation' AND (NOT hit.polpermissive OR hit.polcmd <> '*' OR hit.roles <> ARRAY['public'] OR hit.qual IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))' OR hit.checked IS DISTINCT FROM '(tenant_id = current_setting(''cortex.tenant''::text, true))') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not the one cortex makes (%s to %s, USING %s WITH CHECK %s); drop or rename it, then run the migration again', hit.name, 'console_actions', CASE WHEN hit.polpermissive THEN 'permissive' ELSE 'restrictive' END, hit.roles, hit.qual, hit.checked);
    END IF;
END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);
END
$check$;

DO $console$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console') THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                       WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
            RAISE WARNING 'role cortex_console does not exist and % may not create roles: the'
                ' console''s grants and policies are left out (CREATE ROLE cortex_console'
                ' NOLOGIN as a superuser, before this revision runs)', current_user;
            RETURN;
        END IF;
        CREATE ROLE cortex_console NOLOGIN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console'
               AND (rolcanlogin OR rolsuper OR rolbypassrls)) THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = 'role cortex_console can log in or'
            ' bypasses row-level security: cortex did not make it; drop or rename it, then run'
            ' the migration again';
    END IF;
END
$console$;

CREATE OR REPLACE FUNCTION public.cortex_console_sees(scope text) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    bound text := pg_catalog.current_setting('cortex.operator_scope', true);
BEGIN
    IF bound IS NULL OR pg_catalog.right(bound, 1) <> '/' THEN
        RETURN false;
    END IF;
    RETURN bound = '/' OR pg_catalog.starts_with(scope || '/', bound);
END
$fn$;

CREATE TABLE console_actions ( tenant_id text COLLATE "C" NOT NULL, id uuid NOT NULL, scope text COLLATE "C" NOT NULL, session_id uuid, subject text NOT NULL, action text NOT NULL, outcome text NOT NULL, detail jsonb NOT NULL DEFAULT '{}'::jsonb, at timestamptz NOT NULL DEFAULT now(), CONSTRAINT pk_console_actions PRIMARY KEY (tenant_id, id), CONSTRAINT ck_console_actions_scope_tenant CHECK (tenant_id = split_part(scope, '/', 1)), CONSTRAINT ck_console_actions_action CHECK (action IN ('resume', 'abort', 'mark', 'unmark', 'sign_in', 'sign_out', 'erase')), CONSTRAINT ck_console_actions_outcome CHECK (outcome ~ '^(ok|[A-Z][A-Za-z]{0,63})$'), CONSTRAINT ck_console_actions_subject CHECK (char_length(subject) BETWEEN 1 AND 256), CONSTRAINT ck_console_actions_detail CHECK (jsonb_typeof(detail) = 'object' AND octet_length(detail::text) <= 4096));

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
    FOREACH cortex_table IN ARRAY ARRAY['console_actions']::text[] LOOP
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

CREATE INDEX ix_console_actions_recent ON console_actions (at DESC, id DESC);

CREATE INDEX ix_console_actions_tenant_recent ON console_actions (tenant_id, at DESC, id DESC);

CREATE INDEX ix_console_actions_session ON console_actions (tenant_id, session_id, at DESC, id DESC) WHERE session_id IS NOT NULL;

ALTER TABLE console_actions ENABLE ROW LEVEL SECURITY;

ALTER TABLE console_actions FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON console_actions USING (tenant_id = current_setting('cortex.tenant', true)) WITH CHECK (tenant_id = current_setting('cortex.tenant', true));

COMMIT;

DO $console$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console') THEN
        RETURN;
    END IF;
    EXECUTE 'GRANT USAGE ON SCHEMA public TO cortex_console';
    EXECUTE 'GRANT SELECT (tenant_id, id, agent_id, scope, title, state, pending_count, is_aborted, is_interrupted, message_count, created_at, updated_at) ON sessions TO cortex_console';
    EXECUTE 'GRANT SELECT (tenant_id, session_id, raised_seq, interrupt_id, message, author, raised_at) ON pending_inputs TO cortex_console';
    EXECUTE 'GRANT SELECT ON session_markers TO cortex_console';
    EXECUTE 'GRANT SELECT ON console_actions TO cortex_console';
    EXECUTE 'GRANT EXECUTE ON FUNCTION public.cortex_console_sees(text) TO cortex_console';
    EXECUTE 'DROP POLICY IF EXISTS console_scope ON sessions';
    EXECUTE 'CREATE POLICY console_scope ON sessions FOR SELECT TO cortex_console USING (public.cortex_console_sees(scope))';
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'DROP POLICY IF EXISTS console_scope ON pending_inputs';
        EXECUTE 'CREATE POLICY console_scope ON pending_inputs FOR SELECT TO cortex_console USING (public.cortex_console_sees(tenant_id))';
    ELSE
        EXECUTE 'DROP POLICY IF EXISTS console_scope ON pending_inputs';
        EXECUTE 'CREATE POLICY console_scope ON pending_inputs FOR SELECT TO cortex_console USING (EXISTS (SELECT FROM public.sessions AS s WHERE s.tenant_id = pending_inputs.tenant_id AND s.id = pending_inputs.session_id))';
    END IF;
    EXECUTE 'DROP POLICY IF EXISTS console_scope ON session_markers';
    EXECUTE 'CREATE POLICY console_scope ON session_markers FOR SELECT TO cortex_console USING (public.cortex_console_sees(scope))';
    EXECUTE 'DROP POLICY IF EXISTS console_scope ON console_actions';
    EXECUTE 'CREATE POLICY console_scope ON console_actions FOR SELECT TO cortex_console USING (public.cortex_console_sees(scope))';
END
$console$;

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
WHERE c.relname = 'ix_sessions_console_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_console_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_console_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_console_recent', 'sessions');
END IF;
END
$check$;

CREATE INDEX CONCURRENTLY ix_sessions_console_recent ON sessions (state, updated_at DESC, id DESC, tenant_id DESC) WHERE state <> 'idle';

BEGIN;

UPDATE alembic_version SET version_num='20261205000025' WHERE alembic_version.version_num = '20261205000024';
