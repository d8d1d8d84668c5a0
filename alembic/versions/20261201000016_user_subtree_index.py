"""A depth-3 subtree (a user's sessions) is one ordered index walk: ``scope_l3`` and its indexes.

Revision ID: 20261201000016
Revises: 20261201000015
Create Date: 2026-12-01

Why it exists: the listing a request path runs most, "this user's sessions"
(the subtree of a depth-3 scope such as ``acme/support/user-42``), had no
index in its order. Its predicate, the exact scope or the byte range beneath
it, was read through the tenant's (or the depth-2 scope's) listing index and
filtered: on the physical benchmark's data (ten users interleaved in one
tenant) a page of 100 stepped over 893 rows of the other users, 0.52 ms on
the server against 0.15 ms for an index walk of the user's own rows
(docs/query-plans.md P8). With a thousand users in a tenant the
walk would step over a thousand rows per row returned. An expression index
on the path's first three segments would need no new column, but row-level
security keeps a non-leakproof function (``split_part``, ``substring``) out
of an index condition, so the planner never uses it for the application
role: the prefix is a column, like ``scope_l2``.

Adds ``sessions.scope_l3`` (the first three segments when ``scope_depth >=
3``, else NULL) and two listing indexes keyed by it, without and with the
agent, in the listing order with ``is_default`` last, partial on
``scope_depth >= 3``. cortex writes the column at insert; a ``BEFORE
INSERT`` trigger fills it for rows an older release inserts (it fires only
when the column is missing, so cortex's own inserts never call it).

Safe with: on plain PostgreSQL every cortex release from 20261201000009 on
(the trigger fills what they do not write); on Citus this release only.
Online: the column is a catalog change (nullable, no default: no rewrite)
under a short lock timeout with retries; the trigger the same. Existing rows
are filled in batches of :data:`BATCH` in primary-key order, each batch its
own transaction (a rerun resumes: it fills only rows still NULL). A role
held to FORCE ROW LEVEL SECURITY (an owner that is neither superuser nor
BYPASSRLS) would see no rows: a permissive policy for the migrating role
alone (:data:`FILL_POLICY`) opens them for the fill and is dropped after it,
two short table locks in all; the application role is never the owner, so
it sees nothing new. The upgrade then counts the rows still missing the
column and fails if there is one. The indexes are built ``CONCURRENTLY``.
On Citus the fill is one distributed UPDATE and there is no trigger, so the
previous release must not write beside this one: on a distributed database
this revision serves only code from itself on
(``safe_with_code_from_distributed``; stop the previous release before
upgrading, as docs/citus.md says).

Measured on the 1,000,000-session benchmark seed (900,000 of them at depth
3): the upgrade, fill and both index builds, took 80 s; the indexes are 71
and 79 MB beside the table's 409 MB.

Downgrade drops the indexes, the trigger and the column: nothing is lost
(the column is derived from ``scope``).
"""

import logging
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000016"
down_revision: str | Sequence[str] | None = "20261201000015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"
# On Citus: no trigger fills the column for an older release's inserts.
safe_with_code_from_distributed: str = "20261201000016"

log = logging.getLogger("cortex")

BATCH: Final = 2000
_PREFIX: Final = (
    "split_part({s}, '/', 1) || '/' || split_part({s}, '/', 2) || '/' || split_part({s}, '/', 3)"
)
_LISTED: Final = "updated_at DESC, id DESC, is_default"
_DEPTH_3: Final = " WHERE scope_depth >= 3"
INDEXES: Final = {
    "ix_sessions_l3_recent": f"sessions (tenant_id, scope_l3, {_LISTED}){_DEPTH_3}",
    "ix_sessions_agent_l3_recent": (
        f"sessions (tenant_id, agent_id, scope_l3, {_LISTED}){_DEPTH_3}"
    ),
}

FUNCTION: Final = "cortex_sessions_scope_l3"
TRIGGER: Final = "cortex_sessions_scope_l3"
CREATE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    NEW.scope_l3 := {_PREFIX.format(s="NEW.scope")};
    RETURN NEW;
END
$fn$
"""
# Not on Citus: it refuses triggers on distributed tables (see revision 20261201000009).
CREATE_TRIGGER: Final = ddl.unless_distributed_sql(
    "sessions",
    f"""
    DROP TRIGGER IF EXISTS {TRIGGER} ON sessions;
    CREATE TRIGGER {TRIGGER} BEFORE INSERT ON sessions FOR EACH ROW
        WHEN (NEW.scope_depth >= 3 AND NEW.scope_l3 IS NULL)
        EXECUTE FUNCTION {FUNCTION}();""",
)
DROP_TRIGGER: Final = ddl.drop_trigger_sql(TRIGGER, "sessions")

_FILL_ALL: Final = (
    f"UPDATE sessions SET scope_l3 = {_PREFIX.format(s='scope')}"
    " WHERE scope_depth >= 3 AND scope_l3 IS NULL"
)
# One batch, one statement: the next BATCH rows after the key left in the
# session's cortex.l3_after_* settings; their key is left there for the next.
_FILL_BATCH: Final = """
DO $fill$
DECLARE
    last_tenant text;
    last_id uuid;
BEGIN
    WITH batch AS (
        SELECT tenant_id, id FROM sessions
        WHERE (tenant_id, id) > (pg_catalog.current_setting('cortex.l3_after_tenant'),
                                 pg_catalog.current_setting('cortex.l3_after_id')::uuid)
        ORDER BY tenant_id, id
        LIMIT {batch}
    ), filled AS (
        UPDATE sessions AS s SET scope_l3 = {prefix}
        FROM batch AS b
        WHERE s.tenant_id = b.tenant_id AND s.id = b.id
          AND s.scope_depth >= 3 AND s.scope_l3 IS NULL
    )
    SELECT tenant_id, id INTO last_tenant, last_id
    FROM batch ORDER BY tenant_id DESC, id DESC LIMIT 1;
    PERFORM pg_catalog.set_config('cortex.l3_after_tenant', coalesce(last_tenant, ''), false);
    PERFORM pg_catalog.set_config('cortex.l3_after_id', coalesce(last_id::text, ''), false);
END
$fill$
"""
# Row-level security holds an owner that is neither superuser nor BYPASSRLS
# too (FORCE), and would hide every tenant's rows from the fill. For the
# fill only, a permissive policy lets the migrating role itself (no other)
# read and write every row: created once and dropped at the end (two short
# table locks), where lifting FORCE would lock the table for every batch.
# The application role is never the table's owner, so nothing changes for it.
FILL_POLICY: Final = "cortex_fill_scope_l3"
_OPEN_FILL: Final = (
    f"DROP POLICY IF EXISTS {FILL_POLICY} ON sessions",
    f"CREATE POLICY {FILL_POLICY} ON sessions TO CURRENT_USER USING (true) WITH CHECK (true)",
)
_CLOSE_FILL: Final = f"DROP POLICY IF EXISTS {FILL_POLICY} ON sessions"
# After the fill: every row that needs the column has it, or the upgrade fails.
_CHECK_FILLED: Final = """
DO $check$
DECLARE
    missing bigint;
BEGIN
    SELECT count(*) INTO missing FROM sessions WHERE scope_depth >= 3 AND scope_l3 IS NULL;
    IF missing > 0 THEN
        RAISE EXCEPTION 'scope_l3: % sessions at depth 3 or deeper were not filled', missing;
    END IF;
END
$check$
"""


def _fill() -> None:
    """Write ``scope_l3`` into the rows that lack it, under the fill policy, then check.

    In batches on plain PostgreSQL; one UPDATE offline (``cortex db sql``)
    and on Citus (a distributed statement, run on every shard at once).
    """
    ddl.run(*_OPEN_FILL)
    if op.get_context().as_sql or ddl.sessions_distributed(op.get_bind()):
        ddl.run(_FILL_ALL)
    else:
        _fill_in_batches(op.get_bind())
    ddl.run(_CHECK_FILLED)
    ddl.run(_CLOSE_FILL)


def _fill_in_batches(bind: Connection) -> None:
    statement = _FILL_BATCH.format(batch=BATCH, prefix=_PREFIX.format(s="s.scope"))
    bind.execute(sa.text("SELECT pg_catalog.set_config('cortex.l3_after_tenant', '', false)"))
    bind.execute(
        sa.text(
            "SELECT pg_catalog.set_config('cortex.l3_after_id',"
            " '00000000-0000-0000-0000-000000000000', false)"
        )
    )
    batches = 0
    while True:
        ddl.run(statement)
        batches += 1
        if not bind.execute(sa.text("SELECT current_setting('cortex.l3_after_id')")).scalar():
            break
        if batches % 100 == 0:
            log.info("scope_l3: %d rows visited", batches * BATCH)


def upgrade() -> None:
    ddl.check(
        ddl.relation_check("sessions", having={"scope_l3": "text"}),
        ddl.function_check(FUNCTION, ""),
        # The fill policy of a killed run is dropped and made again, whatever its form.
        ddl.policies_check(
            "sessions", {"tenant_isolation": ddl.TENANT_ISOLATION, FILL_POLICY: None}
        ),
        *(ddl.relation_check(name, "index", on="sessions") for name in INDEXES),
    )
    with op.get_context().autocommit_block():
        ddl.run('ALTER TABLE sessions ADD COLUMN IF NOT EXISTS scope_l3 text COLLATE "C"')
        ddl.run(CREATE_FUNCTION)
        ddl.run(CREATE_TRIGGER)
        _fill()
        for name, definition in INDEXES.items():
            ddl.create_index(name, definition)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (a column derived from ``scope``)."""
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            ddl.drop_index(name)
        # Left by an upgrade killed half way. In a transaction of its own: Citus
        # refuses a function command after the parallel policy DDL in one.
        ddl.run(_CLOSE_FILL)
    op.execute(DROP_TRIGGER)
    op.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    op.drop_column("sessions", "scope_l3")
