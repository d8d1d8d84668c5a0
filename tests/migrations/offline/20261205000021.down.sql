-- Running downgrade 20261205000021 -> 20261205000020

COMMIT;

ALTER TABLE sessions DROP COLUMN IF EXISTS forked_from_id, DROP COLUMN IF EXISTS forked_from_seq;

BEGIN;

UPDATE alembic_version SET version_num='20261205000020' WHERE alembic_version.version_num = '20261205000021';
