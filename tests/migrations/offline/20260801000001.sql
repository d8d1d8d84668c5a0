-- Running upgrade  -> 20260801000001

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
    listed text;
BEGIN
SELECT c.oid, c.relkind, CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type' ELSE 'relation' END AS kind, pg_catalog.pg_get_userbyid(c.relowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted INTO hit
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
WHERE c.relname = 'messages_pkey' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'messages_pkey', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'messages_pkey', hit.kind);
END IF;
END
$check$;

CREATE TABLE messages (
    id UUID NOT NULL, 
    agent_id TEXT NOT NULL, 
    scope TEXT NOT NULL, 
    role TEXT NOT NULL, 
    content TEXT NOT NULL, 
    created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT messages_pkey PRIMARY KEY (id)
);

INSERT INTO alembic_version (version_num) VALUES ('20260801000001') RETURNING alembic_version.version_num;
