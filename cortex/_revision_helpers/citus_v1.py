"""Citus: the statement that distributes cortex's tables by ``tenant_id``, on Citus only.

Each revision that creates a table calls :func:`distribute` right after it;
the step of :data:`CITUS_FLOOR` distributes the tables the revisions below it
keep local (``alembic/env.py``). On plain PostgreSQL the statement does
nothing. Frozen once released (see :mod:`cortex._revision_helpers`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from alembic import op
from cortex.errors import InvalidInput

__all__ = [
    "CITUS_FLOOR",
    "COLOCATION_ANCHOR",
    "distribute",
    "distribute_sql",
    "distribute_tables_sql",
]

# The table every other cortex table is co-located with: a tenant's sessions,
# messages, pending inputs and markers share one shard group, so every
# statement (joins and foreign keys included) runs on one worker.
COLOCATION_ANCHOR: Final = "sessions"

# The oldest revision a distributed (Citus) database can be at: below it the
# tables are not yet keyed by tenant, and the backfill needs them local.
CITUS_FLOOR: Final = "20260824000004"

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# cortex._routines.PREFIX, copied so that a change to live code never reaches a revision.
_ROUTINE_PREFIX: Final = "cortex_r_"

# cortex's functions Citus does not hold on the workers (the routines apart).
_UNPROPAGATED_FUNCTIONS: Final = f"""
        SELECT p.oid FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = pg_catalog.current_schema()::regnamespace
          AND pg_catalog.starts_with(p.proname, 'cortex')
          AND NOT pg_catalog.starts_with(p.proname, '{_ROUTINE_PREFIX}')
          AND NOT EXISTS (
              SELECT FROM pg_catalog.pg_dist_object AS o
              WHERE o.classid = 'pg_catalog.pg_proc'::regclass AND o.objid = p.oid
          )"""


def distribute_sql(table: str) -> str:
    """The statement that distributes ``table`` by ``tenant_id`` if the database runs Citus.

    A ``DO`` block decided by the server when it runs, so the offline SQL
    ``cortex db sql`` prints does the same as an online upgrade. It does
    nothing unless the extension exists and the database's revision is at
    or past :data:`CITUS_FLOOR`: below it the tables are not yet shaped for
    distribution (``messages`` gains ``tenant_id`` and ``sessions`` appears in
    20260824000002), the backfill's batches must run on local tables, and
    the legacy release's inserts need the trigger that fills their tenant.
    Absent or already distributed: nothing. No cortex table fits a
    reference table (each is per tenant), and ``alembic_version`` stays on
    the coordinator, where only migrations read it.
    """
    return distribute_tables_sql((table,))


def distribute_tables_sql(tables: Sequence[str]) -> str:
    """One statement distributing each of ``tables`` still local, as :func:`distribute_sql` does.

    Each cortex function Citus lacks is handed to it too (ones made before
    the extension exist on the coordinator only).

    Raises:
        InvalidInput: a table is not a plain SQL identifier.
    """
    for table in tables:
        if _IDENTIFIER.fullmatch(table) is None:
            raise InvalidInput(f"table: {table!r} is not a plain SQL identifier")
    names = ", ".join(f"'{table}'" for table in tables)
    # Nested IFs and RETURNs: pg_dist_partition and alembic_version may not
    # exist, and PL/pgSQL plans a statement only when it reaches it.
    return f"""
DO $citus$
DECLARE
    cortex_table text;
    trigger_name name;
    function_id oid;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
       OR pg_catalog.to_regclass('alembic_version') IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM alembic_version WHERE version_num >= '{CITUS_FLOOR}') THEN
        RETURN;
    END IF;
    IF EXISTS ({_UNPROPAGATED_FUNCTIONS}) THEN
        -- Citus propagates a function over one connection per node, which a
        -- parallel DDL earlier in the transaction forbids.
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
    FOREACH cortex_table IN ARRAY ARRAY[{names}]::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regclass(cortex_table) IS NULL OR EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition
            WHERE logicalrelid = pg_catalog.to_regclass(cortex_table)
        );
        -- Citus refuses triggers on distributed tables (citus.enable_unsafe_triggers).
        -- cortex's own serve the previous releases only (a legacy writer's tenant,
        -- an old release's metadata rewrite); a Citus database serves this one.
        FOR trigger_name IN
            SELECT tgname FROM pg_catalog.pg_trigger
            WHERE tgrelid = pg_catalog.to_regclass(cortex_table) AND NOT tgisinternal
              AND tgname LIKE 'cortex%'
        LOOP
            EXECUTE pg_catalog.format('DROP TRIGGER %I ON %I', trigger_name, cortex_table);
        END LOOP;
        PERFORM pg_catalog.create_distributed_table(
            pg_catalog.to_regclass(cortex_table), 'tenant_id',
            colocate_with => CASE cortex_table WHEN '{COLOCATION_ANCHOR}' THEN 'none'
                                               ELSE '{COLOCATION_ANCHOR}' END
        );
    END LOOP;
    -- Made before the extension, they are on the coordinator only, yet the
    -- shards call them; after the tables, which their bodies name.
    FOR function_id IN {_UNPROPAGATED_FUNCTIONS} LOOP
        PERFORM pg_catalog.create_distributed_function(function_id::regprocedure);
    END LOOP;
END
$citus$
"""


def distribute(table: str) -> None:
    """Inside a migration: distribute the table it just created, on Citus only.

    Called right after the table exists (with its primary key, which leads
    with ``tenant_id``), before anything references it: a foreign key from a
    distributed table needs its target distributed and co-located already.
    Below :data:`CITUS_FLOOR` it does nothing; the floor's own step
    distributes the tables created before it.
    """
    op.execute(distribute_sql(table))
