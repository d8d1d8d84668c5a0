-- Running downgrade 20261015000007 -> 20261001000006

DROP FUNCTION cortex_search_ids(text);

DROP INDEX ix_sessions_tenant_last_message_trgm;

DROP INDEX ix_sessions_tenant_title_trgm;

CREATE INDEX ix_sessions_title_trgm ON sessions USING gin (title gin_trgm_ops);

CREATE INDEX ix_sessions_last_message_trgm ON sessions USING gin (last_message gin_trgm_ops);

UPDATE alembic_version SET version_num='20261001000006' WHERE alembic_version.version_num = '20261015000007';
