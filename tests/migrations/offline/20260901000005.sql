-- Running upgrade 20260824000004 -> 20260901000005

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
WHERE c.relname = 'messages' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'messages' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'messages', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'messages', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'messages', hit.kind);
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
    IF hit.name NOT IN ('tenant_isolation') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'sessions');
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
WHERE c.relname = 'messages' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ('tenant_isolation') THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('policy %s on %s is not cortex''s: cortex did not make it; drop or rename it, then run the migration again', hit.name, 'messages');
    END IF;

END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);
END
$check$;

COMMIT;

ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;

ALTER TABLE sessions FORCE ROW LEVEL SECURITY;

DROP POLICY IF EXISTS tenant_isolation ON sessions;

CREATE POLICY tenant_isolation ON sessions USING (tenant_id = current_setting('cortex.tenant', true)) WITH CHECK (tenant_id = current_setting('cortex.tenant', true));

ALTER TABLE messages ENABLE ROW LEVEL SECURITY;

ALTER TABLE messages FORCE ROW LEVEL SECURITY;

DROP POLICY IF EXISTS tenant_isolation ON messages;

CREATE POLICY tenant_isolation ON messages USING (tenant_id = current_setting('cortex.tenant', true)) WITH CHECK (tenant_id = current_setting('cortex.tenant', true));

BEGIN;

UPDATE alembic_version SET version_num='20260901000005' WHERE alembic_version.version_num = '20260824000004';
