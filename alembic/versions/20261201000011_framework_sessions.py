"""What agent frameworks need of a session store: keys, payloads, state documents.

Revision ID: 20261201000011
Revises: 20261201000010
Create Date: 2026-12-01

Why it exists: Google ADK and the OpenAI Agents SDK name a session with any
string the host picks, store structured events or items rather than text,
and keep state (per session, per app, per user) that changes atomically with
the events that carry it. This revision adds:

- ``sessions.session_key``: the host-chosen key, unique per tenant, agent and
  exact scope by the partial unique index ``uq_sessions_key``;
- ``sessions.data``: the session's state document (a jsonb object whose
  values are each the JSON text of the host's value, so a value comes back
  exactly as it was sent and a delta merges key by key with ``||``), size
  bounded by ``ck_sessions_data_size``;
- ``messages.payload_json``: a message's structured payload, the JSON text
  verbatim (``json`` keeps its input text);
- ``scope_data``: one state document per scope, shared by every session
  beneath it; tenant first in its key, row-level security (ENABLE + FORCE)
  with the tenant policy like every table, in the application grants.

Safe with: the previous release (it never reads or writes the new columns
or table). Expand only, and online (ddl_v1): nullable columns without
defaults are catalog changes taken under a short lock timeout with retries;
the size check is added ``NOT VALID`` and then validated under a lock that
lets reads and writes go on; the unique index is built ``CONCURRENTLY``.
Each step checks the catalog first, so a run killed half way runs again
from the top.

Downgrade drops what upgrade added; ``data_loss`` says how many keys, state
documents and payloads that destroys.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.citus_v1 import distribute

revision: str = "20261201000011"
down_revision: str | Sequence[str] | None = "20261201000010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

_MATCH = "tenant_id = current_setting('cortex.tenant', true)"
# cortex.models.MAX_DATA_BYTES, as stored (jsonb's text form).
_DATA_LIMIT = "octet_length(data::text) <= 1048576"


_SCOPE_DATA_COLUMNS = (
    "tenant_id text",
    "scope text",
    "data jsonb",
    "updated_at timestamp with time zone",
)


def _check() -> None:
    """Refuse what another role made under this revision's names (ddl_v1)."""
    ddl.check(
        ddl.relation_check("sessions", having={"session_key": "text", "data": "jsonb"}),
        ddl.relation_check("messages", having={"payload_json": "json"}),
        ddl.relation_check("scope_data", columns=_SCOPE_DATA_COLUMNS),
        ddl.relation_check("pk_scope_data", "index", on="scope_data"),
        ddl.policies_check("scope_data", {"tenant_isolation": ddl.TENANT_ISOLATION}),
        ddl.relation_check("uq_sessions_key", "index", on="sessions"),
    )


def upgrade() -> None:
    _check()
    with op.get_context().autocommit_block():
        ddl.run('ALTER TABLE sessions ADD COLUMN IF NOT EXISTS session_key text COLLATE "C"')
        ddl.run("ALTER TABLE sessions ADD COLUMN IF NOT EXISTS data jsonb")
        ddl.run("ALTER TABLE messages ADD COLUMN IF NOT EXISTS payload_json json")
        ddl.add_check("sessions", "ck_sessions_data_size", _DATA_LIMIT)
        # A new table: its creation locks nothing the running release uses.
        ddl.run(
            "CREATE TABLE IF NOT EXISTS scope_data ("
            ' tenant_id text COLLATE "C" NOT NULL,'
            ' scope text COLLATE "C" NOT NULL,'
            " data jsonb NOT NULL DEFAULT '{}'::jsonb,"
            " updated_at timestamptz NOT NULL DEFAULT now(),"
            " CONSTRAINT pk_scope_data PRIMARY KEY (tenant_id, scope),"
            " CONSTRAINT ck_scope_data_scope_tenant CHECK (tenant_id = split_part(scope, '/', 1)),"
            f" CONSTRAINT ck_scope_data_data_size CHECK ({_DATA_LIMIT}))",
            "ALTER TABLE scope_data ENABLE ROW LEVEL SECURITY",
            "ALTER TABLE scope_data FORCE ROW LEVEL SECURITY",
        )
        distribute("scope_data")  # on Citus only (citus_v1)
        if not _policy_exists():
            ddl.run(
                f"CREATE POLICY tenant_isolation ON scope_data USING ({_MATCH})"
                f" WITH CHECK ({_MATCH})"
            )
        ddl.create_index(
            "uq_sessions_key",
            "sessions (tenant_id, agent_id, scope, session_key) WHERE session_key IS NOT NULL",
            unique=True,
        )


def _policy_exists() -> bool:
    if op.get_context().as_sql:
        return False
    found = op.get_bind().exec_driver_sql(
        "SELECT 1 FROM pg_policies WHERE schemaname = current_schema()"
        " AND tablename = 'scope_data' AND policyname = 'tenant_isolation'"
    )
    return found.first() is not None


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: keys, state documents and payloads."""
    lost = []
    for table, where, what in (
        ("sessions", "session_key IS NOT NULL", "session keys (sessions.session_key)"),
        ("sessions", "data IS NOT NULL", "session state documents (sessions.data)"),
        ("messages", "payload_json IS NOT NULL", "message payloads (messages.payload_json)"),
        ("scope_data", "true", "scope state documents (scope_data)"),
    ):
        n = ddl.count_rows(bind, table, where)
        if n:
            lost.append(f"{n} {what}")
    return lost


def downgrade() -> None:
    op.drop_index("uq_sessions_key", table_name="sessions")
    op.drop_table("scope_data")
    op.execute("ALTER TABLE sessions DROP CONSTRAINT ck_sessions_data_size")
    op.drop_column("messages", "payload_json")
    op.drop_column("sessions", "data")
    op.drop_column("sessions", "session_key")
