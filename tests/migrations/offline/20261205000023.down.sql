-- Running downgrade 20261205000023 -> 20261205000022

COMMIT;

UPDATE messages AS m SET seq = -m.seq FROM sessions AS s WHERE s.tenant_id = m.tenant_id AND s.id = m.session_id AND s.trimmed_count > 0;

UPDATE messages AS m SET seq = -m.seq - s.trimmed_count FROM sessions AS s WHERE s.tenant_id = m.tenant_id AND s.id = m.session_id AND s.trimmed_count > 0;

UPDATE pending_inputs AS p SET raised_seq = -p.raised_seq FROM sessions AS s WHERE s.tenant_id = p.tenant_id AND s.id = p.session_id AND s.trimmed_count > 0;

UPDATE pending_inputs AS p SET raised_seq = -p.raised_seq - s.trimmed_count FROM sessions AS s WHERE s.tenant_id = p.tenant_id AND s.id = p.session_id AND s.trimmed_count > 0;

ALTER TABLE sessions DROP COLUMN IF EXISTS trimmed_count;

BEGIN;

UPDATE alembic_version SET version_num='20261205000022' WHERE alembic_version.version_num = '20261205000023';
