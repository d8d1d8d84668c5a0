"""A session's state document is measured where it is written, not on every update of its row.

Revision ID: 20261202000017
Revises: 20261201000016
Create Date: 2026-12-02

Why it exists: ``ck_sessions_data_size`` (revision 20261201000011) bounded
the state document with ``octet_length(data::text) <= 1048576``. PostgreSQL
evaluates every CHECK constraint of a row on every UPDATE of it, whichever
columns change, so each append (and each title change, each operator
update) fetched the session's whole document from TOAST and printed it as
text, only to find it unchanged. An append to a session holding a 564 KB
document took 1.98 ms against 0.36 ms without the constraint (pgbench, one
client, the append routine; docs/benchmarks.md): the cost of an append grew
with the session's state, which agent frameworks (ADK's session state) fill.

This revision moves the exact limit into the statements that write the
document: ``cortex_bounded_data(doc)`` returns ``doc``, or raises
check_violation naming ``ck_sessions_data_size`` (the error cortex has
always reported) when its text is longer than 1,048,576 bytes; cortex's
create and its delta-merging append call it. The table keeps a backstop for
writers that bypass cortex, ``ck_sessions_data_stored_size``:
``pg_column_size(data) <= 8388608``, which reads a TOAST pointer's size
without fetching the value. It never refuses a document cortex accepts:
jsonb's binary form of a document is at most about four times its text
(``[0, 1, 2, ...]``: 3 bytes of text, 12 stored per element).

Safe with: every cortex release from 20261201000009 on. An older release
merges deltas without the function, so its writes are held by the backstop
only (8 MiB stored, not 1 MiB of text) while it runs beside this schema.
Online: the function is created (no lock on any table); the backstop is
added ``NOT VALID`` and validated under a lock that lets reads and writes go
on, reading each row's stored size only; the old constraint is dropped under
a short lock timeout with retries. On Citus the function is created on
every node (``CREATE FUNCTION`` propagates) and is called on the shards.

Downgrade restores ``ck_sessions_data_size`` (``NOT VALID``, then validated:
it fails, and says which constraint, if a writer stored a larger document
meanwhile), then drops the backstop and the function. Nothing is lost.
"""

from collections.abc import Sequence
from typing import Final

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261202000017"
down_revision: str | Sequence[str] | None = "20261201000016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

FUNCTION: Final = "cortex_bounded_data"
# cortex.models.MAX_DATA_BYTES, as stored (jsonb's text form).
LIMIT: Final = 1048576
CHECKED: Final = "ck_sessions_data_size"
BACKSTOP: Final = "ck_sessions_data_stored_size"
BACKSTOP_CONDITION: Final = f"pg_column_size(data) <= {8 * LIMIT}"
CREATE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(doc jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF octet_length(doc::text) > {LIMIT} THEN
        RAISE EXCEPTION 'new row for relation "sessions" violates check constraint "{CHECKED}"'
            USING ERRCODE = 'check_violation', CONSTRAINT = '{CHECKED}', TABLE = 'sessions';
    END IF;
    RETURN doc;
END
$fn$
"""


def upgrade() -> None:
    ddl.check(ddl.function_check(FUNCTION, "jsonb"), ddl.relation_check("sessions"))
    with op.get_context().autocommit_block():
        ddl.run(CREATE_FUNCTION)
        ddl.add_check("sessions", BACKSTOP, BACKSTOP_CONDITION)
        ddl.run(f"ALTER TABLE sessions DROP CONSTRAINT IF EXISTS {CHECKED}")


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (a function and a constraint)."""
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        ddl.add_check("sessions", CHECKED, f"octet_length(data::text) <= {LIMIT}")
        ddl.run(f"ALTER TABLE sessions DROP CONSTRAINT IF EXISTS {BACKSTOP}")
        ddl.run(f"DROP FUNCTION IF EXISTS {FUNCTION}(jsonb)")
