-- Running downgrade 20261201000010 -> 20261201000009

DROP TABLE IF EXISTS cortex_schema_compat;

UPDATE alembic_version SET version_num='20261201000009' WHERE alembic_version.version_num = '20261201000010';
