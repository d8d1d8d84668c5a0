"""A message may ask several questions and give several answers.

Revision ID: 20261201000013
Revises: 20261201000012
Create Date: 2026-12-01

Why it exists: an agent framework's turn may ask more than one question at
once. An ADK event with two parallel long-running function calls waits for
two answers, and cortex recorded one pending input per message (the primary
key of ``pending_inputs`` was the asking message's ``seq``): the second
question was never pending, and a session could show as idle while a call
still waited for a human. This revision adds:

- ``messages.more_requested_inputs`` and ``messages.more_function_responses``
  (jsonb, NULL unless a message asks or answers more than one): the inputs
  and responses after the first, which stay in ``requested_input`` and
  ``function_response`` where every release reads them;
- the primary key of ``pending_inputs`` becomes (tenant_id, session_id,
  raised_seq, interrupt_id): one row per question.

Safe with: every release from 20261201000009 on. Earlier code never writes
the new columns and reads only the first question and answer of a message,
as before; the wider key accepts every row it writes. Online: the columns
are catalog changes (nullable, no default) under a short lock timeout with
retries. The key is rebuilt in one statement under that timeout:
``pending_inputs`` holds only open questions, a few rows per paused session,
so its new index builds in milliseconds (measured in the migration tests).
On Citus the same statements are propagated to every shard. Safe to run
twice (each step checks the catalog).

Downgrade: questions after the first of a message stop being pending (their
rows go, the sessions' counts are recomputed), the columns are dropped, and
the key narrows again. ``data_loss`` counts the messages whose further
questions or answers that forgets.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000013"
down_revision: str | Sequence[str] | None = "20261201000012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

_KEY_COLUMNS = """
SELECT count(*) FROM pg_catalog.pg_index AS i
CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) AS k
WHERE i.indexrelid = pg_catalog.to_regclass('pk_pending_inputs')
"""


def _key_width() -> int:
    return int(op.get_bind().exec_driver_sql(_KEY_COLUMNS).scalar() or 0)


def upgrade() -> None:
    ddl.check(
        ddl.relation_check(
            "messages",
            having={"more_requested_inputs": "jsonb", "more_function_responses": "jsonb"},
        ),
        ddl.relation_check("pending_inputs"),
        ddl.relation_check("pk_pending_inputs", "index", on="pending_inputs"),
    )
    with op.get_context().autocommit_block():
        ddl.run("ALTER TABLE messages ADD COLUMN IF NOT EXISTS more_requested_inputs jsonb")
        ddl.run("ALTER TABLE messages ADD COLUMN IF NOT EXISTS more_function_responses jsonb")
        if op.get_context().as_sql or _key_width() != 4:
            ddl.run(
                "ALTER TABLE pending_inputs DROP CONSTRAINT pk_pending_inputs",
                "ALTER TABLE pending_inputs ADD CONSTRAINT pk_pending_inputs"
                " PRIMARY KEY (tenant_id, session_id, raised_seq, interrupt_id)",
            )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: the messages' further questions and answers."""
    n = ddl.count_rows(
        bind,
        "messages",
        "more_requested_inputs IS NOT NULL OR more_function_responses IS NOT NULL",
    )
    if n:
        return [f"the further questions or answers of {n} messages (messages.more_*)"]
    return []


def downgrade() -> None:
    # Questions after a message's first stop being pending (tenant by tenant:
    # co-located joins, which Citus runs on each shard).
    op.execute(
        """
        DELETE FROM pending_inputs AS p
        USING messages AS m
        WHERE m.tenant_id = p.tenant_id AND m.session_id = p.session_id
          AND m.seq = p.raised_seq
          AND p.interrupt_id IS DISTINCT FROM m.requested_input ->> 'interrupt_id'
        """
    )
    op.execute(
        """
        UPDATE sessions AS s SET pending_count = c.n
        FROM (
            SELECT s2.tenant_id, s2.id, count(p.raised_seq) AS n
            FROM sessions AS s2
            LEFT JOIN pending_inputs AS p
              ON p.tenant_id = s2.tenant_id AND p.session_id = s2.id
            WHERE s2.pending_count > 0
            GROUP BY s2.tenant_id, s2.id
        ) AS c
        WHERE s.tenant_id = c.tenant_id AND s.id = c.id AND s.pending_count <> c.n
        """
    )
    op.execute("ALTER TABLE pending_inputs DROP CONSTRAINT pk_pending_inputs")
    op.execute(
        "ALTER TABLE pending_inputs ADD CONSTRAINT pk_pending_inputs"
        " PRIMARY KEY (tenant_id, session_id, raised_seq)"
    )
    op.drop_column("messages", "more_function_responses")
    op.drop_column("messages", "more_requested_inputs")
