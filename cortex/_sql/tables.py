"""The schema as SQLAlchemy Core tables: columns, constraints, indexes, ownership.

Alembic is the schema's only author; this metadata mirrors the migrations so
that ``alembic check`` can prove there is no drift, and so the store can build
statements. Nothing here ever runs ``create_all``.

Citus-readiness: ``tenant_id`` (the first scope segment) leads every primary
key, unique index and foreign key, so both tables can be distributed by tenant
and co-located without a rewrite.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, JSON, JSONB, UUID
from sqlalchemy.sql.naming import conv

__all__ = [
    "DATA_SIZE_REPORTED",
    "PK_MESSAGES",
    "PK_SESSIONS",
    "SCOPE_DATA_SIZE",
    "TENANT_SETTING",
    "UQ_SESSIONS_DEFAULT",
    "UQ_SESSIONS_KEY",
    "bounded_data",
    "console_actions",
    "erasures",
    "messages",
    "metadata",
    "metadata_pairs",
    "pending_inputs",
    "retention_policies",
    "schema_compat",
    "scope_data",
    "session_markers",
    "sessions",
]

# The transaction-local setting the row-level security policies compare
# tenant_id with. Set with set_config(..., true) at the start of every
# transaction; unset (NULL or '') matches no row, so a forgotten binding
# fails closed.
TENANT_SETTING: Final = "cortex.tenant"

# The names of the constraints and unique indexes a cortex call can violate,
# as PostgreSQL reports them; cortex._calls.constraints maps each to its error.
PK_SESSIONS: Final = "pk_sessions"
UQ_SESSIONS_DEFAULT: Final = "uq_sessions_default"
UQ_SESSIONS_KEY: Final = "uq_sessions_key"
PK_MESSAGES: Final = "pk_messages"
SCOPE_DATA_SIZE: Final = "ck_scope_data_data_size"
# Not a constraint of the schema: the name bounded_data's function reports.
DATA_SIZE_REPORTED: Final = "ck_sessions_data_size"

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# "C" collation: byte order, so the subtree range predicate on scope
# (scope >= 'p/' AND scope < 'p0') is a true prefix range and a plain btree serves it.
_C = "C"

sessions = sa.Table(
    "sessions",
    metadata,
    # cortex-owned: the first scope segment; leads every key (RLS and Citus distribution).
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    # cortex-owned: UUIDv7 behind the public "ses_" TypeID; unique per tenant.
    sa.Column("id", UUID(as_uuid=True), nullable=False),
    # host-owned: opaque agent id, written once at creation.
    sa.Column("agent_id", sa.Text(collation=_C), nullable=False),
    # cortex-owned: the exact scope path at creation; never updated.
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    # cortex-owned: number of segments in scope; derived once at creation.
    sa.Column("scope_depth", sa.SmallInteger(), nullable=False),
    # cortex-owned: the first two segments when scope_depth >= 2, else NULL;
    # keys the per-depth subtree index (see docs/query-plans.md).
    sa.Column("scope_l2", sa.Text(collation=_C), nullable=True),
    # cortex-owned: the first three segments when scope_depth >= 3, else NULL;
    # keys the depth-3 subtree index (revision 20261201000016). Written by
    # cortex at insert, else (rows of an older release) by a trigger.
    sa.Column("scope_l3", sa.Text(collation=_C), nullable=True),
    # host-owned: stored verbatim; written by create_session and update_session only.
    sa.Column("title", sa.Text(), nullable=False, server_default=""),
    # host-owned, legacy: the metadata of rows last written before revision
    # 20261201000009, as jsonb normalised it; '{}' on every row written since.
    sa.Column("metadata", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    # host-owned: the JSON object's text exactly as cortex serialised the
    # host's value (json, unlike jsonb, keeps its input text); written by
    # create_session and update_session only. NULL on rows written before
    # revision 20261201000009, whose metadata is the jsonb column.
    sa.Column("metadata_json", JSON(), nullable=True),
    # cortex/host: at most one true per (tenant_id, agent_id, scope), enforced by
    # uq_sessions_default; flipped only by set_default_session under an advisory lock.
    sa.Column("is_default", sa.Boolean(), nullable=False, server_default=sa.false()),
    # cortex-owned: written only in the transaction that inserts the messages it
    # counts, so no reader ever sees a count that disagrees with the rows.
    sa.Column("message_count", sa.Integer(), nullable=False, server_default="0"),
    # cortex-owned: bounded preview of the newest message, written with message_count.
    sa.Column("last_message", sa.Text(), nullable=False, server_default=""),
    # cortex-owned: set once by the backfill migration to its revision id; '' otherwise.
    sa.Column("backfilled_by", sa.Text(), nullable=False, server_default=""),
    # cortex-owned.
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # cortex-owned: moves on update_session and on every append.
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # cortex-owned: unanswered requested inputs (rows of pending_inputs), kept in
    # the transaction that appends the question or its answer.
    sa.Column("pending_count", sa.Integer(), nullable=False, server_default="0"),
    # cortex-owned: an abort marker exists; set by abort_session only, never cleared.
    sa.Column("is_aborted", sa.Boolean(), nullable=False, server_default=sa.false()),
    # cortex-owned: an interrupt marker exists; set by mark_interrupted (or at
    # insert, from a parked marker), cleared by clear_interrupted.
    sa.Column("is_interrupted", sa.Boolean(), nullable=False, server_default=sa.false()),
    # cortex-owned, derived by PostgreSQL: aborted > paused > interrupted > idle.
    # host-owned: the key the host names the session by (an agent framework's
    # session id), trimmed; unique per (tenant, agent, exact scope) by
    # uq_sessions_key; written once, at creation. NULL: the session has none.
    sa.Column("session_key", sa.Text(collation=_C), nullable=True),
    # host-owned: the session's state document, a jsonb object mapping each key
    # to the JSON text of the host's value (so values come back verbatim and a
    # delta merges key by key with ||). Written at creation and by the append
    # that carries a delta, under the session's row lock. NULL means {}.
    sa.Column("data", JSONB(), nullable=True),
    sa.Column(
        "state",
        sa.Text(),
        sa.Computed(
            "CASE WHEN is_aborted THEN 'aborted' WHEN pending_count > 0 THEN 'paused' "
            "WHEN is_interrupted THEN 'interrupted' ELSE 'idle' END",
            persisted=True,
        ),
        nullable=False,
    ),
    # cortex-owned: for a session created with a caller-chosen id, the SHA-256
    # of that create's scope_data deltas (revision 20261204000019), which a
    # retry of the create must match; NULL otherwise.
    sa.Column("scope_deltas_digest", BYTEA(), nullable=True),
    # cortex-owned: on a session made by fork_session, the source session's
    # id (same tenant; no foreign key, the lineage outlives the source) and
    # the last seq copied from it (revision 20261205000021); written once, at
    # insert, both or neither. NULL on every other session.
    sa.Column("forked_from_id", UUID(as_uuid=True), nullable=True),
    sa.Column("forked_from_seq", sa.Integer(), nullable=True),
    # cortex-owned: how many of the session's oldest messages retention
    # removed (revision 20261205000023); the kept ones run from seq
    # trimmed_count + 1 to trimmed_count + message_count without a gap. Raised
    # only by a retention trim, reset by clear_messages, under the row lock.
    sa.Column("trimmed_count", sa.Integer(), nullable=False, server_default="0"),
    sa.PrimaryKeyConstraint("tenant_id", "id", name=conv(PK_SESSIONS)),
    sa.CheckConstraint("scope_depth BETWEEN 1 AND 8", name="scope_depth"),
    sa.CheckConstraint("pending_count >= 0", name="pending_count"),
    sa.CheckConstraint("message_count >= 0", name="message_count"),
    sa.CheckConstraint("trimmed_count >= 0", name="trimmed_count"),
    # The tenant is the scope's first segment, always; RLS and the keys rely on it.
    sa.CheckConstraint("tenant_id = split_part(scope, '/', 1)", name="scope_tenant"),
    # A backstop for writers that bypass cortex: the stored size, which a
    # TOAST pointer gives without fetching the value. The exact limit
    # (cortex.models.MAX_DATA_BYTES of text) is checked where cortex writes
    # the document (bounded_data), not on every update of the row
    # (revision 20261202000017).
    sa.CheckConstraint("pg_column_size(data) <= 8388608", name="data_stored_size"),
)


def bounded_data(document: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``document`` (jsonb) as written into ``sessions.data``, refused past the size limit.

    ``cortex_bounded_data`` (revision 20261202000017) raises check_violation
    naming :data:`DATA_SIZE_REPORTED` when the document's text is longer than
    cortex.models.MAX_DATA_BYTES; every statement that writes the column
    calls it, so the limit costs nothing when the document does not change.
    """
    return sa.func.public.cortex_bounded_data(document, type_=JSONB())


# Listing indexes. Every listing orders by (updated_at DESC, id DESC) and each
# index ends with those columns in that direction, so a page is an ordered
# index scan that stops after `limit` rows, whatever the subtree's size.
# - whole tenant (depth-1 subtree), without and with an agent filter;
# - exact scope, and the subtree fallback for depth >= 4 (a range on scope);
# - depth-2 subtree (scope_l2), the large-subtree case below a tenant;
# - depth-3 subtree (scope_l3): a user's sessions, and any beneath them.
_ORDER = (sa.text("updated_at DESC"), sa.text("id DESC"))
# is_default last (revisions 20261201000014 and 15): a default-only page tests
# it on the index entry; the order is (updated_at, id)'s.
_LISTED = (*_ORDER, sessions.c.is_default)
sa.Index("ix_sessions_tenant_recent", sessions.c.tenant_id, *_LISTED)
sa.Index("ix_sessions_agent_recent", sessions.c.tenant_id, sessions.c.agent_id, *_LISTED)
sa.Index("ix_sessions_scope_recent", sessions.c.tenant_id, sessions.c.scope, *_LISTED)
sa.Index(
    "ix_sessions_agent_scope_recent",
    sessions.c.tenant_id,
    sessions.c.agent_id,
    sessions.c.scope,
    *_LISTED,
)
sa.Index(
    "ix_sessions_l2_recent",
    sessions.c.tenant_id,
    sessions.c.scope_l2,
    *_LISTED,
    postgresql_where=sessions.c.scope_depth >= 2,
)
sa.Index(
    "ix_sessions_agent_l2_recent",
    sessions.c.tenant_id,
    sessions.c.agent_id,
    sessions.c.scope_l2,
    *_LISTED,
    postgresql_where=sessions.c.scope_depth >= 2,
)
sa.Index(
    "ix_sessions_l3_recent",
    sessions.c.tenant_id,
    sessions.c.scope_l3,
    *_LISTED,
    postgresql_where=sessions.c.scope_depth >= 3,
)
sa.Index(
    "ix_sessions_agent_l3_recent",
    sessions.c.tenant_id,
    sessions.c.agent_id,
    sessions.c.scope_l3,
    *_LISTED,
    postgresql_where=sessions.c.scope_depth >= 3,
)
# At most one default per (agent, exact scope): the database, not the code, enforces it.
sa.Index(
    UQ_SESSIONS_DEFAULT,
    sessions.c.tenant_id,
    sessions.c.agent_id,
    sessions.c.scope,
    unique=True,
    postgresql_where=sessions.c.is_default,
)
# A host-chosen key names one session per (agent, exact scope).
sa.Index(
    UQ_SESSIONS_KEY,
    sessions.c.tenant_id,
    sessions.c.agent_id,
    sessions.c.scope,
    sessions.c.session_key,
    unique=True,
    postgresql_where=sessions.c.session_key.is_not(None),
)
# Operators' views: the few non-idle sessions, newest first, per tenant and state.
sa.Index(
    "ix_sessions_state_recent",
    sessions.c.tenant_id,
    sessions.c.state,
    *_ORDER,
    postgresql_where=sessions.c.state != "idle",
)
# The console's view (revision 20261205000025): the non-idle sessions of every
# tenant by state, newest first; ends with tenant_id as ids are unique per tenant only.
sa.Index(
    "ix_sessions_console_recent",
    sessions.c.state,
    *_ORDER,
    sa.text("tenant_id DESC"),
    postgresql_where=sessions.c.state != "idle",
)
# Substring search (ILIKE '%term%') on title and on the preview: trigram GIN,
# led by the tenant (btree_gin) so a search reads only its tenant's matches.
# Used through cortex_search_ids(), which row-level security cannot stop from
# running ILIKE inside the index (see cortex._sql.predicates.search_clause). The
# title's index holds titled sessions only: no update of a row is HOT, so an
# append would give it an entry for every untitled session too (revision
# 20261203000018); the functions' title arm tests ``title <> ''`` to use it.
sa.Index(
    "ix_sessions_tenant_title_trgm",
    sessions.c.tenant_id,
    sessions.c.title,
    postgresql_using="gin",
    postgresql_ops={"title": "gin_trgm_ops"},
    postgresql_where=sessions.c.title != "",
)
sa.Index(
    "ix_sessions_tenant_last_message_trgm",
    sessions.c.tenant_id,
    sessions.c.last_message,
    postgresql_using="gin",
    postgresql_ops={"last_message": "gin_trgm_ops"},
)

messages = sa.Table(
    "messages",
    metadata,
    # cortex-owned: tenant of the session (legacy rows: first segment of scope).
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    # cortex-owned: UUIDv7 behind the public "msg_" TypeID (legacy rows keep theirs).
    sa.Column("id", UUID(as_uuid=True), nullable=False),
    # cortex-owned: the session; NULL only on legacy rows the backfill has not reached.
    sa.Column("session_id", UUID(as_uuid=True), nullable=True),
    # cortex-owned: 1-based position in the session, assigned under the session's
    # row lock in the same statement that raises message_count, so it is gap-free.
    sa.Column("seq", sa.Integer(), nullable=True),
    # host-owned: user | assistant | system | tool (legacy rows may hold others).
    sa.Column("role", sa.Text(), nullable=False),
    # host-owned: stored verbatim.
    sa.Column("content", sa.Text(), nullable=False),
    # host-owned: stored verbatim.
    sa.Column("author", sa.Text(), nullable=False, server_default=""),
    # host-owned: a RequestedInput as JSON, or NULL.
    sa.Column("requested_input", JSONB(), nullable=True),
    # host-owned: a FunctionResponse as JSON, or NULL.
    sa.Column("function_response", JSONB(), nullable=True),
    # host-owned: the requested inputs after the first, a JSON array (revision
    # 20261201000013); NULL when the message asks one or none.
    sa.Column("more_requested_inputs", JSONB(), nullable=True),
    # host-owned: the function responses after the first, likewise.
    sa.Column("more_function_responses", JSONB(), nullable=True),
    # host-owned: the same four as the JSON text cortex serialised (json
    # keeps its input text, so keys keep the host's order; revision
    # 20261205000020), written with them by the append; read in their
    # place. NULL on rows written before, whose jsonb is read.
    sa.Column("requested_input_json", JSON(), nullable=True),
    sa.Column("function_response_json", JSON(), nullable=True),
    sa.Column("more_requested_inputs_json", JSON(), nullable=True),
    sa.Column("more_function_responses_json", JSON(), nullable=True),
    # host-owned, legacy: metadata of rows written before revision
    # 20261201000009, as jsonb normalised it; '{}' on rows written since.
    sa.Column("metadata", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    # host-owned: the JSON object's text exactly as cortex serialised it;
    # written once, by the append. NULL on rows written before 20261201000009.
    sa.Column("metadata_json", JSON(), nullable=True),
    # host-owned: the message's structured payload (an agent framework's event
    # or item), the JSON text exactly as cortex serialised it; written once,
    # by the append. NULL: the message has none.
    sa.Column("payload_json", JSON(), nullable=True),
    # cortex-owned: on the first message of an append with caller-chosen ids,
    # the SHA-256 of its state deltas (revision 20261204000019), which a
    # replay of the append must match; NULL on every other message.
    sa.Column("deltas_digest", BYTEA(), nullable=True),
    # cortex-owned: the append's timestamp (equal to the session's new updated_at).
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # legacy-owned: the pre-sessions conversation key. Set only on rows written
    # before sessions existed, NULL on every row cortex writes; the backfill and
    # its downgrade find their rows by it.
    sa.Column("agent_id", sa.Text(), nullable=True),
    sa.Column("scope", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("tenant_id", "id", name=conv(PK_MESSAGES)),
    sa.ForeignKeyConstraint(
        ["tenant_id", "session_id"],
        ["sessions.tenant_id", "sessions.id"],
        ondelete="CASCADE",
    ),
    sa.CheckConstraint("(session_id IS NULL) = (seq IS NULL)", name="session_seq"),
)
# Reading a session's messages by position, and gap-free seq per session.
sa.Index(
    "uq_messages_session_seq",
    messages.c.tenant_id,
    messages.c.session_id,
    messages.c.seq,
    unique=True,
)
# The backfill's work list: legacy rows not yet in a session, by conversation.
# Empty once the backfill has run.
sa.Index(
    "ix_messages_unsessioned",
    messages.c.tenant_id,
    messages.c.agent_id,
    messages.c.scope,
    messages.c.created_at,
    postgresql_where=messages.c.session_id.is_(None),
)

pending_inputs = sa.Table(
    "pending_inputs",
    metadata,
    # cortex-owned, all columns: a requested input no later message has answered.
    # Inserted with the message that asks, deleted with the one that answers
    # (or by abort_session, or with the session), in those transactions.
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    sa.Column("session_id", UUID(as_uuid=True), nullable=False),
    # seq of the message that asked: an answer resolves only earlier questions.
    sa.Column("raised_seq", sa.Integer(), nullable=False),
    sa.Column("interrupt_id", sa.Text(), nullable=False),
    sa.Column("message", sa.Text(), nullable=False, server_default=""),
    sa.Column("author", sa.Text(), nullable=False, server_default=""),
    sa.Column("raised_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("response_schema", JSONB(), nullable=True),
    sa.Column("payload", JSONB(), nullable=True),
    # The same two as the JSON text cortex serialised (revision
    # 20261205000020), read in their place; NULL on rows written before.
    sa.Column("response_schema_json", JSON(), nullable=True),
    sa.Column("payload_json", JSON(), nullable=True),
    # One row per question: a message may ask several (revision 20261201000013).
    sa.PrimaryKeyConstraint("tenant_id", "session_id", "raised_seq", "interrupt_id"),
    sa.ForeignKeyConstraint(
        ["tenant_id", "session_id"],
        ["sessions.tenant_id", "sessions.id"],
        ondelete="CASCADE",
    ),
)
sa.Index(
    "ix_pending_inputs_interrupt",
    pending_inputs.c.tenant_id,
    pending_inputs.c.session_id,
    pending_inputs.c.interrupt_id,
)

session_markers = sa.Table(
    "session_markers",
    metadata,
    # cortex-owned, all columns: operator and daemon markers. No foreign key: an
    # interrupt marker may be parked before its session exists; delete_session
    # removes a session's markers in its transaction.
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    sa.Column("session_id", UUID(as_uuid=True), nullable=False),
    # 'aborted' (written once by abort_session) | 'interrupted' (overwritten by
    # mark_interrupted, deleted by clear_interrupted).
    sa.Column("kind", sa.Text(), nullable=False),
    # The exact scope the marker belongs to: a parked marker shows only on a
    # session with its id created in this scope.
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False, server_default=""),
    sa.Column("marked_at", sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("tenant_id", "session_id", "kind"),
    sa.CheckConstraint("kind IN ('aborted', 'interrupted')", name="kind"),
)

schema_compat = sa.Table(
    "cortex_schema_compat",
    metadata,
    # cortex-owned, one row: the oldest code (its SCHEMA_REVISION) that every
    # applied revision serves; written after each upgrade run by alembic/env.py,
    # read by cortex._db.engine.check_schema. No tenant data, so no row-level security.
    sa.Column("singleton", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("oldest_code_revision", sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint("singleton"),
    sa.CheckConstraint("singleton", name="singleton"),
)

scope_data = sa.Table(
    "scope_data",
    metadata,
    # cortex-owned: the first segment of scope; leads the key (RLS, Citus).
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    # host-chosen: the scope whose sessions all see this document.
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    # host-owned: the scope's state document, shaped like sessions.data; merged
    # into every session beneath the scope when it is read (outer scope first,
    # inner overrides, the session's own last). Written by the create or the
    # append that carries a delta for it, with INSERT ... ON CONFLICT, whose
    # row lock serialises concurrent deltas.
    sa.Column("data", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    # cortex-owned: moves with every delta.
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.PrimaryKeyConstraint("tenant_id", "scope"),
    sa.CheckConstraint("tenant_id = split_part(scope, '/', 1)", name="scope_tenant"),
    sa.CheckConstraint("octet_length(data::text) <= 1048576", name=conv(SCOPE_DATA_SIZE)),
)

erasures = sa.Table(
    "erasures",
    metadata,
    # cortex-owned, all columns: the receipt of one erase_scope (revision
    # 20261205000022), written when it begins and updated by each batch in the
    # batch's transaction, so its counts are what was removed. No content.
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    # UUIDv7 behind the public "era_" TypeID.
    sa.Column("id", UUID(as_uuid=True), nullable=False),
    # The erased scope's path, as sessions.scope holds it.
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    # 'running' until the last batch, then 'done'; a killed erase stays 'running'
    # and the next erase of the same scope finishes it.
    sa.Column("state", sa.Text(), nullable=False, server_default="running"),
    # When the erasure began.
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("sessions", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("messages", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("pending_inputs", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("markers", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("scope_documents", sa.BigInteger(), nullable=False, server_default="0"),
    sa.PrimaryKeyConstraint("tenant_id", "id"),
    sa.CheckConstraint("tenant_id = split_part(scope, '/', 1)", name="scope_tenant"),
    sa.CheckConstraint("state IN ('running', 'done')", name="state"),
    sa.CheckConstraint("(state = 'done') = (finished_at IS NOT NULL)", name="finished"),
    sa.CheckConstraint(
        "sessions >= 0 AND messages >= 0 AND pending_inputs >= 0 AND markers >= 0"
        " AND scope_documents >= 0",
        name="counts",
    ),
)
# At most one running erasure per scope: a second erase of it resumes that one.
sa.Index(
    "uq_erasures_running",
    erasures.c.tenant_id,
    erasures.c.scope,
    unique=True,
    postgresql_where=erasures.c.state == "running",
)
sa.Index("ix_erasures_scope", erasures.c.tenant_id, erasures.c.scope, erasures.c.at)

retention_policies = sa.Table(
    "retention_policies",
    metadata,
    # host-owned rules per scope (revision 20261205000022): one row per path.
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    # NULL: sessions are never deleted for being idle.
    sa.Column("delete_idle_after", sa.Interval(), nullable=True),
    # NULL: a session keeps all its messages.
    sa.Column("keep_last_messages", sa.Integer(), nullable=True),
    sa.Column("include_paused", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.PrimaryKeyConstraint("tenant_id", "scope"),
    sa.CheckConstraint("tenant_id = split_part(scope, '/', 1)", name="scope_tenant"),
    sa.CheckConstraint("delete_idle_after > interval '0'", name="delete_idle_after"),
    sa.CheckConstraint("keep_last_messages >= 0", name="keep_last_messages"),
)

console_actions = sa.Table(
    "console_actions",
    metadata,
    # cortex-owned, all columns: one operator action (revision 20261205000025),
    # inserted once by Store.record_console_action in the acting tenant's
    # transaction; never updated or deleted by the application.
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    # UUIDv7 behind the public "act_" TypeID.
    sa.Column("id", UUID(as_uuid=True), nullable=False),
    # The session's scope, or the operator's when the action has no session.
    sa.Column("scope", sa.Text(collation=_C), nullable=False),
    sa.Column("session_id", UUID(as_uuid=True), nullable=True),
    # The operator's token subject ("sub"), as the console authenticated it.
    sa.Column("subject", sa.Text(), nullable=False),
    sa.Column("action", sa.Text(), nullable=False),
    # 'ok', or the name of the CortexError the action met.
    sa.Column("outcome", sa.Text(), nullable=False),
    # Ids and counts only, never an answer's content (cortex.console.ACTION_DETAIL).
    sa.Column("detail", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.PrimaryKeyConstraint("tenant_id", "id"),
    sa.CheckConstraint("tenant_id = split_part(scope, '/', 1)", name="scope_tenant"),
    sa.CheckConstraint(
        "action IN ('resume', 'abort', 'mark', 'unmark', 'sign_in', 'sign_out', 'erase')",
        name="action",
    ),
    sa.CheckConstraint("outcome ~ '^(ok|[A-Z][A-Za-z]{0,63})$'", name="outcome"),
    sa.CheckConstraint("char_length(subject) BETWEEN 1 AND 256", name="subject"),
    sa.CheckConstraint(
        "jsonb_typeof(detail) = 'object' AND octet_length(detail::text) <= 4096", name="detail"
    ),
)
sa.Index("ix_console_actions_recent", console_actions.c.at.desc(), console_actions.c.id.desc())
sa.Index(
    "ix_console_actions_tenant_recent",
    console_actions.c.tenant_id,
    sa.text("at DESC"),
    sa.text("id DESC"),
)
sa.Index(
    "ix_console_actions_session",
    console_actions.c.tenant_id,
    console_actions.c.session_id,
    sa.text("at DESC"),
    sa.text("id DESC"),
    postgresql_where=console_actions.c.session_id.is_not(None),
)

# A metadata filter's matches, newest hour first (revision 20261205000026):
# one row per top-level key of a session's metadata, the key's pair hash
# (cortex_metadata_pairs: tenant, key and value) and the hour of the
# session's updated_at (whole hours since the epoch). Written only by
# triggers on sessions (cortex_metadata_pairs_sync, as the table's owner),
# and only when a session's metadata changes or its updated_at moves into
# another hour; the application role reads it.
metadata_pairs = sa.Table(
    "metadata_pairs",
    metadata,
    sa.Column("tenant_id", sa.Text(collation=_C), nullable=False),
    sa.Column("pair", sa.BigInteger(), nullable=False),
    sa.Column("hour", sa.BigInteger(), nullable=False),
    sa.Column("session_id", UUID(as_uuid=True), nullable=False),
    sa.PrimaryKeyConstraint("tenant_id", "pair", "hour", "session_id"),
)
