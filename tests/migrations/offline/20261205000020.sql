-- Running upgrade 20261204000019 -> 20261205000020

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
WHERE a.attrelid = hit.oid AND a.attname = 'requested_input_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'messages', 'requested_input_json', listed, 'json');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'function_response_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'messages', 'function_response_json', listed, 'json');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'more_requested_inputs_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'messages', 'more_requested_inputs_json', listed, 'json');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'more_function_responses_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'messages', 'more_function_responses_json', listed, 'json');
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
WHERE c.relname = 'pending_inputs' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'pending_inputs' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'pending_inputs', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'pending_inputs', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'pending_inputs', hit.kind);
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'response_schema_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'pending_inputs', 'response_schema_json', listed, 'json');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'payload_json' AND NOT a.attisdropped;
IF FOUND AND listed <> 'json' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'pending_inputs', 'payload_json', listed, 'json');
END IF;
END
$check$;

COMMIT;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS requested_input_json json;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS function_response_json json;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS more_requested_inputs_json json;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS more_function_responses_json json;

ALTER TABLE pending_inputs ADD COLUMN IF NOT EXISTS response_schema_json json;

ALTER TABLE pending_inputs ADD COLUMN IF NOT EXISTS payload_json json;

BEGIN;

UPDATE alembic_version SET version_num='20261205000020' WHERE alembic_version.version_num = '20261204000019';
