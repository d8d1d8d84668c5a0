-- Running downgrade 20261201000012 -> 20261201000011

DROP FUNCTION IF EXISTS cortex_tenant_search(text, text);

UPDATE alembic_version SET version_num='20261201000011' WHERE alembic_version.version_num = '20261201000012';
