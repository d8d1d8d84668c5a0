-- Running downgrade 20261204000019 -> 20261203000018

COMMIT;

ALTER TABLE messages DROP COLUMN IF EXISTS deltas_digest;

ALTER TABLE sessions DROP COLUMN IF EXISTS scope_deltas_digest;

BEGIN;

UPDATE alembic_version SET version_num='20261203000018' WHERE alembic_version.version_num = '20261204000019';
