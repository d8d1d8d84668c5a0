-- Running upgrade 20260824000003 -> 20260824000004

-- 20260824000004: the backfill validates agent ids and scopes with cortex's own rules (Python); run `cortex db backfill` online;

UPDATE alembic_version SET version_num='20260824000004' WHERE alembic_version.version_num = '20260824000003';
