-- Running upgrade 20260901000005 -> 20261001000006

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
SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attnum > 0 AND NOT a.attisdropped;
IF listed IS DISTINCT FROM 'tenant_id text, session_id uuid, raised_seq integer, interrupt_id text, message text, author text, raised_at timestamp with time zone, response_schema jsonb, payload jsonb' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('table %s has the columns (%s), not the ones cortex makes (%s); drop or rename it, then run the migration again', 'pending_inputs', listed, 'tenant_id text, session_id uuid, raised_seq integer, interrupt_id text, message text, author text, raised_at timestamp with time zone, response_schema jsonb, payload jsonb');
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
WHERE c.relname = 'session_markers' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit FROM pg_catalog.pg_type AS t
    WHERE t.typname = 'session_markers' AND t.typnamespace = pg_catalog.current_schema()::regnamespace;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', 'type', 'session_markers', hit.owner, current_user);
    END IF;
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'session_markers', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('r', 'p') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a table: cortex did not make it; drop or rename it, then run the migration again', 'session_markers', hit.kind);
END IF;
SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attnum > 0 AND NOT a.attisdropped;
IF listed IS DISTINCT FROM 'tenant_id text, session_id uuid, kind text, scope text, reason text, marked_at timestamp with time zone' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('table %s has the columns (%s), not the ones cortex makes (%s); drop or rename it, then run the migration again', 'session_markers', listed, 'tenant_id text, session_id uuid, kind text, scope text, reason text, marked_at timestamp with time zone');
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
    IF hit.name NOT IN ('tenant_isolation') THEN
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
    IF hit.name NOT IN ('tenant_isolation') THEN
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
WHERE a.attrelid = hit.oid AND a.attname = 'pending_count' AND NOT a.attisdropped;
IF FOUND AND listed <> 'integer' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'pending_count', listed, 'integer');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'is_aborted' AND NOT a.attisdropped;
IF FOUND AND listed <> 'boolean' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'is_aborted', listed, 'boolean');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'is_interrupted' AND NOT a.attisdropped;
IF FOUND AND listed <> 'boolean' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'is_interrupted', listed, 'boolean');
END IF;
SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed FROM pg_catalog.pg_attribute AS a
WHERE a.attrelid = hit.oid AND a.attname = 'state' AND NOT a.attisdropped;
IF FOUND AND listed <> 'text' THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('column %s.%s is %s, not the %s cortex adds: cortex did not make it; drop or rename it, then run the migration again', 'sessions', 'state', listed, 'text');
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
WHERE c.relname = 'pk_pending_inputs' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'pk_pending_inputs', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'pk_pending_inputs', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'pending_inputs' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'pk_pending_inputs', 'pending_inputs');
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
WHERE c.relname = 'ix_pending_inputs_interrupt' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_pending_inputs_interrupt', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_pending_inputs_interrupt', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'pending_inputs' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_pending_inputs_interrupt', 'pending_inputs');
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
WHERE c.relname = 'pk_session_markers' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'pk_session_markers', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'pk_session_markers', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'session_markers' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'pk_session_markers', 'session_markers');
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
WHERE c.relname = 'ix_sessions_state_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_state_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_state_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_state_recent', 'sessions');
END IF;
END
$check$;

CREATE TABLE pending_inputs (
    tenant_id TEXT COLLATE "C" NOT NULL, 
    session_id UUID NOT NULL, 
    raised_seq INTEGER NOT NULL, 
    interrupt_id TEXT NOT NULL, 
    message TEXT DEFAULT '' NOT NULL, 
    author TEXT DEFAULT '' NOT NULL, 
    raised_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    response_schema JSONB, 
    payload JSONB, 
    CONSTRAINT pk_pending_inputs PRIMARY KEY (tenant_id, session_id, raised_seq), 
    CONSTRAINT fk_pending_inputs_tenant_id_session_id_sessions FOREIGN KEY(tenant_id, session_id) REFERENCES sessions (tenant_id, id) ON DELETE CASCADE
);

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
    FOREACH cortex_table IN ARRAY ARRAY['pending_inputs']::text[] LOOP
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

CREATE INDEX ix_pending_inputs_interrupt ON pending_inputs (tenant_id, session_id, interrupt_id);

CREATE TABLE session_markers (
    tenant_id TEXT COLLATE "C" NOT NULL, 
    session_id UUID NOT NULL, 
    kind TEXT NOT NULL, 
    scope TEXT COLLATE "C" NOT NULL, 
    reason TEXT DEFAULT '' NOT NULL, 
    marked_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT pk_session_markers PRIMARY KEY (tenant_id, session_id, kind), 
    CONSTRAINT ck_session_markers_ck_session_markers_kind CHECK (kind IN ('aborted', 'interrupted'))
);

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
    FOREACH cortex_table IN ARRAY ARRAY['session_markers']::text[] LOOP
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

ALTER TABLE pending_inputs ENABLE ROW LEVEL SECURITY;

ALTER TABLE pending_inputs FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON pending_inputs USING (tenant_id = current_setting('cortex.tenant', true)) WITH CHECK (tenant_id = current_setting('cortex.tenant', true));

ALTER TABLE session_markers ENABLE ROW LEVEL SECURITY;

ALTER TABLE session_markers FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON session_markers USING (tenant_id = current_setting('cortex.tenant', true)) WITH CHECK (tenant_id = current_setting('cortex.tenant', true));

COMMIT;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS pending_count integer NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS is_aborted boolean NOT NULL DEFAULT false, ADD COLUMN IF NOT EXISTS is_interrupted boolean NOT NULL DEFAULT false, ADD COLUMN IF NOT EXISTS state text GENERATED ALWAYS AS (CASE WHEN is_aborted THEN 'aborted' WHEN pending_count > 0 THEN 'paused' WHEN is_interrupted THEN 'interrupted' ELSE 'idle' END) STORED NOT NULL;

ALTER TABLE sessions ADD CONSTRAINT ck_sessions_ck_sessions_pending_count CHECK (pending_count >= 0) NOT VALID;

ALTER TABLE sessions VALIDATE CONSTRAINT ck_sessions_ck_sessions_pending_count;

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
WHERE c.relname = 'ix_sessions_state_recent' AND c.relnamespace = pg_catalog.current_schema()::regnamespace;
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.kind, 'ix_sessions_state_recent', hit.owner, current_user);
END IF;
IF hit.relkind NOT IN ('i', 'I') THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('%s is a %s, not a index: cortex did not make it; drop or rename it, then run the migration again', 'ix_sessions_state_recent', hit.kind);
END IF;
IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
    WHERE i.indexrelid = hit.oid AND t.relname = 'sessions' AND t.relnamespace = pg_catalog.current_schema()::regnamespace) THEN
    RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('an index named %s exists on another table than %s: cortex did not build it; drop or rename it, then run the migration again', 'ix_sessions_state_recent', 'sessions');
END IF;
END
$check$;

CREATE INDEX CONCURRENTLY ix_sessions_state_recent ON sessions (tenant_id, state, updated_at DESC, id DESC) WHERE state <> 'idle';

INSERT INTO pending_inputs (tenant_id, session_id, raised_seq, interrupt_id, message,
                            author, raised_at, response_schema, payload)
SELECT m.tenant_id, m.session_id, m.seq, m.requested_input->>'interrupt_id',
       coalesce(m.requested_input->>'message', ''), m.author, m.created_at,
       m.requested_input->'response_schema', m.requested_input->'payload'
FROM messages AS m
WHERE m.requested_input IS NOT NULL AND m.session_id IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM messages AS r
      WHERE r.tenant_id = m.tenant_id AND r.session_id = m.session_id
        AND r.seq > m.seq
        AND r.function_response->>'id' = m.requested_input->>'interrupt_id'
  )
ON CONFLICT DO NOTHING;

UPDATE sessions AS s SET pending_count = p.n
FROM (
    SELECT tenant_id, session_id, count(*) AS n FROM pending_inputs GROUP BY 1, 2
) AS p
WHERE s.tenant_id = p.tenant_id AND s.id = p.session_id AND s.pending_count <> p.n;

BEGIN;

UPDATE alembic_version SET version_num='20261001000006' WHERE alembic_version.version_num = '20260901000005';
