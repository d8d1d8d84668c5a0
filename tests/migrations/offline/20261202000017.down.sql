-- Running downgrade 20261202000017 -> 20261201000016

COMMIT;

ALTER TABLE sessions ADD CONSTRAINT ck_sessions_data_size CHECK (octet_length(data::text) <= 1048576) NOT VALID;

ALTER TABLE sessions VALIDATE CONSTRAINT ck_sessions_data_size;

ALTER TABLE sessions DROP CONSTRAINT IF EXISTS ck_sessions_data_stored_size;

DROP FUNCTION IF EXISTS cortex_bounded_data(jsonb);

BEGIN;

UPDATE alembic_version SET version_num='20261201000016' WHERE alembic_version.version_num = '20261202000017';
