"""Questions and answers kept verbatim: a ``json`` twin beside each of their jsonb columns.

Revision ID: 20261205000020
Revises: 20261204000019
Create Date: 2026-12-05

Why it exists: a requested input (its response schema and payload) and a
function response were stored in jsonb only, and jsonb reorders an object's
keys (shorter first, then bytewise) and respells numbers (``1e16`` comes
back as an int). ``cortex sessions show`` printed a schema written as
``{"type", "properties", "required"}`` as ``{"type", "required",
"properties"}``, and every read returned the questions and answers so
reordered. As revision 20261201000009 did for metadata, cortex now also
writes the JSON text it serialised into ``json`` columns, which keep their
input text exactly, and reads them where they are set:

- ``messages.requested_input_json``, ``function_response_json``,
  ``more_requested_inputs_json`` and ``more_function_responses_json``: the
  text of the jsonb column of the same name;
- ``pending_inputs.response_schema_json`` and ``payload_json``: likewise.

The jsonb columns are still written: the statements that find a question by
its id (an answer resolving it, a replayed append compared with what it
stored) read them, and so does every earlier release.

Safe with: every release from 20261201000009 on (Citus: from 20261201000016
on, as before). They never read the new columns and leave them NULL on what
they write, and this release reads a row's jsonb column when its twin is
NULL. No row of either table is updated in place (a message is written
once; a pending input is inserted, then deleted), so a twin is never stale.
Online: six nullable columns without defaults, catalog changes, each under
a short lock timeout with retries (ddl_v1); a run killed half way adds the
rest on the next run. Rows written before keep their jsonb only: no
backfill, jsonb already lost the order they were written in.

Downgrade drops the six columns. Nothing a caller stored is lost but its
spelling: the jsonb columns hold every value, in jsonb's order.
"""

from collections.abc import Sequence
from typing import Final

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261205000020"
down_revision: str | Sequence[str] | None = "20261204000019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

# Each table's new columns, all of type json.
COLUMNS: Final = {
    "messages": (
        "requested_input_json",
        "function_response_json",
        "more_requested_inputs_json",
        "more_function_responses_json",
    ),
    "pending_inputs": ("response_schema_json", "payload_json"),
}


def upgrade() -> None:
    # A column of these names and another type is not cortex's: refused, nothing changed.
    ddl.check(
        *(
            ddl.relation_check(table, having=dict.fromkeys(columns, "json"))
            for table, columns in COLUMNS.items()
        )
    )
    with op.get_context().autocommit_block():
        for table, columns in COLUMNS.items():
            for column in columns:
                ddl.run(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} json")


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing; jsonb holds every value.

    Only the order of their keys and the spelling of their numbers (as before this revision).
    """
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for table, columns in COLUMNS.items():
            for column in columns:
                ddl.run(f"ALTER TABLE {table} DROP COLUMN IF EXISTS {column}")
