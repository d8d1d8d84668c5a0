-- Running upgrade 20261201000008 -> 20261201000009

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
WHERE a.attrelid = hit.oid AND a.attname = 'metadata_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'metadata_json', listed, 'json');
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
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'metadata_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'messages', 'metadata_json', listed, 'json');
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
    WHERE p.proname = 'cortex_forget_metadata_text' AND p.pronamespace = pg_catalog.current_schema()::regnamespace
LOOP
    IF NOT hit.trusted THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.signature, hit.owner, current_user);
    END IF;
    IF hit.arguments <> '' OR hit.prokind <> 'f' THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s (owned by %s) is not cortex''s %s(%s): a call meant for cortex''s could run it; drop or rename it, then run the migration again', hit.signature, hit.owner, 'cortex_forget_metadata_text', '');
    END IF;
END LOOP;
END
$check$;

COMMIT;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS metadata_json json;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS metadata_json json;

CREATE OR REPLACE FUNCTION cortex_forget_metadata_text() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NEW.metadata IS DISTINCT FROM OLD.metadata
       AND NEW.metadata_json::text IS NOT DISTINCT FROM OLD.metadata_json::text THEN
        NEW.metadata_json := NULL;
    END IF;
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

    DROP TRIGGER IF EXISTS cortex_sessions_metadata_as_jsonb ON sessions;
    CREATE TRIGGER cortex_sessions_metadata_as_jsonb BEFORE UPDATE OF metadata ON sessions
        FOR EACH ROW EXECUTE FUNCTION cortex_forget_metadata_text();
END
$ddl$;

BEGIN;

UPDATE alembic_version SET version_num='20261201000009' WHERE alembic_version.version_num = '20261201000008';
