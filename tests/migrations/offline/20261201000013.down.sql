-- Running downgrade 20261201000013 -> 20261201000012

DELETE FROM pending_inputs AS p
        USING messages AS m
        WHERE m.tenant_id = p.tenant_id AND m.session_id = p.session_id
          AND m.seq = p.raised_seq
          AND p.interrupt_id IS DISTINCT FROM m.requested_input ->> 'interrupt_id';

UPDATE sessions AS s SET pending_count = c.n
        FROM (
            SELECT s2.tenant_id, s2.id, count(p.raised_seq) AS n
            FROM sessions AS s2
            LEFT JOIN pending_inputs AS p
              ON p.tenant_id = s2.tenant_id AND p.session_id = s2.id
            WHERE s2.pending_count > 0
            GROUP BY s2.tenant_id, s2.id
        ) AS c
        WHERE s.tenant_id = c.tenant_id AND s.id = c.id AND s.pending_count <> c.n;

ALTER TABLE pending_inputs DROP CONSTRAINT pk_pending_inputs;

ALTER TABLE pending_inputs ADD CONSTRAINT pk_pending_inputs PRIMARY KEY (tenant_id, session_id, raised_seq);

ALTER TABLE messages DROP COLUMN more_function_responses;

ALTER TABLE messages DROP COLUMN more_requested_inputs;

UPDATE alembic_version SET version_num='20261201000012' WHERE alembic_version.version_num = '20261201000013';
