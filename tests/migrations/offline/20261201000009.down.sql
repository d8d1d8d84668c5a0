-- Running downgrade 20261201000009 -> 20261201000008

DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = 'cortex_sessions_metadata_as_jsonb' AND tgrelid = pg_catalog.to_regclass('sessions')
    ) THEN
        DROP TRIGGER cortex_sessions_metadata_as_jsonb ON sessions;
    END IF;
END
$ddl$;

DROP FUNCTION IF EXISTS cortex_forget_metadata_text();

UPDATE sessions SET metadata = metadata_json::jsonb WHERE metadata_json IS NOT NULL;

ALTER TABLE sessions DROP COLUMN metadata_json;

UPDATE messages SET metadata = metadata_json::jsonb WHERE metadata_json IS NOT NULL;

ALTER TABLE messages DROP COLUMN metadata_json;

UPDATE alembic_version SET version_num='20261201000008' WHERE alembic_version.version_num = '20261201000009';
