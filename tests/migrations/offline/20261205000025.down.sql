-- Running downgrade 20261205000025 -> 20261205000024

COMMIT;

DROP INDEX CONCURRENTLY IF EXISTS ix_sessions_console_recent;

BEGIN;

DO $citus$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$citus$;

DROP POLICY IF EXISTS console_scope ON sessions;

DROP POLICY IF EXISTS console_scope ON pending_inputs;

DROP POLICY IF EXISTS console_scope ON session_markers;

DROP TABLE IF EXISTS console_actions;

DROP FUNCTION IF EXISTS public.cortex_console_sees(text);

DO $console$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console') THEN
        REVOKE SELECT ON sessions, pending_inputs, session_markers FROM cortex_console;
        REVOKE SELECT (tenant_id, id, agent_id, scope, title, state, pending_count, is_aborted,
            is_interrupted, message_count, created_at, updated_at) ON sessions FROM cortex_console;
        REVOKE SELECT (tenant_id, session_id, raised_seq, interrupt_id, message, author,
            raised_at) ON pending_inputs FROM cortex_console;
        REVOKE USAGE ON SCHEMA public FROM cortex_console;
    END IF;
END
$console$;

UPDATE alembic_version SET version_num='20261205000024' WHERE alembic_version.version_num = '20261205000025';
