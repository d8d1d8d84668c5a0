"""Locate cortex's Alembic migrations and run them; grant an application role.

The migrations live in the repository's top-level ``alembic/`` folder and ship
inside the wheel as ``cortex/_alembic``; :func:`script_location` finds
whichever is present, so ``cortex db upgrade`` works from a checkout and from
a plain install alike.

Downgrades refuse to destroy data unless told: each revision's module offers
``data_loss(conn) -> list[str]``, what its downgrade would drop on this
database (``[]`` when nothing); :func:`check_downgrade` asks every revision a
downgrade would undo and raises :class:`DataLossRefused` naming what would go.

Deployment roles: migrations run as the *owner* role (it creates the tables
and the pg_trgm extension). The service connects as a separate *application*
role that is neither owner nor superuser nor BYPASSRLS, so row-level
security applies to it; :func:`grant_sql` lists what that role needs.

Citus: on a database with the ``citus`` extension (a coordinator), each
migration that creates a cortex table distributes it there and then
(:func:`cortex._revision_helpers.citus_v1.distribute`), and the step of
:data:`CITUS_FLOOR` distributes the tables the revisions below it keep local
(:func:`distribute_all_sql`), so ``cortex db upgrade`` alone produces the
distributed schema. On plain PostgreSQL both do nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Final, NamedTuple

import asyncpg
import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.util import await_only

from alembic import command
from cortex._db import routines as _routines
from cortex._db.engine import normalise_url, one_off_connection, tables_distributed
from cortex._revision_helpers import backfill_v1, ddl_v1
from cortex._revision_helpers.citus_v1 import CITUS_FLOOR, distribute_tables_sql
from cortex.errors import InvalidInput, SchemaMismatch

__all__ = [
    "BACKFILL_REVISION",
    "CITUS_FLOOR",
    "MIGRATION_LOCK_KEY",
    "DataLossRefused",
    "Distribution",
    "Step",
    "alembic_config",
    "backfill",
    "check_downgrade",
    "distribute_all_sql",
    "distribution_of",
    "downgrade",
    "grant_sql",
    "oldest_compatible_code",
    "record_compatibility",
    "regrant_sql",
    "script_location",
    "upgrade",
]

# pg_advisory_lock key that serialises concurrent upgrades (a fixed bigint:
# the first 8 bytes of "cortex-migrate" read as an integer).
MIGRATION_LOCK_KEY: Final = int.from_bytes(b"cortex-m", "big") >> 1
# The revision that backfills legacy conversations (backfill_v1); its id
# is what backfilled sessions carry in backfilled_by.
BACKFILL_REVISION: Final = "20260824000004"

_PACKAGE = Path(__file__).resolve().parent
log = logging.getLogger("cortex")

_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def script_location() -> Path:
    """The folder holding env.py and versions/: the wheel's, else the checkout's."""
    # The wheel's copy first: in site-packages, the sibling "alembic" folder is
    # the Alembic library itself, not ours.
    for candidate in (_PACKAGE / "_alembic", _PACKAGE.parent / "alembic"):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise FileNotFoundError("cortex's migrations are missing from this installation")


def alembic_config(url: str | None = None, *, configure_logging: bool = False) -> Config:
    """An Alembic Config for cortex's migrations, bound to ``url`` when given."""
    location = script_location()
    ini = location.parent / "alembic.ini"
    if not ini.is_file():
        ini = location / "alembic.ini"
    config = Config(str(ini) if ini.is_file() else None)
    config.set_main_option("script_location", str(location))
    if url is not None:
        rendered = normalise_url(url).render_as_string(hide_password=False)
        # ConfigParser interpolation: a literal % must be doubled.
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    config.attributes["configure_logging"] = configure_logging
    return config


class DataLossRefused(InvalidInput):
    """A downgrade would destroy data and was not told that it may."""


# Every cortex table, the co-location anchor first (a table joins its group).
_DISTRIBUTED_TABLES: Final = (
    "sessions",
    "messages",
    "pending_inputs",
    "session_markers",
    "scope_data",
    "erasures",
    "retention_policies",
    "console_actions",
    "metadata_pairs",
)


def distribute_all_sql() -> str:
    """One statement distributing every cortex table still local, on Citus at or past the floor.

    ``alembic/env.py`` runs it in the step that reaches :data:`CITUS_FLOOR`
    (in the step's transaction, online and in offline SQL), which
    distributes the ``sessions`` and ``messages`` earlier revisions created
    local, and before and after every upgrade run, so a database migrated
    *before* the citus extension was added is distributed by the next
    ``cortex db upgrade`` before a revision co-locates a new table with it.
    Each cortex function Citus lacks is handed to it too (ones made before
    the extension exist on the coordinator only). Tables absent at this
    revision are skipped; on plain PostgreSQL it does nothing.
    """
    return distribute_tables_sql(_DISTRIBUTED_TABLES)


def console_policy_for_citus_sql() -> str:
    """On Citus, the console's policy on a still-local ``pending_inputs`` made fit to distribute.

    Revision 20261205000025 gives the console role a policy on
    ``pending_inputs`` that looks its session up (a subquery) on plain
    PostgreSQL, and one that checks its tenant on Citus, which cannot carry
    a subquery in a policy to its shards. A database migrated past it
    before the extension was added holds the first, which
    ``create_distributed_table`` refuses: ``alembic/env.py`` runs this
    before :func:`distribute_all_sql`, with it the same expression the
    revision gives Citus. Anywhere else it does nothing.
    """
    return """
DO $console$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus')
       OR pg_catalog.to_regclass('pending_inputs') IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = pg_catalog.to_regclass('pending_inputs'))
       OR NOT EXISTS (SELECT FROM pg_catalog.pg_policy
                      WHERE polrelid = pg_catalog.to_regclass('pending_inputs')
                        AND polname = 'console_scope') THEN
        RETURN;
    END IF;
    DROP POLICY console_scope ON pending_inputs;
    CREATE POLICY console_scope ON pending_inputs FOR SELECT TO cortex_console
        USING (public.cortex_console_sees(tenant_id));
END
$console$
"""


_DISTRIBUTION_SQL: Final = """
SELECT c.relname::text AS name,
       CASE p.partmethod WHEN 'h' THEN 'distributed' WHEN 'n' THEN 'reference' END AS kind,
       p.colocationid
FROM pg_catalog.pg_dist_partition AS p
JOIN pg_catalog.pg_class AS c ON c.oid = p.logicalrelid
WHERE c.relnamespace = pg_catalog.current_schema()::regnamespace
ORDER BY c.relname
"""


class Distribution(NamedTuple):
    """Whether cortex's tables are distributed, and one line saying how (``cortex db current``)."""

    distributed: bool
    summary: str


def distribution_of(connection: Connection) -> Distribution:
    """Plain PostgreSQL, or how Citus holds cortex's tables."""
    citus = connection.execute(
        sa.text("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus'")
    ).scalar()
    if citus is None:
        return Distribution(False, "not distributed (plain PostgreSQL)")
    workers = connection.execute(
        sa.text("SELECT count(*) FROM pg_catalog.pg_dist_node WHERE groupid <> 0 AND isactive")
    ).scalar()
    on = f"Citus {citus}, {workers} workers"
    if not tables_distributed(connection):
        return Distribution(False, f"not distributed ({on}; run `cortex db upgrade`)")
    rows = connection.execute(sa.text(_DISTRIBUTION_SQL)).all()
    groups = {row.colocationid for row in rows}
    tables = ", ".join(f"{row.name} ({row.kind})" for row in rows)
    together = "co-located" if len(groups) == 1 else f"in {len(groups)} co-location groups"
    return Distribution(True, f"distributed by tenant_id on {on}, {together}: {tables}")


def upgrade(
    url: str,
    revision: str = "head",
    *,
    backfill_batch: int | None = None,
    backfill_rate: float | None = None,
) -> list[Step]:
    """Upgrade the database to ``revision`` (advisory-locked; safe to run concurrently).

    ``backfill_batch`` (legacy messages per batch) and ``backfill_rate``
    (messages per second at most) tune the backfill revision.

    Returns:
        The revisions applied, in order, with the seconds each took.
    """
    config = alembic_config(url)
    x = []
    if backfill_batch is not None:
        x.append(f"backfill_batch={backfill_batch}")
    if backfill_rate is not None:
        x.append(f"backfill_rate={backfill_rate}")
    if x:
        config.cmd_opts = argparse.Namespace(x=x)  # Alembic reads only .x
    command.upgrade(config, revision)
    return _steps(config)


class Step(NamedTuple):
    """One revision a run applied or undid: where it went, from where, in how many seconds."""

    revision: str
    source: str
    seconds: float


def _steps(config: Config) -> list[Step]:
    """The steps alembic/env.py recorded for this run."""
    return [
        Step(step["revision"], step["from"], step["seconds"])
        for step in config.attributes.get("applied", [])
    ]


def downgrade(url: str, revision: str, *, allow_data_loss: bool = False) -> list[Step]:
    """Downgrade the database to ``revision``; the steps undone, in order.

    Raises:
        DataLossRefused: the steps down would destroy data (each revision's
            ``data_loss`` says what) and ``allow_data_loss`` is false. Nothing
            has run then.
    """
    config = alembic_config(url)
    config.attributes["downgrade_to"] = revision
    if not allow_data_loss:
        config.attributes["guard_downgrade_to"] = revision
    command.downgrade(config, revision)
    return _steps(config)


def check_downgrade(conn: Connection, script: ScriptDirectory, target: str) -> None:
    """Raise :class:`DataLossRefused` if downgrading to ``target`` would destroy data.

    Runs inside a transaction the caller rolls back (counting rows under FORCE
    ROW LEVEL SECURITY lifts it for the count only).

    Raises:
        DataLossRefused: naming, per revision, what its downgrade would drop.
        InvalidInput: ``target`` is not a revision of this history.
    """
    heads = MigrationContext.configure(conn).get_current_heads()
    try:
        steps = list(
            script.revision_map.iterate_revisions(
                heads, target, select_for_downgrade=True, inclusive=False
            )
        )
    except (CommandError, RevisionError) as exc:
        raise InvalidInput(f"revision: {exc}") from None
    lost: list[str] = []
    for step in steps:
        # Script (not bare Revision) objects carry the loaded module.
        data_loss = getattr(getattr(step, "module", None), "data_loss", None)
        if data_loss is not None:
            lost.extend(f"{step.revision}: {item}" for item in data_loss(conn))
    if lost:
        raise DataLossRefused(
            f"downgrade to {target} would destroy data: {'; '.join(lost)}. "
            "Pass --allow-data-loss (cortex db downgrade) to go ahead"
        )


def check_distributed_downgrade(conn: Connection, script: ScriptDirectory, target: str) -> None:
    """Refuse, before any step runs, a downgrade that would take a distributed database below CITUS_FLOOR.

    Raises:
        InvalidInput: the database is distributed and ``target`` lies below
            :data:`CITUS_FLOOR` (or is not a revision of this history).
    """
    if not tables_distributed(conn):
        return
    heads = MigrationContext.configure(conn).get_current_heads()
    try:
        steps = script.revision_map.iterate_revisions(
            heads, target, select_for_downgrade=True, inclusive=False
        )
        undone = {step.revision for step in steps}
    except (CommandError, RevisionError) as exc:
        raise InvalidInput(f"revision: {exc}") from None
    if CITUS_FLOOR in undone:
        raise InvalidInput(
            f"revision: {target} is below {CITUS_FLOOR}, the oldest revision a distributed"
            " (Citus) database can be at: before it messages have no tenant to be distributed"
            f" by. Downgrade to {CITUS_FLOOR} at the lowest; nothing was changed"
        )


def backfill(
    url: str, *, batch_rows: int | None = None, max_rate: float | None = None
) -> backfill_v1.Totals:
    """Run the backfill again: session the legacy rows the old release wrote since it ran.

    For after the old release is gone (its last rows may have arrived after
    the backfill revision's final pass). Idempotent; takes the migration lock.

    Raises:
        SchemaMismatch: the database is not past the backfill revision.
        InvalidInput: ``batch_rows`` or ``max_rate`` out of range, or the role
            is held to row-level security (it would see no tenant's rows), or the
            database is distributed (Citus).
        DatabaseError: the database failed.
    """

    def run(conn: Connection) -> backfill_v1.Totals:
        while not conn.execute(
            sa.select(sa.func.pg_try_advisory_lock(MIGRATION_LOCK_KEY))
        ).scalar():
            conn.commit()
            time.sleep(0.5)
        conn.commit()
        try:
            # What a migration run refuses first: the backfill runs cortex's statements too.
            ddl_v1.check_on(conn, ddl_v1.preflight_check())
            heads = MigrationContext.configure(conn).get_current_heads()
            conn.commit()
            script = ScriptDirectory.from_config(alembic_config())
            if not heads or not any(
                rev.revision == BACKFILL_REVISION
                for rev in script.revision_map.iterate_revisions(heads, "base")
            ):
                raise SchemaMismatch(
                    f"database is at {', '.join(heads) or 'base'}: the backfill runs as "
                    f"revision {BACKFILL_REVISION}; run `cortex db upgrade`"
                )
            if tables_distributed(conn):
                raise InvalidInput(
                    "cortex db backfill runs on local tables only: a distributed (Citus) database"
                    f" sessioned its legacy rows at revision {CITUS_FLOOR}, before its tables were"
                    " distributed, and no release that writes legacy rows can run on it;"
                    " nothing was changed"
                )
            forced = conn.execute(
                sa.text("SELECT relforcerowsecurity FROM pg_class WHERE oid = 'messages'::regclass")
            ).scalar()
            if forced and not ddl_v1.bypasses_rls(conn):
                # Under FORCE ROW LEVEL SECURITY this role would see no tenant's rows
                # and report, wrongly, that nothing is left to do.
                raise InvalidInput(
                    "cortex db backfill reads every tenant: run it as a superuser or a "
                    "BYPASSRLS role"
                )
            conn.commit()
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            return backfill_v1.backfill(
                auto,
                revision=BACKFILL_REVISION,
                batch_rows=batch_rows or backfill_v1.DEFAULT_BATCH_ROWS,
                max_rate=max_rate,
            )
        finally:
            conn.rollback()
            conn.execute(sa.select(sa.func.pg_advisory_unlock(MIGRATION_LOCK_KEY)))
            conn.commit()

    async def main() -> backfill_v1.Totals:
        async with one_off_connection(url) as conn:
            return await conn.run_sync(run)

    return asyncio.run(main())


# What an application role needs, object by object: (privileges, object).
_GRANTS: Final = (
    ("USAGE", "SCHEMA public"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE sessions"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE messages"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE pending_inputs"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE session_markers"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE scope_data"),
    # Erasure receipts are durable: written and updated by erase_scope, never deleted.
    ("SELECT, INSERT, UPDATE", "TABLE erasures"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE retention_policies"),
    # The operator audit trail is append-only: written once, never changed.
    ("SELECT, INSERT", "TABLE console_actions"),
    # connect() reads the schema revision and which code it serves.
    ("SELECT", "TABLE alembic_version"),
    ("SELECT", "TABLE cortex_schema_compat"),
    # Tenant-wide search (it checks the bound tenant itself).
    ("EXECUTE", "FUNCTION cortex_search_ids(text)"),
    # The same, by tenant, in a statement of its own (what Citus can route).
    ("EXECUTE", "FUNCTION cortex_tenant_search(text, text)"),
    # A metadata filter's candidates; only cortex's triggers write them.
    ("SELECT", "TABLE metadata_pairs"),
)


def grant_sql(role: str) -> list[str]:
    """The statements that let application role ``role`` use cortex, and no more.

    Raises:
        InvalidInput: if ``role`` is not a plain SQL identifier.
    """
    if _ROLE.fullmatch(role) is None:
        raise InvalidInput(f"role: {role!r} is not a plain SQL identifier")
    grants = [f'GRANT {privileges} ON {target} TO "{role}"' for privileges, target in _GRANTS]
    # The hot statements' routines (cortex._db.routines), whichever are installed.
    return [*grants, _routines.grant_sql(role)]


# Roles that hold cortex's write grants on sessions, other than its owner:
# the application roles `cortex db grant` (or a DBA) set up.
_GRANTED_ROLES_SQL: Final = """
SELECT DISTINCT r.rolname
FROM pg_catalog.pg_class AS c
CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS acl
JOIN pg_catalog.pg_roles AS r ON r.oid = acl.grantee
WHERE c.oid = pg_catalog.to_regclass('sessions')
  AND acl.privilege_type = 'INSERT'
  AND acl.grantee <> c.relowner
ORDER BY r.rolname
"""


def application_roles(connection: Connection) -> list[str]:
    """The roles holding cortex's write grants on ``sessions``, other than its owner."""
    roles = connection.execute(sa.text(_GRANTED_ROLES_SQL)).scalars().all()
    return [role for role in roles if _ROLE.fullmatch(role)]


def install_routines(connection: Connection, script: ScriptDirectory) -> None:
    """After every migration run: this code's routines at the head, none below it.

    At the head, the hot statements become one-round-trip routines
    (cortex._db.routines), each granted to every application role. Below it
    (after a downgrade) this code's statements may not fit the schema, so
    every routine is dropped; stores then run each call in a transaction.
    On Citus each is distributed by its tenant argument, so a call runs on
    the worker holding the tenant's shards.
    """
    distributed = tables_distributed(connection)
    if distributed:
        # create_distributed_function needs one connection per node throughout.
        connection.execute(sa.text("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"))
    at = (
        connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
        if connection.execute(sa.text("SELECT to_regclass('alembic_version') IS NOT NULL")).scalar()
        else []
    )
    if list(at) != [script.get_current_head()]:
        connection.exec_driver_sql(_routines.drop_sql())
        return
    driver = connection.connection.driver_connection
    if not isinstance(driver, asyncpg.Connection):  # not cortex's engine: nothing to prepare on
        return
    created, dropped = await_only(
        _routines.install(driver, application_roles(connection), distributed=distributed)
    )
    if created or dropped:
        log.info("routines: %d created, %d dropped", created, dropped)


def regrant_sql(connection: Connection) -> list[str]:
    """The grants that give every existing application role what this schema needs now.

    Deploy pipelines roll back and forward: a downgrade drops objects (the
    search function, the operator tables) and the upgrade recreates them
    without the grants the application role held. The roles that still hold
    cortex's grants on ``sessions`` are taken to be application roles, and
    :func:`grant_sql` is applied to each again, after every upgrade run
    (``alembic/env.py``). Idempotent; nothing to do before ``sessions`` exists.
    """
    roles = application_roles(connection)
    if not roles:
        return []
    # After a downgrade some objects do not exist (yet): grant what is there.
    present = [
        (privileges, target)
        for privileges, target in _GRANTS
        if connection.execute(
            sa.text(_EXISTS[target.split()[0]]), {"name": target.split(maxsplit=1)[1]}
        ).scalar()
    ]
    return [
        f'GRANT {privileges} ON {target} TO "{role}"'
        for role in roles
        if _ROLE.fullmatch(role)
        for privileges, target in present
    ]


_EXISTS: Final = {
    "SCHEMA": "SELECT pg_catalog.to_regnamespace(:name) IS NOT NULL",
    "TABLE": "SELECT pg_catalog.to_regclass(:name) IS NOT NULL",
    "FUNCTION": "SELECT pg_catalog.to_regprocedure(:name) IS NOT NULL",
}


def oldest_compatible_code(script: ScriptDirectory, head: str, *, distributed: bool = False) -> str:
    """The oldest code revision every revision up to ``head`` serves.

    A revision's ``safe_with_code_from`` names the oldest code (its
    ``SCHEMA_REVISION``) that works on a database at that revision; without
    it, only code of the revision itself. ``distributed`` (Citus): a
    revision's ``safe_with_code_from_distributed`` instead, where it has one
    (a trigger that keeps older code's writes right on plain PostgreSQL
    cannot exist on a distributed table). Revision ids sort by time.
    """

    def serves_from(module: object, revision: str) -> str:
        plain: str = getattr(module, "safe_with_code_from", revision)
        return getattr(module, "safe_with_code_from_distributed", plain) if distributed else plain

    return max(
        serves_from(rev.module, rev.revision)
        for rev in script.iterate_revisions(head, "base")
        if rev is not None
    )


def record_compatibility(connection: Connection, script: ScriptDirectory) -> None:
    """Store :func:`oldest_compatible_code` of the database's revision (revision 20261201000010).

    Run after every online migration run; nothing to do before the table exists.

    Raises:
        SchemaMismatch: the table is not the one cortex made (another role
            made it, below revision 20261201000010): nothing is written to it.
    """
    if not connection.execute(
        sa.text("SELECT to_regclass('cortex_schema_compat') IS NOT NULL")
    ).scalar():
        return
    ddl_v1.check_on(
        connection,
        ddl_v1.relation_check(
            "cortex_schema_compat", columns=("singleton boolean", "oldest_code_revision text")
        ),
    )
    heads = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(heads) != 1:
        return
    connection.execute(
        sa.text(
            "INSERT INTO cortex_schema_compat (singleton, oldest_code_revision) VALUES (true, :code)"
            " ON CONFLICT (singleton) DO UPDATE SET oldest_code_revision = EXCLUDED.oldest_code_revision"
        ),
        {
            "code": oldest_compatible_code(
                script, heads[0], distributed=tables_distributed(connection)
            )
        },
    )
