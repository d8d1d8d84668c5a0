-- Running downgrade 20260824000002 -> 20260801000001

DROP TRIGGER IF EXISTS cortex_messages_tenant ON messages;

DROP FUNCTION IF EXISTS cortex_messages_tenant();

UPDATE messages AS m
        SET agent_id = s.agent_id, scope = s.scope
        FROM sessions AS s
        WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id AND m.scope IS NULL;

DROP INDEX ix_messages_unsessioned;

DROP INDEX uq_messages_session_seq;

ALTER TABLE messages DROP CONSTRAINT ck_messages_ck_messages_session_seq;

ALTER TABLE messages DROP CONSTRAINT fk_messages_tenant_id_session_id_sessions;

ALTER TABLE messages DROP CONSTRAINT pk_messages;

ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (id);

ALTER TABLE messages ALTER COLUMN agent_id SET NOT NULL;

ALTER TABLE messages ALTER COLUMN scope SET NOT NULL;

ALTER TABLE messages DROP COLUMN metadata;

ALTER TABLE messages DROP COLUMN function_response;

ALTER TABLE messages DROP COLUMN requested_input;

ALTER TABLE messages DROP COLUMN author;

ALTER TABLE messages DROP COLUMN seq;

ALTER TABLE messages DROP COLUMN session_id;

ALTER TABLE messages DROP COLUMN tenant_id;

DROP TABLE sessions;

UPDATE alembic_version SET version_num='20260801000001' WHERE alembic_version.version_num = '20260824000002';
