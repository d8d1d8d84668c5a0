-- Running downgrade 20260824000004 -> 20260824000003

CREATE TEMPORARY TABLE backfill_touched ON COMMIT DROP AS
        WITH detached AS (
            -- RETURNING shows new values; the join keeps the session each row left.
            UPDATE messages AS m SET session_id = NULL, seq = NULL
            FROM (
                SELECT tenant_id, id, session_id FROM messages
                WHERE scope IS NOT NULL AND session_id IS NOT NULL
            ) AS old
            WHERE m.tenant_id = old.tenant_id AND m.id = old.id
            RETURNING old.tenant_id, old.session_id
        )
        SELECT DISTINCT tenant_id, session_id AS id FROM detached;

DELETE FROM sessions AS s
            WHERE s.backfilled_by = '20260824000004'
              AND NOT EXISTS (
                  SELECT 1 FROM messages AS m WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id
              );

UPDATE messages AS m SET seq = -r.rn
        FROM (
            SELECT m2.tenant_id, m2.id,
                   row_number() OVER (PARTITION BY m2.tenant_id, m2.session_id ORDER BY m2.seq) AS rn
            FROM messages AS m2
            JOIN backfill_touched AS t ON m2.tenant_id = t.tenant_id AND m2.session_id = t.id
        ) AS r
        WHERE m.tenant_id = r.tenant_id AND m.id = r.id;

UPDATE messages SET seq = -seq WHERE seq < 0;

UPDATE sessions AS s
            SET message_count = coalesce(c.n, 0),
                last_message = coalesce(c.last_content, ''),
                backfilled_by = CASE WHEN s.backfilled_by = '20260824000004' THEN '' ELSE s.backfilled_by END
            FROM backfill_touched AS t
            LEFT JOIN LATERAL (
                SELECT count(*) AS n,
                       (pg_catalog.array_agg(left(m.content, 256) ORDER BY m.seq DESC))[1]
                           AS last_content
                FROM messages AS m
                WHERE m.tenant_id = t.tenant_id AND m.session_id = t.id
            ) AS c ON true
            WHERE s.tenant_id = t.tenant_id AND s.id = t.id;

UPDATE alembic_version SET version_num='20260824000003' WHERE alembic_version.version_num = '20260824000004';
