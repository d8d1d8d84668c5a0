-- Running downgrade 20261205000022 -> 20261205000021

DROP TABLE IF EXISTS retention_policies;

DROP TABLE IF EXISTS erasures;

UPDATE alembic_version SET version_num='20261205000021' WHERE alembic_version.version_num = '20261205000022';
