-- Running downgrade 20261201000016 -> 20261201000015

COMMIT;

DROP INDEX CONCURRENTLY IF EXISTS ix_sessions_l3_recent;

DROP INDEX CONCURRENTLY IF EXISTS ix_sessions_agent_l3_recent;

DROP POLICY IF EXISTS cortex_fill_scope_l3 ON sessions;

BEGIN;

DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = 'cortex_sessions_scope_l3' AND tgrelid = pg_catalog.to_regclass('sessions')
    ) THEN
        DROP TRIGGER cortex_sessions_scope_l3 ON sessions;
    END IF;
END
$ddl$;

DROP FUNCTION IF EXISTS cortex_sessions_scope_l3();

ALTER TABLE sessions DROP COLUMN scope_l3;

UPDATE alembic_version SET version_num='20261201000015' WHERE alembic_version.version_num = '20261201000016';
