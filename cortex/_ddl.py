"""Online schema changes for the migrations: short locks, retries, resumable steps.

Every revision runs while the previous release keeps serving. The rules this
module carries out, so no revision has to remember them:

- every statement that needs a table lock waits at most :data:`LOCK_TIMEOUT`
  for it, then gives up and retries after a backoff. A DDL statement waiting
  for its lock queues every later reader and writer of the table behind it,
  so a long wait would be an outage even if the change itself is instant;
- indexes are built ``CONCURRENTLY`` (an invalid index left by a killed build
  is dropped and built again); constraints are added ``NOT VALID`` and then
  validated, which only takes a lock that lets reads and writes go on;
- each step checks the catalog first, so a revision killed half way (it runs
  in autocommit, step by step) simply runs again from the top.

In offline mode (``cortex db sql``) each step prints its plain SQL.

It must not hold a transaction open across steps: callers run inside
Alembic's ``autocommit_block``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from alembic import context, op
from cortex._engine import DISTRIBUTED_SQL
from cortex.errors import SchemaMismatch, sqlstate_of

__all__ = [
    "LOCK_TIMEOUT",
    "add_check",
    "add_foreign_key",
    "bypasses_rls",
    "constraint_exists",
    "count_rows",
    "create_index",
    "drop_index",
    "drop_trigger_sql",
    "is_partial",
    "key_columns",
    "rebuild_index",
    "replace_index",
    "run",
    "run_weak",
    "sessions_distributed",
    "unless_distributed_sql",
]

log = logging.getLogger("cortex")

# How long one DDL statement may wait for its table lock before it steps back.
# A probe of the running application (lock_timeout = 1s) queued behind it waits
# this long at most, plus the few milliseconds the change itself takes.
LOCK_TIMEOUT: Final = "200ms"
# Attempts before giving up; backoff doubles from 50 ms up to 2 s (about 90 s in all).
ATTEMPTS: Final = 60
_LOCK_NOT_AVAILABLE: Final = "55P03"
# Tables a where clause of count_rows may read.
_RLS_TABLES: Final = ("sessions", "messages", "pending_inputs", "session_markers", "scope_data")


def _offline() -> bool:
    return context.is_offline_mode()


def _bind() -> Connection:
    return op.get_bind()


def run(*statements: str) -> None:
    """Run ``statements`` atomically with a short lock timeout, retrying on lock timeouts.

    Several statements go in one ``DO`` block: a single statement, so they
    take effect together (the connection is in autocommit mode).

    Raises:
        sqlalchemy.exc.DBAPIError: any other database error, or the lock still
            unavailable after :data:`ATTEMPTS` tries.
    """
    if _offline():
        for statement in statements:
            op.execute(statement)
        return
    if len(statements) == 1:
        sql = statements[0]
    else:
        body = "".join(f"{statement};\n" for statement in statements)
        sql = f"DO $ddl$ BEGIN\n{body}END $ddl$"
    bind = _bind()
    delay = 0.05
    for attempt in range(1, ATTEMPTS + 1):
        bind.execute(sa.text(f"SET lock_timeout = '{LOCK_TIMEOUT}'"))
        try:
            bind.execute(sa.text(sql))
        except DBAPIError as exc:
            if sqlstate_of(exc) != _LOCK_NOT_AVAILABLE or attempt == ATTEMPTS:
                raise
            # Another transaction holds the table: step back so the application's
            # statements queued behind ours run, then try again.
            log.info("lock busy (attempt %d): retrying in %.2fs", attempt, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        else:
            return
        finally:
            bind.execute(sa.text("RESET lock_timeout"))


def run_weak(statement: str) -> None:
    """Run a statement whose lock never blocks reads or writes, outside a transaction.

    For ``CREATE/DROP INDEX CONCURRENTLY`` and ``VALIDATE CONSTRAINT``: they
    take SHARE UPDATE EXCLUSIVE, which conflicts with no DML, so a wait for it
    queues no application statement and needs no short timeout (a timeout
    would only leave an invalid index behind).
    """
    if _offline():
        op.execute(statement)
    else:
        _bind().execute(sa.text(statement))


def _scalar(sql: str, **params: object) -> object:
    return _bind().execute(sa.text(sql), params).scalar()


def constraint_exists(name: str) -> bool:
    """Whether a constraint of this name exists (offline: assume not)."""
    if _offline():
        return False
    return bool(_scalar("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = :n)", n=name))


def _index_state(name: str, table: str) -> bool | None:
    """True: a valid index of ``table``; False: an invalid one (a killed CONCURRENTLY build); None: none.

    Raises:
        SchemaMismatch: an index of that name is on another table. Only
            ``table``'s owner can index it, but any role that may create in
            the schema can take a free name: cortex neither keeps nor drops
            what it did not build.
    """
    row = (
        _bind()
        .execute(
            sa.text(
                "SELECT i.indisvalid AS valid, i.indrelid = pg_catalog.to_regclass(:t) AS ours"
                " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
                " WHERE c.relname = :n AND c.relnamespace = 'public'::regnamespace"
            ),
            {"n": name, "t": table},
        )
        .first()
    )
    if row is None:
        return None
    if not row.ours:
        raise SchemaMismatch(
            f"an index named {name} exists on another table than {table}: cortex did not"
            " build it; drop or rename it, then run the migration again"
        )
    return bool(row.valid)


def create_index(name: str, definition: str, *, unique: bool = False) -> None:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY name ON definition``, rebuilt if left invalid.

    ``definition`` starts with the table's name (``sessions (tenant_id, …)``).
    """
    sql = f"CREATE {'UNIQUE ' if unique else ''}INDEX CONCURRENTLY {name} ON {definition}"
    if _offline():
        op.execute(sql)
        return
    state = _index_state(name, definition.split(maxsplit=1)[0])
    if state is True:
        return
    if state is False:
        run_weak(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    run_weak(sql)


def drop_index(name: str) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS name``."""
    run_weak(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _index_fact(name: str, expression: str) -> object:
    """``expression`` over index ``name``'s ``pg_index`` row (``i``); None: no such index, or offline."""
    if _offline():
        return None
    return _scalar(
        f"SELECT {expression} FROM pg_catalog.pg_index AS i"
        " WHERE i.indexrelid = pg_catalog.to_regclass(:n)",
        n=name,
    )


def key_columns(name: str) -> int | None:
    """How many key columns index ``name`` has (None: no such index; offline: unknown)."""
    found = _index_fact(name, "i.indnkeyatts")
    return None if found is None else int(str(found))


def is_partial(name: str) -> bool | None:
    """Whether index ``name`` has a predicate (None: no such index; offline: unknown)."""
    found = _index_fact(name, "i.indpred IS NOT NULL")
    return None if found is None else bool(found)


def rebuild_index(name: str, definition: str, keys: int) -> None:
    """Make ``name`` the index ``definition`` (``keys`` key columns), online.

    An index that already has ``keys`` key columns is left alone, so a run
    killed at any step runs again from the top (the key count tells the two
    forms apart). See :func:`replace_index`.
    """
    if key_columns(name) == keys:
        return
    replace_index(name, definition)


def replace_index(name: str, definition: str) -> None:
    """Make ``name`` the index ``definition``, online; the caller tells when it is done already.

    The new form is built ``CONCURRENTLY`` beside the old one as
    ``<name>_next``, the old one dropped ``CONCURRENTLY``, and the new one
    renamed under a short lock timeout with retries. Killed at any step, it
    runs again from the top: a valid ``<name>_next`` is kept, an invalid one
    rebuilt.
    """
    building = f"{name}_next"
    create_index(building, definition)
    drop_index(name)
    run(f"ALTER INDEX IF EXISTS {building} RENAME TO {name}")


def add_check(table: str, name: str, condition: str) -> None:
    """Add a CHECK constraint without a long lock: ``NOT VALID``, then ``VALIDATE``."""
    if not constraint_exists(name):
        run(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    run_weak(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def add_foreign_key(
    table: str, name: str, columns: Sequence[str], target: str, *, on_delete: str
) -> None:
    """Add a foreign key without a long lock: ``NOT VALID``, then ``VALIDATE``."""
    if not constraint_exists(name):
        run(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({', '.join(columns)}) "
            f"REFERENCES {target} ON DELETE {on_delete} NOT VALID"
        )
    run_weak(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def bypasses_rls(bind: Connection | None = None) -> bool:
    """Whether the role running the migrations (or on ``bind``) is exempt from row-level security."""
    if bind is None and _offline():
        return True
    conn = bind if bind is not None else _bind()
    return bool(
        conn.execute(
            sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        ).scalar()
    )


def count_rows(bind: Connection, table: str, where: str = "true") -> int:
    """Exact rows of ``table`` matching ``where``, whatever row-level security says.

    For a role held to FORCE ROW LEVEL SECURITY it lifts FORCE first: the
    caller must be inside a transaction it rolls back (as the downgrade check
    is), so the change never commits.
    """
    if bind.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
        return 0
    if not bypasses_rls(bind):
        for name in _RLS_TABLES:
            if bind.execute(sa.text("SELECT to_regclass(:t)"), {"t": name}).scalar() is not None:
                bind.execute(sa.text(f"ALTER TABLE {name} NO FORCE ROW LEVEL SECURITY"))
    return int(bind.execute(sa.text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one())


def unless_distributed_sql(table: str, body: str) -> str:
    """A ``DO`` block that runs ``body`` (PL/pgSQL statements) unless Citus distributes ``table``.

    For triggers: Citus refuses them on distributed tables, and a Citus
    database serves only the current release, which needs none.
    ``pg_dist_partition`` is asked only where the extension created it.
    """
    return f"""
DO $ddl$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition
            WHERE logicalrelid = pg_catalog.to_regclass('{table}')
        ) THEN
            RETURN;
        END IF;
    END IF;
{body}
END
$ddl$
"""


def drop_trigger_sql(name: str, table: str) -> str:
    """Drop trigger ``name`` only where it exists.

    Citus refuses even ``DROP TRIGGER IF EXISTS`` on a distributed table,
    which never had it (:func:`unless_distributed_sql`).
    """
    return f"""
DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = '{name}' AND tgrelid = pg_catalog.to_regclass('{table}')
    ) THEN
        DROP TRIGGER {name} ON {table};
    END IF;
END
$ddl$
"""


def sessions_distributed(bind: Connection) -> bool:
    """Whether Citus distributes ``sessions`` (its catalog is asked only where the extension is)."""
    citus = bind.execute(
        sa.text("SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
    ).scalar()
    return bool(citus) and bool(bind.execute(sa.text(DISTRIBUTED_SQL)).scalar())
