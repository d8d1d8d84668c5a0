"""Alembic environment for cortex: async engine, advisory lock, one transaction per migration.

The URL comes from ``-x url=...``, the ``sqlalchemy.url`` option (set by
``cortex db``), or ``CORTEX_DATABASE_URL``, in that order.

Two deploy jobs upgrading at once are serialised by a session-level advisory
lock taken before Alembic reads the current revision: the second waits, then
finds nothing to do. A downgrade started by :func:`cortex.migrate.downgrade`
first asks each revision it would undo what that would destroy, under the
same lock, and refuses unless data loss is allowed.

Revisions that change tables the running release uses do their work inside
``autocommit_block()`` (see ``cortex._revision_helpers.ddl_v1``); the rest get
one transaction each.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Collection, Mapping
from logging.config import fileConfig
from typing import Any

import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext, MigrationInfo
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from alembic import context
from cortex._db.engine import normalise_url, one_off_engine
from cortex._revision_helpers import ddl_v1
from cortex._sql.tables import metadata
from cortex.migrate import (
    CITUS_FLOOR,
    MIGRATION_LOCK_KEY,
    check_distributed_downgrade,
    check_downgrade,
    console_policy_for_citus_sql,
    distribute_all_sql,
    install_routines,
    record_compatibility,
    regrant_sql,
)

config = context.config
# Seconds between two tries for the migration lock while another job holds it.
LOCK_POLL = 0.5
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("CORTEX_DATABASE_URL")
    )
    if not url:
        raise SystemExit("no database URL: pass -x url=..., or set CORTEX_DATABASE_URL")
    return url


def _after_step(
    ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]
) -> None:
    # On Citus the tables the revisions below CITUS_FLOOR left local are
    # distributed in its step, before a later revision co-locates with them.
    if step.is_upgrade and step.up_revision_id == CITUS_FLOOR:
        ctx.execute(distribute_all_sql())
    # What the run did, for `cortex db upgrade` and `downgrade` to report.
    now = time.monotonic()
    applied = config.attributes.setdefault("applied", [])
    applied.append(
        {
            "revision": ",".join(step.destination_revision_ids) or "base",
            "from": ",".join(step.source_revision_ids) or "base",
            "seconds": round(now - config.attributes.get("step_started", now), 3),
        }
    )
    config.attributes["step_started"] = now


def run_migrations_offline() -> None:
    """Emit SQL for review instead of running it (``cortex db sql``)."""
    context.configure(
        url=normalise_url(_url()).render_as_string(hide_password=False),
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        transaction_per_migration=True,
        on_version_apply=_after_step,
    )
    with context.begin_transaction():
        # The script refuses, as an online run does, another role's objects in cortex's way.
        context.execute(ddl_v1.preflight_check())
        # A database migrated before the extension was added (cortex.migrate).
        context.execute(console_policy_for_citus_sql())
        context.execute(distribute_all_sql())
        context.run_migrations()


def _lock(connection: Connection) -> None:
    # Poll rather than wait in pg_advisory_lock: a statement waiting on the lock
    # holds a snapshot, and the holder's CREATE INDEX CONCURRENTLY waits for
    # every older snapshot to end: the two would deadlock.
    while True:
        got = connection.execute(
            sa.select(sa.func.pg_try_advisory_lock(MIGRATION_LOCK_KEY))
        ).scalar()
        connection.commit()
        if got:
            return
        time.sleep(LOCK_POLL)


def _do_run_migrations(connection: Connection) -> None:
    _lock(connection)
    try:
        # Before Alembic reads (or creates) alembic_version: nothing planted by another role.
        try:
            ddl_v1.check_on(connection, ddl_v1.preflight_check())
        finally:
            connection.rollback()
        going_to = config.attributes.get("downgrade_to")
        if going_to is not None:
            # Under the lock, before any step runs: a Citus database has a floor.
            try:
                check_distributed_downgrade(
                    connection, ScriptDirectory.from_config(config), going_to
                )
            finally:
                connection.rollback()
        target = config.attributes.get("guard_downgrade_to")
        if target is not None:
            # Under the lock, before any step runs: what would the steps down destroy?
            try:
                check_downgrade(connection, ScriptDirectory.from_config(config), target)
            finally:
                connection.rollback()
        context.configure(
            connection=connection,
            target_metadata=metadata,
            # Each revision commits on its own, so the batched backfill can
            # commit its batches and a failure keeps the revisions before it.
            transaction_per_migration=True,
            compare_type=True,
            on_version_apply=_after_step,
        )
        if going_to is None:
            # On Citus, a database migrated before the extension was added:
            # distributed before a revision co-locates a new table with its
            # tables (cortex.migrate), and again after the run.
            connection.exec_driver_sql(console_policy_for_citus_sql())
            connection.exec_driver_sql(distribute_all_sql())
            connection.commit()
        config.attributes["step_started"] = time.monotonic()
        with context.begin_transaction():
            context.run_migrations()
        connection.exec_driver_sql(distribute_all_sql())
        # Objects a run (re)created carry no grants yet: give every
        # application role what it held before (cortex.migrate.regrant_sql).
        for statement in regrant_sql(connection):
            connection.execute(sa.text(statement))
        # The hot statements as one-round-trip routines, or none below the head,
        # in a transaction of their own (Citus distributes each function over
        # one connection per node, which an earlier parallel DDL would forbid).
        connection.commit()
        install_routines(connection, ScriptDirectory.from_config(config))
        # Which code this schema serves now (revision 20261201000010).
        record_compatibility(connection, ScriptDirectory.from_config(config))
        connection.commit()
    finally:
        if connection.in_transaction():
            connection.rollback()
        connection.execute(sa.select(sa.func.pg_advisory_unlock(MIGRATION_LOCK_KEY)))
        connection.commit()


async def run_migrations_online() -> None:
    """Run the migrations on an async engine (asyncpg)."""
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _do_run_migrations(connectable)
        return
    # Database errors stay SQLAlchemy's here: cortex.cli translates them for its commands.
    async with one_off_engine(_url()) as engine, engine.connect() as connection:
        await connection.run_sync(_do_run_migrations)


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
