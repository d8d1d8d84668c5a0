"""A session trimmed by retention keeps its positions: ``sessions.trimmed_count``.

Revision ID: 20261205000023
Revises: 20261205000022
Create Date: 2026-12-05

Why it exists: ``Store.apply_retention`` removes a session's oldest messages
(``keep_last_messages``) and must leave the kept ones where they were, so
that a client's cursor (a ``seq``) still names the same message. Until now
a session's messages ran from ``seq`` 1 to ``message_count`` and an append
numbered its rows from ``message_count``. This revision adds:

- ``sessions.trimmed_count`` (integer, NOT NULL, default 0): how many of the
  session's oldest messages retention removed. The kept messages run from
  ``trimmed_count + 1`` to ``trimmed_count + message_count`` without a gap,
  ``message_count`` counts them, and an append numbers its rows after
  ``trimmed_count + message_count``. Checked ``>= 0``
  (``ck_sessions_trimmed_count``).

Safe with: every release from 20261201000009 on, for as long as no session
is trimmed (they never read the column, and leave it 0 on what they write).
A release before this one numbers an append from ``message_count``: on a
trimmed session its append is refused by ``uq_messages_session_seq`` and its
pop finds no message to remove (nothing is overwritten), so retention runs
only once every process serves this release (docs/guides/scope-lifecycle.md).

Online: a column with a constant default is a catalog change, under a short
lock timeout with retries; the check is added ``NOT VALID``, then validated
(a lock that lets reads and writes go on). On Citus both propagate to every
shard.

Downgrade: the messages (and pending inputs) of trimmed sessions are
renumbered to start at ``seq`` 1 again, as the older code needs, then the
column goes. ``data_loss`` counts those sessions: a cursor a client holds on
one of them names another message afterwards.
"""

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex.errors import SchemaMismatch

revision: str = "20261205000023"
down_revision: str | Sequence[str] | None = "20261205000022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

ADD: Final = (
    "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS trimmed_count integer NOT NULL DEFAULT 0"
)
CHECK: Final = "ck_sessions_trimmed_count"
DROP: Final = "ALTER TABLE sessions DROP COLUMN IF EXISTS trimmed_count"

_TRIMMED: Final = (
    "FROM sessions AS s WHERE s.tenant_id = {t}.tenant_id AND s.id = {t}.session_id"
    " AND s.trimmed_count > 0"
)
# Through negative values first: a unique key shifted in place would meet itself.
RENUMBER: Final = (
    f"UPDATE messages AS m SET seq = -m.seq {_TRIMMED.format(t='m')}",
    f"UPDATE messages AS m SET seq = -m.seq - s.trimmed_count {_TRIMMED.format(t='m')}",
    f"UPDATE pending_inputs AS p SET raised_seq = -p.raised_seq {_TRIMMED.format(t='p')}",
    "UPDATE pending_inputs AS p SET raised_seq = -p.raised_seq - s.trimmed_count"
    f" {_TRIMMED.format(t='p')}",
)


def _check_type() -> None:
    """Refuse a column of this name and another type (nothing is changed)."""
    if op.get_context().as_sql:
        return
    found = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)"
                " FROM pg_catalog.pg_attribute AS a"
                " WHERE a.attrelid = pg_catalog.to_regclass('public.sessions')"
                " AND a.attname = 'trimmed_count' AND NOT a.attisdropped"
            )
        )
        .scalar()
    )
    if found is not None and found != "integer":
        raise SchemaMismatch(
            f"column sessions.trimmed_count exists with type {found}, not integer: cortex did"
            " not make it; drop or rename it, then run the migration again"
        )


def upgrade() -> None:
    _check_type()
    with op.get_context().autocommit_block():
        ddl.run(ADD)
        ddl.add_check("sessions", CHECK, "trimmed_count >= 0")


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would change: the positions of trimmed sessions' messages."""
    n = ddl.count_rows(bind, "sessions", "trimmed_count > 0")
    if not n:
        return []
    return [
        f"{n} sessions trimmed by retention (sessions.trimmed_count): their messages are"
        " renumbered from seq 1"
    ]


def downgrade() -> None:
    with op.get_context().autocommit_block():
        if ddl.bypasses_rls():
            ddl.run(*RENUMBER)
        else:
            # Lift FORCE for this step only, in one transaction, so a plain
            # owner sees every tenant; the same transaction restores it.
            tables = ("sessions", "messages", "pending_inputs")
            ddl.run(
                *(f"ALTER TABLE {t} NO FORCE ROW LEVEL SECURITY" for t in tables),
                *RENUMBER,
                *(f"ALTER TABLE {t} FORCE ROW LEVEL SECURITY" for t in tables),
            )
        ddl.run(DROP)
