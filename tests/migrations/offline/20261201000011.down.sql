-- Running downgrade 20261201000011 -> 20261201000010

DROP INDEX uq_sessions_key;

DROP TABLE scope_data;

ALTER TABLE sessions DROP CONSTRAINT ck_sessions_data_size;

ALTER TABLE messages DROP COLUMN payload_json;

ALTER TABLE sessions DROP COLUMN data;

ALTER TABLE sessions DROP COLUMN session_key;

UPDATE alembic_version SET version_num='20261201000010' WHERE alembic_version.version_num = '20261201000011';
