-- Running upgrade 20261201000009 -> 20261201000010

DO $check$
DECLARE
    hit record;
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'cortex_schema_compat' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'cortex_schema_compat' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'cortex_schema_compat', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'cortex_schema_compat', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'cortex_schema_compat', hit.kind);
END IF;
SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attnum > 0 AND NOT a.attisdropped;
IF listed IS DISTINCT FROM 'singleton boolean, oldest_code_revision text' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('table %s has the columns (%s), not the ones cortex makes (%s); drop or rename it, then run the migration again', 'cortex_schema_compat', listed, 'singleton boolean, oldest_code_revision text');
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
WHERE c.relname = 'pk_cortex_schema_compat' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'pk_cortex_schema_compat', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'pk_cortex_schema_compat', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'cortex_schema_compat' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'pk_cortex_schema_compat', 'cortex_schema_compat');
END IF;
END
$check$;

COMMIT;

CREATE TABLE IF NOT EXISTS cortex_schema_compat ( singleton boolean DEFAULT true NOT NULL, oldest_code_revision text NOT NULL, CONSTRAINT pk_cortex_schema_compat PRIMARY KEY (singleton), CONSTRAINT ck_cortex_schema_compat_singleton CHECK (singleton));

BEGIN;

UPDATE alembic_version SET version_num='20261201000010' WHERE alembic_version.version_num = '20261201000009';
