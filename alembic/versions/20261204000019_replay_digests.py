"""A keyed call's state deltas are part of its key: a digest of them is stored with it.

Revision ID: 20261204000019
Revises: 20261203000018
Create Date: 2026-12-04

Why it exists: an append whose messages carry caller-chosen ids may be
retried after an ambiguous failure, and the retry returns the stored
messages without writing. The ids are the key of the whole call, state
deltas included, but only the messages were compared: a replay with other
``data`` or ``scope_data`` returned success and wrote nothing. A create
with a caller-chosen id compared its own state document, not its
``scope_data``, and merged that again on a replay. The deltas a call merged
cannot be read back from the state (later calls change it), so the call's
digest is stored with what it wrote:

- ``messages.deltas_digest`` (bytea): on the first message of a keyed
  append, the SHA-256 of its state deltas (none is a digest too); NULL on
  every other message, on appends without ids and on rows written before;
- ``sessions.scope_deltas_digest`` (bytea): on a session created with a
  caller-chosen id, the SHA-256 of its ``scope_data``; NULL otherwise.

A replay whose digest differs from the stored one is Conflict; a NULL
digest (a row an older release wrote) is compared as before.

Safe with: every release from 20261201000009 on (they never read the
columns and leave them NULL on what they write). Online: two nullable
columns without defaults, catalog changes, each under a short lock timeout
with retries; a run killed between them adds the other on the next run.

Downgrade drops both columns. Nothing a caller stored is lost: replays of
calls made before it are then compared as an older release compared them.
"""

import time
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from alembic import op
from cortex.errors import SchemaMismatch

revision: str = "20261204000019"
down_revision: str | Sequence[str] | None = "20261203000018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

# A DDL statement waiting for its table lock queues every later statement on
# the table behind it: wait briefly, step back, try again.
LOCK_TIMEOUT: Final = "200ms"
ATTEMPTS: Final = 50
_LOCK_NOT_AVAILABLE: Final = "55P03"

ADD: Final = (
    "ALTER TABLE messages ADD COLUMN IF NOT EXISTS deltas_digest bytea",
    "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS scope_deltas_digest bytea",
)
DROP: Final = (
    "ALTER TABLE messages DROP COLUMN IF EXISTS deltas_digest",
    "ALTER TABLE sessions DROP COLUMN IF EXISTS scope_deltas_digest",
)


def _sqlstate(exc: DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def _run(statement: str) -> None:
    """One catalog change under a short lock timeout, retried while the lock is busy."""
    if op.get_context().as_sql:
        op.execute(statement)
        return
    bind = op.get_bind()
    delay = 0.05
    for attempt in range(1, ATTEMPTS + 1):
        bind.execute(sa.text(f"SET lock_timeout = '{LOCK_TIMEOUT}'"))
        try:
            bind.execute(sa.text(statement))
        except DBAPIError as exc:
            if _sqlstate(exc) != _LOCK_NOT_AVAILABLE or attempt == ATTEMPTS:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        else:
            return
        finally:
            bind.execute(sa.text("RESET lock_timeout"))


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing a caller stored (two digests)."""
    return []


# Each column this revision adds, and its type: one of that name and another type is not cortex's.
COLUMNS: Final = (("messages", "deltas_digest"), ("sessions", "scope_deltas_digest"))


def _check_types() -> None:
    """Refuse a column of this revision's names whose type is not bytea (nothing is changed)."""
    if op.get_context().as_sql:
        return
    for table, column in COLUMNS:
        found = (
            op.get_bind()
            .execute(
                sa.text(
                    "SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute AS a"
                    " WHERE a.attrelid = pg_catalog.to_regclass(:t) AND a.attname = :c"
                    " AND NOT a.attisdropped"
                ),
                {"t": f"public.{table}", "c": column},
            )
            .scalar()
        )
        if found is not None and found != "bytea":
            raise SchemaMismatch(
                f"column {table}.{column} exists with type {found}, not bytea: cortex did not"
                " make it; drop or rename it, then run the migration again"
            )


def upgrade() -> None:
    _check_types()
    with op.get_context().autocommit_block():
        for statement in ADD:
            _run(statement)


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for statement in DROP:
            _run(statement)
