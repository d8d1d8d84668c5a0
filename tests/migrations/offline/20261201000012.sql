-- Running upgrade 20261201000011 -> 20261201000012

DO $check$
DECLARE
    hit record;
BEGIN

FOR hit IN
    SELECT p.oid::pg_catalog.regprocedure::text AS signature, p.prokind,
           pg_catalog.oidvectortypes(p.proargtypes) AS arguments,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner, (r.rolname = current_user OR r.rolsuper) AS trusted
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.proname = 'cortex_tenant_search' AND p.pronamespace = pg_catalog.current_schema()::regnamespace
LOOP
    IF NOT hit.trusted THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s exists, owned by %s, not by the migrating role %s: cortex did not make it; drop or rename it, then run the migration again', hit.signature, hit.owner, current_user);
    END IF;
    IF hit.arguments <> 'text, text' OR hit.prokind <> 'f' THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = pg_catalog.format('function %s (owned by %s) is not cortex''s %s(%s): a call meant for cortex''s could run it; drop or rename it, then run the migration again', hit.signature, hit.owner, 'cortex_tenant_search', 'text, text');
    END IF;
END LOOP;
END
$check$;

DO $migration$
BEGIN
    EXECUTE pg_catalog.format($function$
        CREATE OR REPLACE FUNCTION %1$I.cortex_tenant_search(tenant text, pattern text)
        RETURNS uuid[]
        LANGUAGE plpgsql STABLE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        BEGIN
            IF tenant IS DISTINCT FROM pg_catalog.current_setting('cortex.tenant', true) THEN
                RETURN '{}';
            END IF;
            RETURN ARRAY(
                SELECT s.id FROM %1$I.sessions AS s
                WHERE s.tenant_id = tenant
                  AND (s.title ILIKE pattern ESCAPE '/' OR s.last_message ILIKE pattern ESCAPE '/')
            );
        END
        $body$
    $function$, pg_catalog.current_schema());
    EXECUTE pg_catalog.format(
        'REVOKE ALL ON FUNCTION %I.cortex_tenant_search(text, text) FROM PUBLIC',
        pg_catalog.current_schema()
    );
END
$migration$;

UPDATE alembic_version SET version_num='20261201000012' WHERE alembic_version.version_num = '20261201000011';
