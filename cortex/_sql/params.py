"""Every bind name cortex's statements use, and the typed bind parameters built from them.

A statement's builder (cortex._sql) and the call that fills its values
(cortex._calls) spell each name through these constants, so the two cannot drift.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, UUID

__all__ = [
    "ACTION",
    "ACTION_ID",
    "AFTER_AT",
    "AFTER_ID",
    "AFTER_KIND",
    "AFTER_SCOPE",
    "AFTER_SEQ",
    "AFTER_SESSION_ID",
    "AFTER_TENANT",
    "AFTER_UPDATED_AT",
    "AGENT_ID",
    "ANCESTORS",
    "A_IDS",
    "A_SEQS",
    "BATCH_IDS",
    "BATCH_SIZE",
    "BEFORE_SEQ",
    "COPY_BASE",
    "COPY_IDS",
    "CREATED_AFTER",
    "CREATED_BEFORE",
    "CUTOFF",
    "C_AGENT_ID",
    "C_SEARCH",
    "C_STATE",
    "C_TENANT",
    "DATA_DELTA",
    "DELETED_SCOPE",
    "DELTAS_DIGEST",
    "DETAIL",
    "D_DATA",
    "D_PATHS",
    "D_SCOPES",
    "ERASURE_ID",
    "EXPECTED_COUNT",
    "FIRST_SEQS",
    "IDLE_BEFORE",
    "INTERRUPT_ID",
    "K_AUTHORS",
    "K_CONTENT_HASHES",
    "K_IDS",
    "K_METADATA_HASHES",
    "K_MORE_REQUESTED",
    "K_MORE_RESPONSES",
    "K_PAYLOAD_HASHES",
    "K_REQUESTED",
    "K_RESPONSES",
    "K_ROLES",
    "LAST_SEQ",
    "LIMIT",
    "LOCK_KEY",
    "MARKER_SCOPE",
    "METADATA_BEFORE",
    "METADATA_CAP",
    "METADATA_FILTER",
    "METADATA_IDS",
    "METADATA_KEY",
    "METADATA_NEWEST",
    "METADATA_SINCE",
    "METADATA_VALUE",
    "MIN_KEEP",
    "M_AUTHOR",
    "M_AUTHORS",
    "M_CONTENT",
    "M_CONTENTS",
    "M_CREATED_AT",
    "M_DIGEST",
    "M_ID",
    "M_IDS",
    "M_METADATA",
    "M_MORE_REQUESTED",
    "M_MORE_RESPONSES",
    "M_PAYLOAD",
    "M_PAYLOADS",
    "M_REQUESTED",
    "M_RESPONSE",
    "M_RESPONSES",
    "M_ROLE",
    "M_ROLES",
    "M_SEQ",
    "NEW_AGENT_ID",
    "NEW_DATA",
    "NEW_IS_DEFAULT",
    "NEW_IS_INTERRUPTED",
    "NEW_KEY",
    "NEW_METADATA",
    "NEW_SCOPE",
    "NEW_SCOPE_DEPTH",
    "NEW_SCOPE_DIGEST",
    "NEW_SCOPE_L2",
    "NEW_SCOPE_L3",
    "NEW_TENANT_ID",
    "NEW_TITLE",
    "OFFSET",
    "OUTCOME",
    "PENDING_COUNT",
    "PENDING_DELTA",
    "PREVIEW",
    "Q_AUTHOR",
    "Q_AUTHORS",
    "Q_ID",
    "Q_IDS",
    "Q_MESSAGE",
    "Q_MESSAGES",
    "Q_PAYLOAD",
    "Q_PAYLOADS",
    "Q_RAISED_AT",
    "Q_SCHEMA",
    "Q_SCHEMAS",
    "Q_SEQ",
    "Q_SEQS",
    "REASON",
    "R_DELETE_IDLE_AFTER",
    "R_INCLUDE_PAUSED",
    "R_KEEP_LAST_MESSAGES",
    "SCOPE",
    "SCOPE_HI",
    "SCOPE_LO",
    "SCOPE_PARAMS",
    "SCOPE_PATH",
    "SCOPE_TENANT",
    "SEARCH_IDS",
    "SEARCH_PATTERN",
    "SESSION_ID",
    "SINCE",
    "SOURCE_ID",
    "SUBJECT",
    "TARGET_AGENT_ID",
    "TARGET_ID",
    "TARGET_PATH",
    "TARGET_SCOPE",
    "THROUGH_SEQ",
    "TO_SEQ",
    "UPDATED_AFTER",
    "UPDATED_BEFORE",
    "array_param",
    "bool_param",
    "bytes_param",
    "int_param",
    "row_name",
    "scope_tenant_param",
    "target_id_param",
    "text_param",
    "uuid_param",
]

# --- the caller's scope (cortex._sql.predicates.scope_params) -------------------

# The key the scope binds are named by: <key>_tenant, <key>_path, <key>_lo, <key>_hi.
SCOPE: Final = "scope"
SCOPE_TENANT: Final = "scope_tenant"
SCOPE_PATH: Final = "scope_path"
SCOPE_LO: Final = "scope_lo"
SCOPE_HI: Final = "scope_hi"
# Bound together: a shape that needs only the tenant still receives the rest.
SCOPE_PARAMS: Final = frozenset({SCOPE_TENANT, SCOPE_PATH, SCOPE_LO, SCOPE_HI})

# --- one session ----------------------------------------------------------------

TARGET_ID: Final = "target_id"
TARGET_PATH: Final = "target_path"
TARGET_AGENT_ID: Final = "target_agent_id"
TARGET_SCOPE: Final = "target_scope"
DELETED_SCOPE: Final = "deleted_scope"
LOCK_KEY: Final = "lock_key"
# A fork's source session (its new session is TARGET_ID).
SOURCE_ID: Final = "source_id"

# --- listings ---------------------------------------------------------------------

LIMIT: Final = "limit"
OFFSET: Final = "offset"
AGENT_ID: Final = "agent_id"
SEARCH_PATTERN: Final = "search_pattern"
SEARCH_IDS: Final = "search_ids"
AFTER_UPDATED_AT: Final = "after_updated_at"
AFTER_ID: Final = "after_id"
# A metadata filter's keys and values (JSON text), suffixed by position (see row_name()).
METADATA_KEY: Final = "metadata_key"
METADATA_VALUE: Final = "metadata_value"
# The whole metadata filter (a JSON object), how many candidates it may have,
# and the candidates found (cortex._sql.predicates.metadata_candidates_statement).
METADATA_FILTER: Final = "metadata_filter"
METADATA_CAP: Final = "metadata_cap"
METADATA_IDS: Final = "metadata_ids"
# The hours a filter's candidates were read from (revision 20261205000026):
# no later than METADATA_BEFORE (a cursor's or a bound's hour), down to the
# hour of the METADATA_NEWEST-th newest match, whose start the listing binds
# as METADATA_SINCE.
METADATA_BEFORE: Final = "metadata_before"
METADATA_NEWEST: Final = "metadata_newest"
METADATA_SINCE: Final = "metadata_since"
CREATED_AFTER: Final = "created_after"
CREATED_BEFORE: Final = "created_before"
UPDATED_AFTER: Final = "updated_after"
UPDATED_BEFORE: Final = "updated_before"

# --- a new session's columns ---------------------------------------------------------

NEW_TENANT_ID: Final = "new_tenant_id"
NEW_SCOPE: Final = "new_scope"
NEW_SCOPE_DEPTH: Final = "new_scope_depth"
NEW_SCOPE_L2: Final = "new_scope_l2"
NEW_SCOPE_L3: Final = "new_scope_l3"
NEW_AGENT_ID: Final = "new_agent_id"
NEW_TITLE: Final = "new_title"
NEW_METADATA: Final = "new_metadata"
NEW_IS_DEFAULT: Final = "new_is_default"
NEW_KEY: Final = "new_key"
NEW_DATA: Final = "new_data"
NEW_SCOPE_DIGEST: Final = "new_scope_digest"
NEW_IS_INTERRUPTED: Final = "new_is_interrupted"

# --- scope state documents ---------------------------------------------------------

D_PATHS: Final = "d_paths"
D_SCOPES: Final = "d_scopes"
D_DATA: Final = "d_data"

# --- appends: the counter UPDATE ---------------------------------------------------------

BATCH_SIZE: Final = "batch_size"
PREVIEW: Final = "preview"
DATA_DELTA: Final = "data_delta"
EXPECTED_COUNT: Final = "expected_count"
DELTAS_DIGEST: Final = "deltas_digest"

# --- appends: the messages, as arrays (a batch) or suffixed by row (see row_name()) -----------

M_IDS: Final = "m_ids"
M_ROLES: Final = "m_roles"
M_CONTENTS: Final = "m_contents"
M_AUTHORS: Final = "m_authors"
M_RESPONSES: Final = "m_responses"
M_PAYLOADS: Final = "m_payloads"
M_REQUESTED: Final = "m_requested"
M_MORE_REQUESTED: Final = "m_more_requested"
M_MORE_RESPONSES: Final = "m_more_responses"
M_METADATA: Final = "m_metadata"
M_ID: Final = "m_id"
M_SEQ: Final = "m_seq"
M_ROLE: Final = "m_role"
M_CONTENT: Final = "m_content"
M_AUTHOR: Final = "m_author"
M_RESPONSE: Final = "m_response"
M_PAYLOAD: Final = "m_payload"
M_DIGEST: Final = "m_digest"
M_CREATED_AT: Final = "m_created_at"

# --- appends: caller-chosen message ids already stored ------------------------------------

K_IDS: Final = "k_ids"
K_ROLES: Final = "k_roles"
K_CONTENT_HASHES: Final = "k_content_hashes"
K_AUTHORS: Final = "k_authors"
K_REQUESTED: Final = "k_requested"
K_RESPONSES: Final = "k_responses"
K_MORE_REQUESTED: Final = "k_more_requested"
K_MORE_RESPONSES: Final = "k_more_responses"
K_METADATA_HASHES: Final = "k_metadata_hashes"
K_PAYLOAD_HASHES: Final = "k_payload_hashes"

# --- reading and removing messages ------------------------------------------------------

AFTER_SEQ: Final = "after_seq"
BEFORE_SEQ: Final = "before_seq"
SINCE: Final = "since"
LAST_SEQ: Final = "last_seq"

# --- forking and rewinding ----------------------------------------------------------------

# The last seq a fork copies, and the seq a rewind keeps.
THROUGH_SEQ: Final = "through_seq"
TO_SEQ: Final = "to_seq"
# One chunk of a fork's copy: the seq before it, and its messages' new ids in seq order.
COPY_BASE: Final = "copy_base"
COPY_IDS: Final = "copy_ids"
PENDING_COUNT: Final = "pending_count"

# --- the operator surface: questions (arrays, or suffixed by row), answers, markers ----------

Q_SEQS: Final = "q_seqs"
Q_IDS: Final = "q_ids"
Q_MESSAGES: Final = "q_messages"
Q_AUTHORS: Final = "q_authors"
Q_SCHEMAS: Final = "q_schemas"
Q_PAYLOADS: Final = "q_payloads"
Q_SEQ: Final = "q_seq"
Q_ID: Final = "q_id"
Q_MESSAGE: Final = "q_message"
Q_AUTHOR: Final = "q_author"
Q_SCHEMA: Final = "q_schema"
Q_PAYLOAD: Final = "q_payload"
Q_RAISED_AT: Final = "q_raised_at"
A_IDS: Final = "a_ids"
A_SEQS: Final = "a_seqs"
PENDING_DELTA: Final = "pending_delta"
INTERRUPT_ID: Final = "interrupt_id"
MARKER_SCOPE: Final = "marker_scope"
REASON: Final = "reason"


# --- a scope's lifecycle: erasure batches, export pages (cortex._sql.lifecycle) --------------

ERASURE_ID: Final = "erasure_id"
# When the erasure call began: sessions created from then on are not its.
CUTOFF: Final = "cutoff"
# The sessions one erasure batch removes, or one export page's sessions.
BATCH_IDS: Final = "batch_ids"
AFTER_SCOPE: Final = "after_scope"
AFTER_SESSION_ID: Final = "after_session_id"
AFTER_KIND: Final = "after_kind"


# --- retention policies and runs (cortex._sql.retention) -------------------------------------

# The paths of the scopes above the one a call acts on, outermost first.
ANCESTORS: Final = "ancestors"
R_DELETE_IDLE_AFTER: Final = "r_delete_idle_after"
R_KEEP_LAST_MESSAGES: Final = "r_keep_last_messages"
R_INCLUDE_PAUSED: Final = "r_include_paused"
# A run's candidates: idle since before this, or holding more than that many messages.
IDLE_BEFORE: Final = "idle_before"
MIN_KEEP: Final = "min_keep"
# A batch acts under one policy (the R_ names, with CUTOFF for an erase);
# a trim binds the first position each of its sessions keeps, beside BATCH_IDS.
FIRST_SEQS: Final = "first_seqs"


# --- the operator console (cortex.console) ---------------------------------------

# The listing's filters; its cursor continues after AFTER_UPDATED_AT, AFTER_ID, AFTER_TENANT.
C_STATE: Final = "c_state"
C_TENANT: Final = "c_tenant"
C_AGENT_ID: Final = "c_agent_id"
C_SEARCH: Final = "c_search"
AFTER_TENANT: Final = "after_tenant"
# An audit row (console_actions); the action listing's cursor is AFTER_AT, AFTER_ID, AFTER_TENANT.
AFTER_AT: Final = "after_at"
ACTION_ID: Final = "action_id"
ACTION: Final = "action"
SUBJECT: Final = "subject"
OUTCOME: Final = "outcome"
DETAIL: Final = "detail"
SESSION_ID: Final = "session_id"


def row_name(name: str, i: int) -> str:
    """The bind name of ``name`` for row ``i`` of a multi-row statement (``m_id_0``)."""
    return f"{name}_{i}"


def text_param(name: str) -> sa.BindParameter[str]:
    """A text bind (sent as ``$n::TEXT``: cortex._db.executor)."""
    return sa.bindparam(name, type_=sa.Text())


def int_param(name: str) -> sa.BindParameter[int]:
    return sa.bindparam(name, type_=sa.Integer())


def bool_param(name: str) -> sa.BindParameter[bool]:
    return sa.bindparam(name, type_=sa.Boolean())


def bytes_param(name: str) -> sa.BindParameter[bytes]:
    return sa.bindparam(name, type_=BYTEA())


def uuid_param(name: str) -> sa.BindParameter[uuid.UUID]:
    return sa.bindparam(name, type_=UUID(as_uuid=True))


def array_param(name: str, item: sa.types.TypeEngine[Any]) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=ARRAY(item))


def scope_tenant_param() -> sa.BindParameter[str]:
    """The caller's tenant: every statement on a cortex table binds it (Citus routes by it)."""
    return text_param(SCOPE_TENANT)


def target_id_param() -> sa.BindParameter[uuid.UUID]:
    """The id of the one session a statement acts on."""
    return uuid_param(TARGET_ID)
