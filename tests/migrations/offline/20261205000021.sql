-- Running upgrade 20261205000020 -> 20261205000021

COMMIT;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS forked_from_id uuid, ADD COLUMN IF NOT EXISTS forked_from_seq integer;

BEGIN;

UPDATE alembic_version SET version_num='20261205000021' WHERE alembic_version.version_num = '20261205000020';
