"""Erasure receipts and retention policies: two tenant tables, ``erasures`` and ``retention_policies``.

Revision ID: 20261205000022
Revises: 20261205000021
Create Date: 2026-12-05

Why it exists: ``Store.erase_scope`` removes everything at and beneath a
scope in many short transactions, and the tenant must be able to show
afterwards that it did (when, which scope, how much; never what). A receipt
is written when an erasure begins and updated by every batch, so an erasure
cut short is found ``running`` and finished by the next call. Retention
rules (how long an idle session is kept, how many messages a session keeps)
are per scope and need a home of their own. This revision adds:

- ``erasures``: one row per erasure: ``id``, ``scope`` (the path, as
  ``sessions.scope`` holds it), ``state`` (``running`` | ``done``), ``at``
  (when it began; what was written before it is gone once it is done),
  ``finished_at``, and the counts of sessions, messages, pending inputs,
  markers and scope documents removed. At most one running erasure per
  scope (``uq_erasures_running``); ``ix_erasures_scope`` lists a subtree's;
- ``retention_policies``: one row per scope: ``delete_idle_after``
  (interval, NULL: never), ``keep_last_messages`` (NULL: all),
  ``include_paused``, ``created_at``, ``updated_at``.

Each is keyed by ``tenant_id`` first (the scope's first segment, checked),
has row-level security (ENABLE + FORCE, the tenant policy every table has),
is distributed by tenant and co-located with ``sessions`` on Citus, and is
in the application grants (``cortex db grant``: receipts are read, written
and updated, never deleted, by the application).

Safe with: every release from 20261201000009 on (they never read the new
tables). Online: two new tables in this revision's transaction; nothing
the running release uses is locked. Another role's table, index, type or
policy of these names is refused before anything is created (ddl_v1).

Downgrade drops both tables; ``data_loss`` counts the receipts and the
policies that destroys.
"""

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.citus_v1 import distribute

revision: str = "20261205000022"
down_revision: str | Sequence[str] | None = "20261205000021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

_MATCH: Final = "tenant_id = current_setting('cortex.tenant', true)"

ERASURES: Final = (
    "CREATE TABLE erasures ("
    ' tenant_id text COLLATE "C" NOT NULL,'
    " id uuid NOT NULL,"
    ' scope text COLLATE "C" NOT NULL,'
    " state text NOT NULL DEFAULT 'running',"
    " at timestamptz NOT NULL DEFAULT now(),"
    " finished_at timestamptz,"
    " sessions bigint NOT NULL DEFAULT 0,"
    " messages bigint NOT NULL DEFAULT 0,"
    " pending_inputs bigint NOT NULL DEFAULT 0,"
    " markers bigint NOT NULL DEFAULT 0,"
    " scope_documents bigint NOT NULL DEFAULT 0,"
    " CONSTRAINT pk_erasures PRIMARY KEY (tenant_id, id),"
    " CONSTRAINT ck_erasures_scope_tenant CHECK (tenant_id = split_part(scope, '/', 1)),"
    " CONSTRAINT ck_erasures_state CHECK (state IN ('running', 'done')),"
    " CONSTRAINT ck_erasures_finished CHECK ((state = 'done') = (finished_at IS NOT NULL)),"
    " CONSTRAINT ck_erasures_counts CHECK (sessions >= 0 AND messages >= 0"
    " AND pending_inputs >= 0 AND markers >= 0 AND scope_documents >= 0))"
)
RETENTION_POLICIES: Final = (
    "CREATE TABLE retention_policies ("
    ' tenant_id text COLLATE "C" NOT NULL,'
    ' scope text COLLATE "C" NOT NULL,'
    " delete_idle_after interval,"
    " keep_last_messages integer,"
    " include_paused boolean NOT NULL DEFAULT false,"
    " created_at timestamptz NOT NULL DEFAULT now(),"
    " updated_at timestamptz NOT NULL DEFAULT now(),"
    " CONSTRAINT pk_retention_policies PRIMARY KEY (tenant_id, scope),"
    " CONSTRAINT ck_retention_policies_scope_tenant"
    " CHECK (tenant_id = split_part(scope, '/', 1)),"
    " CONSTRAINT ck_retention_policies_delete_idle_after"
    " CHECK (delete_idle_after > interval '0'),"
    " CONSTRAINT ck_retention_policies_keep_last_messages CHECK (keep_last_messages >= 0))"
)
# Each table's statements after CREATE TABLE, its distribution and RLS.
INDEXES: Final = {
    "erasures": (
        "CREATE UNIQUE INDEX uq_erasures_running ON erasures (tenant_id, scope)"
        " WHERE state = 'running'",
        "CREATE INDEX ix_erasures_scope ON erasures (tenant_id, scope, at)",
    ),
    "retention_policies": (),
}
TABLES: Final = {"erasures": ERASURES, "retention_policies": RETENTION_POLICIES}

# What upgrade finds in its way on a rerun (ddl_v1): exactly these columns.
_COLUMNS: Final = {
    "erasures": (
        "tenant_id text",
        "id uuid",
        "scope text",
        "state text",
        "at timestamp with time zone",
        "finished_at timestamp with time zone",
        "sessions bigint",
        "messages bigint",
        "pending_inputs bigint",
        "markers bigint",
        "scope_documents bigint",
    ),
    "retention_policies": (
        "tenant_id text",
        "scope text",
        "delete_idle_after interval",
        "keep_last_messages integer",
        "include_paused boolean",
        "created_at timestamp with time zone",
        "updated_at timestamp with time zone",
    ),
}
_INDEX_NAMES: Final = {
    "pk_erasures": "erasures",
    "uq_erasures_running": "erasures",
    "ix_erasures_scope": "erasures",
    "pk_retention_policies": "retention_policies",
}


def _check() -> None:
    ddl.check(
        *(ddl.relation_check(table, columns=columns) for table, columns in _COLUMNS.items()),
        *(ddl.relation_check(name, "index", on=table) for name, table in _INDEX_NAMES.items()),
        *(
            ddl.policies_check(table, {"tenant_isolation": ddl.TENANT_ISOLATION})
            for table in _COLUMNS
        ),
    )


def _missing(table: str) -> bool:
    if context.is_offline_mode():
        return True
    found = op.get_bind().execute(sa.text("SELECT to_regclass(:t)"), {"t": f"public.{table}"})
    return found.scalar() is None


def upgrade() -> None:
    _check()
    # In this revision's transaction: new tables nobody uses yet, so a run
    # killed half way leaves nothing and runs again from the top.
    for table, create in TABLES.items():
        if not _missing(table):
            continue
        op.execute(create)
        distribute(table)  # on Citus only (citus_v1)
        for statement in INDEXES[table]:
            op.execute(statement)
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} USING ({_MATCH}) WITH CHECK ({_MATCH})"
        )


def _count(bind: Connection, table: str) -> int:
    """Every row of ``table``, whatever row-level security says (the caller rolls back)."""
    if bind.execute(sa.text("SELECT to_regclass(:t)"), {"t": f"public.{table}"}).scalar() is None:
        return 0
    if not ddl.bypasses_rls(bind):
        bind.execute(sa.text(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY"))
    return int(bind.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: erasure receipts and retention policies."""
    lost = []
    for table, what in (
        ("erasures", "erasure receipts (erasures)"),
        ("retention_policies", "retention policies (retention_policies)"),
    ):
        n = _count(bind, table)
        if n:
            lost.append(f"{n} {what}")
    return lost


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS retention_policies")
    op.execute("DROP TABLE IF EXISTS erasures")
