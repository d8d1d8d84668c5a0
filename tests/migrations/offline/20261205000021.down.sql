-- Running downgrade 20261205000021 -> 20261205000020

DROP TABLE IF EXISTS retention_policies;

DROP TABLE IF EXISTS erasures;

UPDATE alembic_version SET version_num='20261205000020' WHERE alembic_version.version_num = '20261205000021';
