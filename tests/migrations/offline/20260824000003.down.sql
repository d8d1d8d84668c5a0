-- Running downgrade 20260824000003 -> 20260824000002

DROP INDEX uq_sessions_default;

UPDATE alembic_version SET version_num='20260824000002' WHERE alembic_version.version_num = '20260824000003';
