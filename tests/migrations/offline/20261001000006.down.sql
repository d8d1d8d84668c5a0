-- Running downgrade 20261001000006 -> 20260901000005

DROP TABLE session_markers;

DROP TABLE pending_inputs;

DROP INDEX ix_sessions_state_recent;

ALTER TABLE sessions DROP CONSTRAINT ck_sessions_ck_sessions_pending_count;

ALTER TABLE sessions DROP COLUMN state;

ALTER TABLE sessions DROP COLUMN is_interrupted;

ALTER TABLE sessions DROP COLUMN is_aborted;

ALTER TABLE sessions DROP COLUMN pending_count;

UPDATE alembic_version SET version_num='20260901000005' WHERE alembic_version.version_num = '20261001000006';
