-- Running upgrade 20261205000022 -> 20261205000023

COMMIT;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS trimmed_count integer NOT NULL DEFAULT 0;

ALTER TABLE sessions ADD CONSTRAINT ck_sessions_trimmed_count CHECK (trimmed_count >= 0) NOT VALID;

ALTER TABLE sessions VALIDATE CONSTRAINT ck_sessions_trimmed_count;

BEGIN;

UPDATE alembic_version SET version_num='20261205000023' WHERE alembic_version.version_num = '20261205000022';
