"""The statements of a scope's lifecycle: erasure batches and receipts, export pages, import rows.

Every statement names the tenant (``scope_tenant``) on every table it reads
or writes, so Citus routes it to the tenant's shard, and takes its subtree
from :mod:`cortex._sql.predicates` (whole segments only). The subtree is the
one bound under the ``scope`` key: the scope the call acts on, at or beneath
the caller's.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, JSON, JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cortex._sql.params import (
    AFTER_KIND,
    AFTER_SCOPE,
    AFTER_SEQ,
    AFTER_SESSION_ID,
    BATCH_IDS,
    CUTOFF,
    D_PATHS,
    ERASURE_ID,
    LIMIT,
    SCOPE_HI,
    SCOPE_LO,
    SCOPE_PATH,
    array_param,
    int_param,
    row_name,
    scope_tenant_param,
    text_param,
    uuid_param,
)
from cortex._sql.predicates import ORDER, after_cursor, path_clause, subtree_clause
from cortex._sql.tables import (
    erasures,
    messages,
    pending_inputs,
    scope_data,
    session_markers,
    sessions,
)

__all__ = [
    "COUNTED",
    "IMPORT_KEYS",
    "SESSION_EXPORT_COLUMNS",
    "begin_erasure_statement",
    "clock_statement",
    "count_statement",
    "erase_batch_statement",
    "erase_ctes",
    "erase_parked_markers_statement",
    "erase_scope_documents_statement",
    "erase_unsessioned_statement",
    "erased_rows",
    "erasure_columns",
    "erasure_statement",
    "erasures_statement",
    "export_markers_statement",
    "export_messages_statement",
    "export_pending_statement",
    "export_scope_documents_statement",
    "export_sessions_statement",
    "finish_erasure_statement",
    "import_statement",
    "lock_batch_statement",
    "running_erasure_statement",
    "stored_statement",
    "totals_statement",
]

_UUIDS: Final = UUID(as_uuid=True)
_TIMESTAMP: Final = sa.DateTime(timezone=True)
# Constants, not binds: ON CONFLICT infers the partial index uq_erasures_running
# only from a predicate it can compare with the index's own.
_RUNNING: Final[sa.ColumnElement[str]] = sa.literal_column("'running'")
_DONE: Final[sa.ColumnElement[str]] = sa.literal_column("'done'")
# What an erasure counts, in the receipt's column order.
COUNTED: Final = ("sessions", "messages", "pending_inputs", "markers", "scope_documents")


def _tenant(table: sa.Table) -> sa.ColumnElement[bool]:
    return table.c.tenant_id == scope_tenant_param()


def _batch() -> sa.BindParameter[Any]:
    return array_param(BATCH_IDS, _UUIDS)


def _cutoff() -> sa.BindParameter[Any]:
    return sa.bindparam(CUTOFF, type_=_TIMESTAMP)


def _unsessioned_scope() -> sa.ColumnElement[bool]:
    """Legacy rows not yet in a session whose conversation's scope is in the subtree.

    ``messages.scope`` has the database's collation: compared in "C" so the
    range holds whole segments only, as the sessions' own column does.
    """
    legacy = sa.collate(messages.c.scope, "C")
    return sa.or_(
        legacy == text_param(SCOPE_PATH),
        sa.and_(legacy >= text_param(SCOPE_LO), legacy < text_param(SCOPE_HI)),
    )


# --- erasure receipts -------------------------------------------------------------


def erasure_columns() -> tuple[sa.ColumnElement[Any], ...]:
    """What a receipt is read from (cortex._calls.rows.row_to_erasure)."""
    return (
        erasures.c.id,
        erasures.c.scope,
        erasures.c.state,
        erasures.c.at,
        erasures.c.finished_at,
        *(erasures.c[name] for name in COUNTED),
    )


@cache
def clock_statement() -> sa.Select[tuple[Any]]:
    """The transaction's timestamp: a call's cutoff.

    A statement of its own: Citus refuses a non-immutable function in the
    RETURNING of a write to a distributed table.
    """
    return sa.select(sa.func.now())


@cache
def begin_erasure_statement() -> sa.Insert:
    """A new running receipt for the scope, unless one is running: then nothing (it resumes)."""
    stmt = pg_insert(erasures).values(
        tenant_id=scope_tenant_param(),
        id=uuid_param(ERASURE_ID),
        scope=text_param(SCOPE_PATH),
        state=_RUNNING,
        at=_cutoff(),
    )
    return stmt.on_conflict_do_nothing(
        index_elements=[erasures.c.tenant_id, erasures.c.scope],
        index_where=erasures.c.state == _RUNNING,
    ).returning(*erasure_columns())


@cache
def running_erasure_statement() -> sa.Select[*tuple[Any, ...]]:
    """The scope's running receipt, locked: one call finishes it at a time."""
    return (
        sa.select(*erasure_columns())
        .where(
            _tenant(erasures),
            erasures.c.scope == text_param(SCOPE_PATH),
            erasures.c.state == _RUNNING,
        )
        .with_for_update()
    )


@cache
def lock_batch_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """Up to ``limit`` sessions of the subtree created before the cutoff, row-locked.

    The lock waits for an append in flight on a session and keeps the next
    one out until the batch commits: the batch's messages are all there is.
    No order: each batch takes whatever the subtree's index yields first.
    """
    return (
        sa.select(sessions.c.id, sessions.c.message_count)
        .where(subtree_clause(depth), sessions.c.created_at < _cutoff())
        .limit(int_param(LIMIT))
        .with_for_update(of=sessions)
    )


def _deleted(table: sa.Table, *where: sa.ColumnElement[bool], name: str) -> sa.CTE:
    return sa.delete(table).where(*where).returning(sa.literal_column("1")).cte(name)


def _count(cte: sa.CTE) -> sa.ScalarSelect[int]:
    return sa.select(sa.func.count()).select_from(cte).scalar_subquery()


def erased_rows(depth: int) -> dict[str, tuple[sa.Table, tuple[sa.ColumnElement[bool], ...]]]:
    """What removing the sessions ``batch_ids`` removes, table by table: each table's WHERE.

    The batch's messages, questions and markers, and the sessions; shared by
    an erasure's batches and a retention run's (cortex._sql.retention), so
    both remove exactly the same rows.
    """
    return {
        "messages": (messages, (_tenant(messages), messages.c.session_id == sa.any_(_batch()))),
        "pending_inputs": (
            pending_inputs,
            (_tenant(pending_inputs), pending_inputs.c.session_id == sa.any_(_batch())),
        ),
        # A marker another scope parked for the same id is that scope's.
        "markers": (
            session_markers,
            (
                session_markers.c.session_id == sa.any_(_batch()),
                path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
            ),
        ),
        "sessions": (sessions, (_tenant(sessions), sessions.c.id == sa.any_(_batch()))),
    }


def erase_ctes(depth: int) -> dict[str, sa.CTE]:
    """One DELETE ... RETURNING CTE per table of :func:`erased_rows`, named by what it counts."""
    return {
        name: _deleted(table, *where, name=_CTE_NAMES[name])
        for name, (table, where) in erased_rows(depth).items()
    }


_CTE_NAMES: Final = {"messages": "m", "pending_inputs": "p", "markers": "k", "sessions": "s"}


@cache
def erase_batch_statement(depth: int) -> sa.Update:
    """One batch: the locked sessions with their messages, questions and markers; the receipt counts them.

    One statement, so the rows and the counts commit together. Each table's
    rows are deleted by their own CTE (not the sessions' ON DELETE CASCADE)
    so that each is counted; the cascade then finds nothing left.
    """
    return _add_to_receipt(erase_ctes(depth))


def _add_to_receipt(deleted: dict[str, sa.CTE]) -> sa.Update:
    stmt = sa.update(erasures).where(_tenant(erasures), erasures.c.id == uuid_param(ERASURE_ID))
    for cte in deleted.values():
        stmt = stmt.add_cte(cte)
    counts = {name: _count(cte) for name, cte in deleted.items()}
    return stmt.values(
        {name: erasures.c[name] + count for name, count in counts.items()}
    ).returning(
        *(count.label(f"removed_{name}") for name, count in counts.items()), *erasure_columns()
    )


@cache
def erase_parked_markers_statement(depth: int) -> sa.Update:
    """Up to ``limit`` markers parked in the subtree before the cutoff for ids no session holds."""
    session_exists = (
        sa.select(sa.literal_column("1"))
        .where(_tenant(sessions), sessions.c.id == session_markers.c.session_id)
        .exists()
    )
    doomed = (
        sa.select(session_markers.c.session_id, session_markers.c.kind)
        .where(
            path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
            session_markers.c.marked_at < _cutoff(),
            ~session_exists,
        )
        .limit(int_param(LIMIT))
    )
    cte = _deleted(
        session_markers,
        _tenant(session_markers),
        sa.tuple_(session_markers.c.session_id, session_markers.c.kind).in_(doomed),
        name="k",
    )
    return _add_to_receipt({"markers": cte})


@cache
def erase_scope_documents_statement(depth: int) -> sa.Update:
    """Up to ``limit`` scope state documents at or beneath the scope.

    Whenever written: a document merges every earlier delta into itself,
    so one written during the erasure still holds what was there before.
    """
    doomed = (
        sa.select(scope_data.c.scope)
        .where(path_clause(scope_data.c.tenant_id, scope_data.c.scope, depth))
        .limit(int_param(LIMIT))
    )
    cte = _deleted(scope_data, _tenant(scope_data), scope_data.c.scope.in_(doomed), name="d")
    return _add_to_receipt({"scope_documents": cte})


@cache
def erase_unsessioned_statement() -> sa.Update:
    """Up to ``limit`` legacy messages the backfill left outside any session, in the subtree."""
    doomed = (
        sa.select(messages.c.id)
        .where(_tenant(messages), messages.c.session_id.is_(None), _unsessioned_scope())
        .limit(int_param(LIMIT))
    )
    cte = _deleted(messages, _tenant(messages), messages.c.id.in_(doomed), name="m")
    return _add_to_receipt({"messages": cte})


@cache
def finish_erasure_statement() -> sa.Update:
    return (
        sa.update(erasures)
        .where(
            _tenant(erasures),
            erasures.c.id == uuid_param(ERASURE_ID),
            erasures.c.state == _RUNNING,
        )
        .values(state=_DONE, finished_at=sa.func.now())
        .returning(*erasure_columns())
    )


@cache
def erasure_statement() -> sa.Select[*tuple[Any, ...]]:
    """One receipt, by id."""
    return sa.select(*erasure_columns()).where(
        _tenant(erasures), erasures.c.id == uuid_param(ERASURE_ID)
    )


@cache
def erasures_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The receipts of erasures at or beneath the scope, newest first."""
    return (
        sa.select(*erasure_columns())
        .where(path_clause(erasures.c.tenant_id, erasures.c.scope, depth))
        .order_by(erasures.c.at.desc(), erasures.c.id.desc())
    )


@cache
def count_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """What an erasure of the subtree would remove now (a dry run), in one snapshot."""
    in_subtree = sa.select(sessions.c.id).where(subtree_clause(depth)).scalar_subquery()

    def counted(table: sa.Table, *where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
        return sa.select(sa.func.count()).select_from(table).where(*where).scalar_subquery()

    session_exists = (
        sa.select(sa.literal_column("1"))
        .where(_tenant(sessions), sessions.c.id == session_markers.c.session_id)
        .exists()
    )
    return sa.select(
        counted(sessions, subtree_clause(depth)).label("sessions"),
        sa.func.coalesce(
            sa.select(sa.func.sum(sessions.c.message_count))
            .where(subtree_clause(depth))
            .scalar_subquery(),
            0,
        ).label("session_messages"),
        counted(
            messages, _tenant(messages), messages.c.session_id.is_(None), _unsessioned_scope()
        ).label("unsessioned"),
        counted(
            pending_inputs, _tenant(pending_inputs), pending_inputs.c.session_id.in_(in_subtree)
        ).label("pending_inputs"),
        counted(
            session_markers,
            path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth),
            sa.or_(session_markers.c.session_id.in_(in_subtree), ~session_exists),
        ).label("markers"),
        counted(scope_data, path_clause(scope_data.c.tenant_id, scope_data.c.scope, depth)).label(
            "scope_documents"
        ),
    )


# --- export pages (one REPEATABLE READ snapshot: cortex._db.snapshot) -------------------------

# Every stored column of a session but those derived from others (tenant_id,
# scope_depth, scope_l2, scope_l3, state). JSON columns as their text.
SESSION_EXPORT_COLUMNS: Final = (
    sessions.c.id,
    sessions.c.agent_id,
    sessions.c.scope,
    sessions.c.title,
    sa.cast(sessions.c.metadata, sa.Text()).label("metadata"),
    sa.cast(sessions.c.metadata_json, sa.Text()).label("metadata_json"),
    sessions.c.is_default,
    sessions.c.session_key,
    sa.cast(sessions.c.data, sa.Text()).label("data"),
    sessions.c.message_count,
    sessions.c.trimmed_count,
    sessions.c.last_message,
    sessions.c.pending_count,
    sessions.c.is_aborted,
    sessions.c.is_interrupted,
    sessions.c.backfilled_by,
    sessions.c.scope_deltas_digest,
    sessions.c.forked_from_id,
    sessions.c.forked_from_seq,
    sessions.c.created_at,
    sessions.c.updated_at,
)

MESSAGE_EXPORT_COLUMNS: Final = (
    messages.c.id,
    messages.c.session_id,
    messages.c.seq,
    messages.c.role,
    messages.c.content,
    messages.c.author,
    sa.cast(messages.c.requested_input, sa.Text()).label("requested_input"),
    sa.cast(messages.c.function_response, sa.Text()).label("function_response"),
    sa.cast(messages.c.more_requested_inputs, sa.Text()).label("more_requested_inputs"),
    sa.cast(messages.c.more_function_responses, sa.Text()).label("more_function_responses"),
    sa.cast(messages.c.requested_input_json, sa.Text()).label("requested_input_json"),
    sa.cast(messages.c.function_response_json, sa.Text()).label("function_response_json"),
    sa.cast(messages.c.more_requested_inputs_json, sa.Text()).label("more_requested_inputs_json"),
    sa.cast(messages.c.more_function_responses_json, sa.Text()).label(
        "more_function_responses_json"
    ),
    sa.cast(messages.c.metadata, sa.Text()).label("metadata"),
    sa.cast(messages.c.metadata_json, sa.Text()).label("metadata_json"),
    sa.cast(messages.c.payload_json, sa.Text()).label("payload_json"),
    messages.c.deltas_digest,
    messages.c.created_at,
    messages.c.agent_id.label("legacy_agent_id"),
    messages.c.scope.label("legacy_scope"),
)

PENDING_EXPORT_COLUMNS: Final = (
    pending_inputs.c.session_id,
    pending_inputs.c.raised_seq,
    pending_inputs.c.interrupt_id,
    pending_inputs.c.message,
    pending_inputs.c.author,
    pending_inputs.c.raised_at,
    sa.cast(pending_inputs.c.response_schema, sa.Text()).label("response_schema"),
    sa.cast(pending_inputs.c.payload, sa.Text()).label("payload"),
    sa.cast(pending_inputs.c.response_schema_json, sa.Text()).label("response_schema_json"),
    sa.cast(pending_inputs.c.payload_json, sa.Text()).label("payload_json"),
)

MARKER_EXPORT_COLUMNS: Final = (
    session_markers.c.session_id,
    session_markers.c.kind,
    session_markers.c.scope,
    session_markers.c.reason,
    session_markers.c.marked_at,
)


@cache
def totals_statement(depth: int) -> sa.Select[*tuple[Any, ...]]:
    """The subtree's sessions and their messages, for the export's header."""
    return sa.select(
        sa.func.count().label("sessions"),
        sa.func.coalesce(sa.func.sum(sessions.c.message_count), 0).label("messages"),
    ).where(subtree_clause(depth))


@cache
def export_scope_documents_statement(depth: int, cursor: bool) -> sa.Select[*tuple[Any, ...]]:
    stmt = sa.select(
        scope_data.c.scope,
        sa.cast(scope_data.c.data, sa.Text()).label("data"),
        scope_data.c.updated_at,
    ).where(path_clause(scope_data.c.tenant_id, scope_data.c.scope, depth))
    if cursor:
        stmt = stmt.where(scope_data.c.scope > text_param(AFTER_SCOPE))
    return stmt.order_by(scope_data.c.scope).limit(int_param(LIMIT))


@cache
def export_sessions_statement(depth: int, cursor: bool) -> sa.Select[*tuple[Any, ...]]:
    """A page of the subtree's sessions in listing order, after the keyset cursor.

    The listing order, so each page is one scan of the listing index that
    serves the subtree's depth (stable within the export's snapshot).
    """
    stmt = sa.select(*SESSION_EXPORT_COLUMNS).where(subtree_clause(depth))
    if cursor:
        stmt = stmt.where(after_cursor())
    return stmt.order_by(*ORDER).limit(int_param(LIMIT))


@cache
def export_messages_statement(cursor: bool) -> sa.Select[*tuple[Any, ...]]:
    """The messages of sessions ``batch_ids``, by session and position.

    ``cursor``: after ``after_seq``, for one session only (``batch_ids``
    holds one id): a row comparison on (session, seq) beside the array made
    the planner walk the index from the cursor to the tenant's end.
    """
    stmt = sa.select(*MESSAGE_EXPORT_COLUMNS).where(
        _tenant(messages), messages.c.session_id == sa.any_(_batch())
    )
    if cursor:
        stmt = stmt.where(messages.c.seq > int_param(AFTER_SEQ))
    return stmt.order_by(messages.c.session_id, messages.c.seq).limit(int_param(LIMIT))


@cache
def export_pending_statement() -> sa.Select[*tuple[Any, ...]]:
    return (
        sa.select(*PENDING_EXPORT_COLUMNS)
        .where(_tenant(pending_inputs), pending_inputs.c.session_id == sa.any_(_batch()))
        .order_by(
            pending_inputs.c.session_id, pending_inputs.c.raised_seq, pending_inputs.c.interrupt_id
        )
    )


@cache
def export_markers_statement(depth: int, cursor: bool) -> sa.Select[*tuple[Any, ...]]:
    """Markers at or beneath the scope (parked ones too), by session and kind."""
    stmt = sa.select(*MARKER_EXPORT_COLUMNS).where(
        path_clause(session_markers.c.tenant_id, session_markers.c.scope, depth)
    )
    if cursor:
        stmt = stmt.where(
            sa.tuple_(session_markers.c.session_id, session_markers.c.kind)
            > sa.tuple_(uuid_param(AFTER_SESSION_ID), text_param(AFTER_KIND))
        )
    return stmt.order_by(session_markers.c.session_id, session_markers.c.kind).limit(
        int_param(LIMIT)
    )


# --- import rows ----------------------------------------------------------------------


def _typed(column: sa.Column[Any], name: str) -> sa.ColumnElement[Any]:
    """The bind for ``column``: JSON columns travel as text and are cast in SQL."""
    kind = column.type
    if isinstance(kind, JSONB | JSON):
        return sa.cast(text_param(name), kind)
    if isinstance(kind, UUID):
        return uuid_param(name)
    if isinstance(kind, BYTEA):
        return sa.bindparam(name, type_=BYTEA())
    if isinstance(kind, sa.DateTime):
        return sa.bindparam(name, type_=_TIMESTAMP)
    if isinstance(kind, sa.Integer | sa.SmallInteger):
        return int_param(name)
    if isinstance(kind, sa.Boolean):
        return sa.bindparam(name, type_=sa.Boolean())
    return text_param(name)


# What each imported table's rows are keyed by (what a row already there is found by).
IMPORT_KEYS: Final = {
    "sessions": ("id",),
    "messages": ("id",),
    "pending_inputs": ("session_id", "raised_seq", "interrupt_id"),
    "session_markers": ("session_id", "kind"),
    "scope_data": ("scope",),
}
_TABLES: Final = {
    "sessions": sessions,
    "messages": messages,
    "pending_inputs": pending_inputs,
    "session_markers": session_markers,
    "scope_data": scope_data,
}


@cache
def import_statement(table: str, columns: tuple[str, ...], count: int) -> sa.Insert:
    """``INSERT ... VALUES`` of ``count`` rows of ``columns`` (the tenant is the bound one).

    Binds are the column names suffixed by row (``row_name``); a row whose
    key is taken is skipped (``ON CONFLICT`` on the primary key), and the
    keys of the rows written come back. Any other unique index (a default,
    a key, a position) still refuses. One shape per row count: callers send
    powers of two.
    """
    target = _TABLES[table]
    rows = [
        {
            "tenant_id": scope_tenant_param(),
            **{c: _typed(target.c[c], row_name(c, i)) for c in columns},
        }
        for i in range(count)
    ]
    keys = [target.c.tenant_id, *(target.c[k] for k in IMPORT_KEYS[table])]
    return (
        pg_insert(target)
        .values(rows)
        .on_conflict_do_nothing(index_elements=keys)
        .returning(*(target.c[k] for k in IMPORT_KEYS[table]))
    )


@cache
def stored_statement(table: str) -> sa.Select[*tuple[Any, ...]]:
    """The rows of ``table`` stored under the keys an import found taken, as exported.

    By the first key column: the ids (or sessions) in ``batch_ids``, or for
    scope documents the paths in ``d_paths``; the caller matches the rest.
    """
    if table == "sessions":
        return sa.select(*SESSION_EXPORT_COLUMNS).where(
            _tenant(sessions), sessions.c.id == sa.any_(_batch())
        )
    if table == "messages":
        return sa.select(*MESSAGE_EXPORT_COLUMNS).where(
            _tenant(messages), messages.c.id == sa.any_(_batch())
        )
    if table == "pending_inputs":
        return sa.select(*PENDING_EXPORT_COLUMNS).where(
            _tenant(pending_inputs), pending_inputs.c.session_id == sa.any_(_batch())
        )
    if table == "session_markers":
        return sa.select(*MARKER_EXPORT_COLUMNS).where(
            _tenant(session_markers), session_markers.c.session_id == sa.any_(_batch())
        )
    return sa.select(
        scope_data.c.scope,
        sa.cast(scope_data.c.data, sa.Text()).label("data"),
        scope_data.c.updated_at,
    ).where(
        _tenant(scope_data),
        scope_data.c.scope == sa.any_(array_param(D_PATHS, sa.Text())),
    )
