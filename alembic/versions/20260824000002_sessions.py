"""Sessions: the sessions table, and messages reshaped to belong to one.

Revision ID: 20260824000002
Revises: 20260801000001
Create Date: 2026-08-24

Why it exists: a conversation becomes a first-class *session* with a title,
metadata, counters and listing indexes; a message gets its session, a gap-free
``seq``, and the fields the operator surface needs. Legacy rows keep their
(agent_id, scope) and stay unsessioned (session_id NULL) until the backfill
revision gives them a session. Citus-ready: ``tenant_id`` (first scope
segment) leads every key.

Safe with: the legacy release (it keeps inserting ``(id, agent_id, scope,
role, content, created_at)`` and reading by conversation throughout) and
every cortex release. Expand only: every new column of ``messages`` is
nullable or has a constant default (no rewrite), and ``tenant_id``, which the
legacy release does not write, is filled from ``scope`` by a trigger
(``cortex_messages_tenant``) on insert, so tightening it to NOT NULL breaks
no one.

Online: every step runs in autocommit with a short lock timeout and retries
(ddl_v1). Existing rows get ``tenant_id`` in committed batches of
:data:`FILL_PAGES` heap pages, in physical order; NOT NULL is proved by a
``NOT VALID`` check validated under a lock that lets writes go on; the new
primary key ``(tenant_id, id)`` and the other indexes are built
``CONCURRENTLY``; the foreign key and the seq check are added ``NOT VALID``
and then validated. No statement holds an exclusive lock on ``messages`` for
more than the few milliseconds a catalog change takes.

Safe to run twice: each step looks at the catalog first, so a run killed at
any point continues where it stopped.

Downgrade: cortex-written messages get their session's (agent_id, scope) so
the legacy schema's NOT NULLs hold again; conversations stay readable by the
old release. It drops every session (titles, metadata, ids) and the fields
of cortex-written messages: refused unless data loss is allowed (see
:func:`data_loss`). It runs in one transaction (not online).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.progress_v1 import progress

revision: str = "20260824000002"
down_revision: str | Sequence[str] | None = "20260801000001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ORDER = (sa.text("updated_at DESC"), sa.text("id DESC"))

# = 20261001000006._STATE (a revision's text never changes once released).
_STATE = (
    "CASE WHEN is_aborted THEN 'aborted' WHEN pending_count > 0 THEN 'paused' "
    "WHEN is_interrupted THEN 'interrupted' ELSE 'idle' END"
)

# Heap pages per batch of the tenant_id fill (about 50,000 legacy rows).
FILL_PAGES = 800

_TENANT_TRIGGER = """
CREATE OR REPLACE FUNCTION cortex_messages_tenant() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The legacy release writes scope but not tenant_id: derive it, as cortex does.
    IF NEW.tenant_id IS NULL THEN
        NEW.tenant_id := split_part(NEW.scope, '/', 1);
    END IF;
    RETURN NEW;
END
$$
"""

# One batch of the fill: a range of heap pages (a TID range scan, sequential).
# Updated rows move to pages past the table's size at the start, so no row is
# visited twice; rows inserted meanwhile already have tenant_id (the trigger).
_FILL = """
UPDATE messages SET tenant_id = split_part(scope, '/', 1)
WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid) AND tenant_id IS NULL
"""


def _create_sessions() -> None:
    # A new table nobody uses yet: created with its indexes in one go.
    op.create_table(
        "sessions",
        sa.Column("tenant_id", sa.Text(collation="C"), nullable=False),
        sa.Column("id", UUID(as_uuid=True), nullable=False),
        sa.Column("agent_id", sa.Text(collation="C"), nullable=False),
        sa.Column("scope", sa.Text(collation="C"), nullable=False),
        sa.Column("scope_depth", sa.SmallInteger(), nullable=False),
        sa.Column("scope_l2", sa.Text(collation="C"), nullable=True),
        sa.Column("title", sa.Text(), nullable=False, server_default=""),
        sa.Column("metadata", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("message_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_message", sa.Text(), nullable=False, server_default=""),
        sa.Column("backfilled_by", sa.Text(), nullable=False, server_default=""),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        # The operator state of revision 20261001000006, born with the table:
        # adding a stored generated column later rewrites the table under an
        # exclusive lock, and every legacy insert into messages takes a lock
        # on sessions (its foreign-key check opens it), so that rewrite would
        # stall the old release. 20261001000006 adds them only where missing.
        sa.Column("pending_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("is_aborted", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("is_interrupted", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("state", sa.Text(), sa.Computed(_STATE, persisted=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "id", name="pk_sessions"),
        sa.CheckConstraint("scope_depth BETWEEN 1 AND 8", name="ck_sessions_scope_depth"),
        sa.CheckConstraint("message_count >= 0", name="ck_sessions_message_count"),
        sa.CheckConstraint(
            "tenant_id = split_part(scope, '/', 1)", name="ck_sessions_scope_tenant"
        ),
    )
    op.create_index("ix_sessions_tenant_recent", "sessions", ["tenant_id", *_ORDER])
    op.create_index("ix_sessions_agent_recent", "sessions", ["tenant_id", "agent_id", *_ORDER])
    op.create_index("ix_sessions_scope_recent", "sessions", ["tenant_id", "scope", *_ORDER])
    op.create_index(
        "ix_sessions_agent_scope_recent", "sessions", ["tenant_id", "agent_id", "scope", *_ORDER]
    )
    op.create_index(
        "ix_sessions_l2_recent",
        "sessions",
        ["tenant_id", "scope_l2", *_ORDER],
        postgresql_where=sa.text("scope_depth >= 2"),
    )
    op.create_index(
        "ix_sessions_agent_l2_recent",
        "sessions",
        ["tenant_id", "agent_id", "scope_l2", *_ORDER],
        postgresql_where=sa.text("scope_depth >= 2"),
    )
    op.create_index(
        "ix_sessions_title_trgm",
        "sessions",
        ["title"],
        postgresql_using="gin",
        postgresql_ops={"title": "gin_trgm_ops"},
    )
    op.create_index(
        "ix_sessions_last_message_trgm",
        "sessions",
        ["last_message"],
        postgresql_using="gin",
        postgresql_ops={"last_message": "gin_trgm_ops"},
    )


def _fill_tenants() -> None:
    if context.is_offline_mode():
        op.execute(
            "UPDATE messages SET tenant_id = split_part(scope, '/', 1) WHERE tenant_id IS NULL"
        )
        return
    bind = op.get_bind()
    pages = int(
        bind.execute(
            sa.text(
                "SELECT pg_catalog.pg_relation_size('messages') / pg_catalog.current_setting('block_size')::int"
            )
        ).scalar_one()
    )
    with progress("tenant_id", pages, unit="pages") as advance:
        # Each batch commits on its own (autocommit); a rerun after a crash
        # walks the pages again and finds their rows done.
        for lo in range(0, pages, FILL_PAGES):
            hi = min(lo + FILL_PAGES, pages)
            # asyncpg encodes a tid as (block, offset)
            bind.execute(sa.text(_FILL), {"lo": (lo, 0), "hi": (hi, 0)})
            advance(hi - lo)


# What upgrade finds in its way on a rerun: sessions as it makes it, the
# columns it adds to messages, its trigger function and index names.
SESSIONS_COLUMNS = (
    "tenant_id text",
    "id uuid",
    "agent_id text",
    "scope text",
    "scope_depth smallint",
    "scope_l2 text",
    "title text",
    "metadata jsonb",
    "is_default boolean",
    "message_count integer",
    "last_message text",
    "backfilled_by text",
    "created_at timestamp with time zone",
    "updated_at timestamp with time zone",
    "pending_count integer",
    "is_aborted boolean",
    "is_interrupted boolean",
    "state text",
)
MESSAGES_ADDED = {
    "tenant_id": "text",
    "session_id": "uuid",
    "seq": "integer",
    "author": "text",
    "requested_input": "jsonb",
    "function_response": "jsonb",
    "metadata": "jsonb",
}
INDEXES = {
    "pk_sessions": "sessions",
    "ix_sessions_tenant_recent": "sessions",
    "ix_sessions_agent_recent": "sessions",
    "ix_sessions_scope_recent": "sessions",
    "ix_sessions_agent_scope_recent": "sessions",
    "ix_sessions_l2_recent": "sessions",
    "ix_sessions_agent_l2_recent": "sessions",
    "ix_sessions_title_trgm": "sessions",
    "ix_sessions_last_message_trgm": "sessions",
    "pk_messages": "messages",
    "uq_messages_session_seq": "messages",
    "ix_messages_unsessioned": "messages",
}


def _check() -> None:
    """Refuse what another role made under this revision's names (ddl_v1)."""
    ddl.check(
        ddl.extension_check("pg_trgm"),
        ddl.relation_check("sessions", columns=SESSIONS_COLUMNS),
        ddl.relation_check("messages", having=MESSAGES_ADDED),
        ddl.function_check("cortex_messages_tenant", ""),
        *(ddl.relation_check(name, "index", on=table) for name, table in INDEXES.items()),
    )


def upgrade() -> None:
    _check()
    # In this revision's transaction: the extension and the new table with its
    # indexes (nobody uses it yet), all or nothing.
    # pg_trgm is a trusted extension (PostgreSQL 13+): the database owner may create it.
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    if (
        context.is_offline_mode()
        or op.get_bind().execute(sa.text("SELECT to_regclass('sessions')")).scalar() is None
    ):
        _create_sessions()
    # The rest touches messages, which the running release uses: step by step.
    with op.get_context().autocommit_block():
        # Expand messages: nullable columns or constant defaults only (no rewrite),
        # and the legacy key columns become optional. One short exclusive lock.
        ddl.run(
            "ALTER TABLE messages "
            'ADD COLUMN IF NOT EXISTS tenant_id text COLLATE "C", '
            "ADD COLUMN IF NOT EXISTS session_id uuid, "
            "ADD COLUMN IF NOT EXISTS seq integer, "
            "ADD COLUMN IF NOT EXISTS author text NOT NULL DEFAULT '', "
            "ADD COLUMN IF NOT EXISTS requested_input jsonb, "
            "ADD COLUMN IF NOT EXISTS function_response jsonb, "
            "ADD COLUMN IF NOT EXISTS metadata jsonb NOT NULL DEFAULT '{}'::jsonb, "
            "ALTER COLUMN agent_id DROP NOT NULL, "
            "ALTER COLUMN scope DROP NOT NULL"
        )
        op.execute(_TENANT_TRIGGER)
        ddl.run(
            "CREATE OR REPLACE TRIGGER cortex_messages_tenant BEFORE INSERT ON messages "
            "FOR EACH ROW EXECUTE FUNCTION cortex_messages_tenant()"
        )
        _fill_tenants()
        # NOT NULL without a scan under an exclusive lock: a validated CHECK proves it.
        ddl.add_check("messages", "ck_messages_tenant_id_not_null", "tenant_id IS NOT NULL")
        # Two statements: in one, the check would be dropped before SET NOT NULL
        # looks for it, and the column would be scanned under the exclusive lock.
        ddl.run("ALTER TABLE messages ALTER COLUMN tenant_id SET NOT NULL")
        ddl.run("ALTER TABLE messages DROP CONSTRAINT IF EXISTS ck_messages_tenant_id_not_null")
        # The primary key moves to (tenant_id, id): built concurrently, then swapped.
        if not ddl.constraint_exists("pk_messages", "messages"):
            ddl.create_index("pk_messages", "messages (tenant_id, id)", unique=True)
            ddl.run(
                "ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_pkey, "
                "ADD CONSTRAINT pk_messages PRIMARY KEY USING INDEX pk_messages"
            )
        ddl.add_foreign_key(
            "messages",
            "fk_messages_tenant_id_session_id_sessions",
            ["tenant_id", "session_id"],
            "sessions (tenant_id, id)",
            on_delete="CASCADE",
        )
        ddl.add_check(
            "messages",
            "ck_messages_ck_messages_session_seq",
            "(session_id IS NULL) = (seq IS NULL)",
        )
        ddl.create_index(
            "uq_messages_session_seq", "messages (tenant_id, session_id, seq)", unique=True
        )
        ddl.create_index(
            "ix_messages_unsessioned",
            "messages (tenant_id, agent_id, scope, created_at) WHERE session_id IS NULL",
        )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy."""
    lost = []
    sessions = ddl.count_rows(bind, "sessions")
    if sessions:
        lost.append(f"{sessions} sessions (their ids, titles, metadata and defaults)")
    written = ddl.count_rows(bind, "messages", "scope IS NULL")
    if written:
        lost.append(
            f"the author, requested input, function response and metadata of {written} "
            "messages written by cortex"
        )
    return lost


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS cortex_messages_tenant ON messages")
    op.execute("DROP FUNCTION IF EXISTS cortex_messages_tenant()")
    # Give cortex-written rows the legacy conversation key of their session.
    op.execute(
        """
        UPDATE messages AS m
        SET agent_id = s.agent_id, scope = s.scope
        FROM sessions AS s
        WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id AND m.scope IS NULL
        """
    )
    op.drop_index("ix_messages_unsessioned", table_name="messages")
    op.drop_index("uq_messages_session_seq", table_name="messages")
    op.drop_constraint("ck_messages_session_seq", "messages", type_="check")
    op.drop_constraint("fk_messages_tenant_id_session_id_sessions", "messages", type_="foreignkey")
    op.drop_constraint("pk_messages", "messages", type_="primary")
    op.create_primary_key("messages_pkey", "messages", ["id"])
    op.alter_column("messages", "agent_id", nullable=False)
    op.alter_column("messages", "scope", nullable=False)
    for column in (
        "metadata",
        "function_response",
        "requested_input",
        "author",
        "seq",
        "session_id",
        "tenant_id",
    ):
        op.drop_column("messages", column)
    op.drop_table("sessions")
