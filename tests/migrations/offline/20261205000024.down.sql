-- Running downgrade 20261205000024 -> 20261205000023

DROP STATISTICS IF EXISTS cortex_sessions_metadata_pairs;

COMMIT;

DROP INDEX CONCURRENTLY IF EXISTS ix_sessions_metadata_pairs;

BEGIN;

DROP FUNCTION IF EXISTS cortex_metadata_ids(text, jsonb, integer);

DROP FUNCTION IF EXISTS cortex_metadata_pairs(text, json, jsonb);

UPDATE alembic_version SET version_num='20261205000023' WHERE alembic_version.version_num = '20261205000024';
