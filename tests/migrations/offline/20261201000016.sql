-- Running upgrade 20261201000015 -> 20261201000016

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
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'scope_l3' AND NOT a.attisdropped;
IF FOUND AND listed <> 'text' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'scope_l3', listed, 'text');
END IF;
END
$check$;

DO $check$
DECLARE
    hit record;
BEGIN

FOR hit IN
    SELECT p.oid::pg_catalog.regprocedure::text AS signature, p.prokind,
           pg_catalog.oidvectortypes(p.proargtypes) AS arguments,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.proname = 'cortex_sessions_scope_l3' AND p.pronamespace = pg_catalog.current_schema()::regnamespace
LOOP
    IF NOT hit.trusted THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.signature, hit.owner, current_user);
    END IF;
    IF hit.arguments <> '' OR hit.prokind <> 'f' THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s (owned by %s) is not cortex''s %s(%s): a call meant for cortex''s could run it; drop or rename it, then run the migration again', hit.signature, hit.owner, 'cortex_sessions_scope_l3', '');
    END IF;
END LOOP;
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
    IF hit.name NOT IN ('tenant_isolation', 'cortex_fill_scope_l3') THEN
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
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'ix_sessions_l3_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_l3_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_l3_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_l3_recent', 'sessions');
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
WHERE c.relname = 'ix_sessions_agent_l3_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_agent_l3_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_agent_l3_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_agent_l3_recent', 'sessions');
END IF;
END
$check$;

COMMIT;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS scope_l3 text COLLATE "C";

CREATE OR REPLACE FUNCTION cortex_sessions_scope_l3() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    NEW.scope_l3 := split_part(NEW.scope, '/', 1) || '/' || split_part(NEW.scope, '/', 2) || '/' || split_part(NEW.scope, '/', 3);
    RETURN NEW;
END
$fn$;

DO $ddl$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition
            WHERE logicalrelid = pg_catalog.to_regclass('sessions')
        ) THEN
            RETURN;
        END IF;
    END IF;

    DROP TRIGGER IF EXISTS cortex_sessions_scope_l3 ON sessions;
    CREATE TRIGGER cortex_sessions_scope_l3 BEFORE INSERT ON sessions FOR EACH ROW
        WHEN (NEW.scope_depth >= 3 AND NEW.scope_l3 IS NULL)
        EXECUTE FUNCTION cortex_sessions_scope_l3();
END
$ddl$;

DROP POLICY IF EXISTS cortex_fill_scope_l3 ON sessions;

CREATE POLICY cortex_fill_scope_l3 ON sessions TO CURRENT_USER USING (true) WITH CHECK (true);

UPDATE sessions SET scope_l3 = split_part(scope, '/', 1) || '/' || split_part(scope, '/', 2) || '/' || split_part(scope, '/', 3) WHERE scope_depth >= 3 AND scope_l3 IS NULL;

DO $check$
DECLARE
    missing bigint;
BEGIN
    SELECT count(*) INTO missing FROM sessions WHERE scope_depth >= 3 AND scope_l3 IS NULL;
    IF missing > 0 THEN
        RAISE EXCEPTION 'scope_l3: % sessions at depth 3 or deeper were not filled', missing;
    END IF;
END
$check$;

DROP POLICY IF EXISTS cortex_fill_scope_l3 ON sessions;

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
WHERE c.relname = 'ix_sessions_l3_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_l3_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_l3_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_l3_recent', 'sessions');
END IF;
END
$check$;

CREATE INDEX CONCURRENTLY ix_sessions_l3_recent ON sessions (tenant_id, scope_l3, updated_at DESC, id DESC, is_default) WHERE scope_depth >= 3;

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
WHERE c.relname = 'ix_sessions_agent_l3_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_agent_l3_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_agent_l3_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_agent_l3_recent', 'sessions');
END IF;
END
$check$;

CREATE INDEX CONCURRENTLY ix_sessions_agent_l3_recent ON sessions (tenant_id, agent_id, scope_l3, updated_at DESC, id DESC, is_default) WHERE scope_depth >= 3;

BEGIN;

UPDATE alembic_version SET version_num='20261201000016' WHERE alembic_version.version_num = '20261201000015';
