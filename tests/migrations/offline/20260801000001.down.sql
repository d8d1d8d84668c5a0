-- Running downgrade 20260801000001 -> 

DROP TABLE messages;

DELETE FROM alembic_version WHERE alembic_version.version_num = '20260801000001';
