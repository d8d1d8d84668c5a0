-- Running downgrade 20261201000008 -> 20261015000007

UPDATE alembic_version SET version_num='20261015000007' WHERE alembic_version.version_num = '20261201000008';
