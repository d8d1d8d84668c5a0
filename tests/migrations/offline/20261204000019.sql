-- Running upgrade 20261203000018 -> 20261204000019

COMMIT;

ALTER TABLE messages ADD COLUMN IF NOT EXISTS deltas_digest bytea;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS scope_deltas_digest bytea;

BEGIN;

UPDATE alembic_version SET version_num='20261204000019' WHERE alembic_version.version_num = '20261203000018';
