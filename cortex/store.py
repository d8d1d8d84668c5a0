"""``connect()`` and :class:`Store`: the public façade, one transaction per method.

Each method's arguments are validated against their annotated types by
:func:`cortex._validate.boundary` before its body runs (a refusal is
InvalidInput naming the parameter, before any SQL); the body reads the scope
from the context, and runs one function of
``cortex._calls.sessions``, ``cortex._calls.messages`` or ``cortex._calls.operator`` inside
:func:`cortex._db.transaction.run_transaction`. The store holds only the engine, so one
instance is safe to share across concurrent tasks: each call checks out its
own connection.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Sequence,
)
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial
from typing import Annotated, Any, TypeVar

import asyncpg
from pydantic import BeforeValidator, Field, Strict
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from cortex._calls import console as console_calls
from cortex._calls import erasure as erasure_calls
from cortex._calls import messages as message_calls
from cortex._calls import operator as operator_calls
from cortex._calls import retention as retention_calls
from cortex._calls import scope_state as scope_state_calls
from cortex._calls import sessions as session_calls
from cortex._calls import transfer as transfer_calls
from cortex._calls.messages import SEQ_END, SessionHistory
from cortex._calls.sessions import not_found
from cortex._db import routines as _routines
from cortex._db.engine import check_schema, foreign_creators_warning, make_engine
from cortex._db.executor import Routines, Tx
from cortex._db.pool import drop_held_on_disconnect, holding_options
from cortex._db.snapshot import read_snapshot
from cortex._db.transaction import run_transaction
from cortex._validate import boundary, encode_json, instance_of
from cortex.console import (
    ACTION_PREFIX,
    ActionDetail,
    ActionKind,
    ConsoleAction,
    Outcome,
    Subject,
)
from cortex.errors import Conflict, InvalidInput, NotFound, ScopeViolation, translate_errors
from cortex.ids import format_id, new_uuid
from cortex.models import (
    DEFAULT_MESSAGE_LIMIT,
    MAX_APPEND_BATCH,
    MAX_DATA_BYTES,
    MAX_JSON_BYTES,
    AgentId,
    Author,
    BeforeSeq,
    Data,
    Erasure,
    ErasureReport,
    Flag,
    FunctionResponse,
    ImportReport,
    InterruptId,
    JsonValue,
    ListFilter,
    Message,
    MessageLimit,
    Metadata,
    NewMessage,
    Reason,
    RetentionPolicy,
    RetentionReport,
    ScopeData,
    Seq,
    Session,
    SessionCursor,
    SessionDetail,
    SessionId,
    SessionKey,
    SessionPage,
    StatePatch,
    Title,
    encode_data,
    session_uuid,
)
from cortex.scope import Scope, current_scope

Since = Annotated[datetime | None, Strict()]


def _data_json(data: dict[str, Any] | None) -> str | None:
    """A state document or delta as stored; None when there is nothing in it."""
    if not data:
        return None
    return encode_json(encode_data(data), 2 * MAX_DATA_BYTES)


def _scope_deltas(scope_data: dict[str, dict[str, Any]] | None) -> dict[str, str] | None:
    """Scope deltas as stored, by canonical path; None when there are none."""
    if not scope_data:
        return None
    out = {}
    for path, delta in scope_data.items():
        text = _data_json(delta)
        if text is not None:
            out[str(Scope.parse(path))] = text
    return out or None


__all__ = ["Store", "connect"]

# How many resolved defaults a store remembers (a hint, never a cache of data).
_KNOWN_DEFAULTS = 10_000

log = logging.getLogger("cortex")

T = TypeVar("T")


@asynccontextmanager
async def connect(url: str | URL, **pool_options: Any) -> AsyncIterator[Store]:
    """Open a store on ``url`` and close its engine on exit.

    ``url`` is ``postgresql://…`` or ``postgresql+asyncpg://…``;
    ``pool_options`` go to SQLAlchemy's ``create_async_engine`` (``pool_size``,
    ``pool_timeout``, ``pool_pre_ping``, ``pool_recycle``, ``connect_args``...).

    Raises:
        SchemaMismatch: the database is not at this code's schema revision.
        DatabaseUnavailable: the database cannot be reached.
        InvalidInput: the URL names another driver.
    """
    store = await open_store(url, **pool_options)
    try:
        yield store
    finally:
        await store.engine.dispose()


async def open_store(url: str | URL, **pool_options: Any) -> Store:
    """The one way a store is built on a URL: :func:`connect` without the ``async with``.

    The caller owns the engine (``await store.engine.dispose()``).

    Raises:
        SchemaMismatch: the database is not at this code's schema revision.
        DatabaseUnavailable: the database cannot be reached.
        InvalidInput: the URL names another driver.
    """
    engine = make_engine(url, manual_transactions=True, **holding_options(pool_options))
    drop_held_on_disconnect(engine)
    try:
        state = await check_schema(engine)
        if state.bypasses_rls:
            log.warning(
                "cortex is connected as %s, a superuser or BYPASSRLS role: row-level "
                "security does not apply to it, so only cortex's own predicates keep "
                "tenants apart. Connect the service as a plain role (cortex db grant ROLE).",
                engine.url.username or "the login role",
            )
        if state.foreign_creators:
            log.warning("cortex: %s", foreign_creators_warning(state.foreign_creators))
        routines = {} if state.foreign_creators else await _installed_routines(engine)
    except BaseException:
        await engine.dispose()
        raise
    return Store(
        engine,
        bypasses_row_level_security=state.bypasses_rls,
        distributed=state.distributed,
        routines=routines,
    )


async def _installed_routines(engine: AsyncEngine) -> Routines:
    """The hot statements' routines in the database (cortex._db.routines), found once at connect."""
    with translate_errors():
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            if not isinstance(driver, asyncpg.Connection):
                return {}
            return await _routines.available(driver)


def _within(bound: Scope, path: str | Scope | None, field: str = "path") -> Scope:
    """``path`` (default: ``bound``), which must be ``bound`` or beneath it.

    Raises:
        InvalidScope: ``path`` is malformed.
        ScopeViolation: ``path`` is above or beside ``bound``.
    """
    if path is None:
        return bound
    if isinstance(path, str):
        path = Scope.parse(path)
    if not bound.contains(path):
        raise ScopeViolation(f"{field}: {path} is not within the current scope {bound}")
    return path


def _parse_session_id(session_id: str, field: str = "session_id") -> uuid.UUID:
    # Validated by the boundary, whose parse is cached: this only looks it up.
    try:
        return session_uuid(session_id)
    except InvalidInput as exc:  # a Session's id is checked here, not by the boundary
        raise InvalidInput(f"{field}: {str(exc).removeprefix('id: ')}") from None


# Model arguments must be instances (a dict is a wrong type); each is validated
# again all the same (see cortex.models._Model, revalidate_instances).
Filter = Annotated[ListFilter | None, BeforeValidator(instance_of(ListFilter, none=True))]
APolicy = Annotated[
    RetentionPolicy | None, BeforeValidator(instance_of(RetentionPolicy, none=True))
]
ACursor = Annotated[SessionCursor | None, BeforeValidator(instance_of(SessionCursor, none=True))]
AMessage = Annotated[NewMessage, BeforeValidator(instance_of(NewMessage))]
ASession = Annotated[Session, BeforeValidator(instance_of(Session))]
Messages = Annotated[Sequence[AMessage], Field(min_length=1, max_length=MAX_APPEND_BATCH)]


class Store:
    """The session store. Every method acts inside ``current_scope()``.

    Visibility: a session is visible when its scope is the current scope or
    beneath it. Nothing outside is ever read, written or hinted at.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        bypasses_row_level_security: bool = False,
        distributed: bool = False,
        routines: Routines | None = None,
    ) -> None:
        self._engine = engine
        self._bypasses_rls = bypasses_row_level_security
        self._distributed = distributed
        # One-round-trip routines of the hot statements (cortex._db.routines); shared
        # by every call, and one found dropped is removed (cortex._db.executor.Tx).
        self._routines: Routines = routines or {}
        # Defaults this store resolved (scope, agent), newest last: most
        # likely still there, so resolving one again looks before it inserts.
        self._known_defaults: OrderedDict[tuple[str, str], None] = OrderedDict()

    @property
    def routines(self) -> int:
        """How many hot statement shapes run as one-round-trip routines (0: none installed).

        ``cortex db upgrade`` installs them; a store connected to a database
        without them runs every call in a transaction of three round trips.
        """
        return len(self._routines)

    @property
    def engine(self) -> AsyncEngine:
        """The underlying SQLAlchemy engine (for health checks and tests)."""
        return self._engine

    @property
    def bypasses_row_level_security(self) -> bool:
        """Whether the login role is a superuser or BYPASSRLS: the database's wall is then off.

        ``connect()`` logs a warning when it is (logger ``cortex``).
        """
        return self._bypasses_rls

    @property
    def distributed(self) -> bool:
        """Whether the database is a Citus coordinator with cortex's tables distributed.

        Learnt by ``connect()``; it picks the search form Citus can route
        (docs/citus.md).
        """
        return self._distributed

    async def _run(
        self,
        scope: Scope,
        body: Callable[[Tx], Awaitable[T]],
        *,
        flt: ListFilter | None = None,
        single: bool = False,
    ) -> T:
        """Run ``body`` in a transaction bound to ``scope``.

        ``single``: the body writes with one statement at most, so each of
        its statements may be a transaction of its own, run through its
        routine in one round trip (when routines are installed).
        """
        # A search is planned for its own term each time (see cortex._db.transaction.begin_sql).
        custom_plans = flt is not None and bool(flt.search)
        routines = self._routines if single and self._routines else None
        return await run_transaction(
            self._engine, scope, body, custom_plans=custom_plans, routines=routines
        )

    # --- sessions -------------------------------------------------------------

    @boundary
    async def create_session(
        self,
        agent_id: AgentId,
        *,
        title: Title = "",
        metadata: Metadata | None = None,
        is_default: Flag = False,
        session_id: SessionId | None = None,
        key: SessionKey | None = None,
        data: Data | None = None,
        scope_data: ScopeData | None = None,
    ) -> Session:
        """Create a session at exactly the current scope.

        Args:
            agent_id: opaque agent id, 1-128 printable characters, no whitespace.
            title: up to 1,000 characters.
            metadata: a JSON object of at most 64 KiB, stored verbatim.
            is_default: make it the default of (agent, scope); refused if one exists.
            session_id: a caller-chosen ``ses_…`` id. Retrying a create whose
                reply was lost is safe: if the id holds the session this call
                would create (same agent, exact scope, title, metadata, key,
                state, scope_data and default flag), that session is
                returned and nothing is written.
            key: the host's own name for the session (an agent framework's
                session id): any string, trimmed, 1-512 characters, no NUL;
                unique per (agent, exact scope). Find it again with
                :meth:`get_session_by_key` or :meth:`resolve_session`.
            data: the session's initial state document (top-level keys, any
                JSON values, at most 1 MiB as stored).
            scope_data: state deltas for the current scope or its ancestors
                (scope path to delta), merged into those scopes' documents
                in this transaction; every session beneath such a scope
                sees them.

        Raises:
            InvalidInput: a limit is broken, or a scope in ``scope_data`` is
                not the current scope or an ancestor of it; nothing is written.
            Conflict: the id is taken in this tenant by another session (the
                error says only that), a default already exists, or (agent,
                scope) has a session with this key already.
        """
        scope = current_scope()
        metadata_json = encode_json(metadata or {}, MAX_JSON_BYTES)
        sid = new_uuid() if session_id is None else _parse_session_id(session_id)
        data_json, deltas = _data_json(data), _scope_deltas(scope_data)

        async def body(conn: Tx) -> Session:
            return await session_calls.insert_session(
                conn,
                scope,
                session_id=sid,
                agent_id=agent_id,
                title=title,
                metadata_json=metadata_json,
                is_default=is_default,
                caller_chosen_id=session_id is not None,
                key=key,
                data_json=data_json,
                scope_deltas=deltas,
                distributed=self._distributed,
            )

        # One INSERT, unless the id is the caller's (lock, lookup, insert) or
        # scope state is merged too.
        single = session_id is None and deltas is None
        return await self._run(scope, body, single=single)

    @boundary
    async def get_session_by_key(self, agent_id: AgentId, key: SessionKey) -> Session:
        """The session of ``agent_id`` keyed ``key`` (trimmed) at exactly the current scope.

        Raises:
            NotFound: no such session at this scope.
            InvalidInput: a malformed agent id or key.
        """
        scope = current_scope()

        async def body(conn: Tx) -> Session:
            session = await session_calls.select_by_key(conn, scope, agent_id, key)
            if session is None:
                raise NotFound(f"no session of agent {agent_id!r} keyed {key!r} in {scope}")
            return session

        return await self._run(scope, body, single=True)

    @boundary
    async def get_scope_data(self, scope: str | None = None) -> dict[str, Any]:
        """The state document stored at exactly ``scope`` (default: the current scope).

        ``scope`` must be in the current scope's line: the current scope, one
        of its ancestors (whose state every session here sees) or a scope
        beneath it. A scope with no document reads as ``{}``.

        Raises:
            InvalidInput: ``scope`` is malformed or outside that line.
        """
        bound = current_scope()
        target = bound if scope is None else Scope.parse(scope)
        if not (target.contains(bound) or bound.contains(target)):
            raise InvalidInput(f"scope: {target} is neither above nor beneath {bound}")
        return await self._run(
            bound, lambda conn: session_calls.select_scope_data(conn, bound, target)
        )

    @boundary
    async def update_scope_data(
        self, patch: StatePatch, *, scope: str | Scope | None = None, replace: Flag = False
    ) -> dict[str, Any]:
        """Change the state document stored at exactly ``scope`` (default: the current scope).

        ``patch`` is a JSON merge patch (RFC 7386) applied to the document:
        a key whose value is ``None`` is removed, an object value is merged
        into the object stored under its key the same way, any other value
        replaces the stored one. With ``replace``, the document becomes
        ``patch`` as given (``None`` values are stored as null). Every
        session at ``scope`` and beneath it sees the result when it is read.
        Concurrent calls on one scope apply one after the other (the
        document's row lock), each on the other's result. Returns the
        document as :meth:`get_scope_data` then reads it.

        Unlike reading, writing never reaches above the current scope: a
        scope's state is shared by every session beneath it.

        Raises:
            ScopeViolation: ``scope`` is not the current scope or beneath it.
            InvalidInput: a key is empty, holds NUL or begins ``__cortex_``
                (cortex's own keys, kept as they are), a value is not JSON,
                or the document would exceed 1 MiB as stored; nothing is
                written.
        """
        bound = current_scope()
        target = _within(bound, scope, "scope")
        if replace:
            try:
                encode_data(patch)  # the document to be, before any SQL
            except ValueError as exc:
                raise InvalidInput(f"patch: {exc}") from None
        return await self._run(
            bound,
            lambda conn: scope_state_calls.update_document(
                conn, bound, target, patch, replace=replace
            ),
        )

    @boundary
    async def get_session(self, session_id: SessionId) -> Session:
        """The session, if visible from the current scope.

        Raises:
            NotFound: missing, or outside the current scope.
            InvalidInput: a malformed id.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(
            scope, lambda conn: session_calls.select_session(conn, scope, sid), single=True
        )

    @boundary
    async def update_session(self, session: ASession) -> Session:
        """Write ``session.title`` and ``session.metadata``; every other field is ignored.

        Counters, scope, ``is_default`` and ``backfilled_by`` cannot change
        through this call. ``updated_at`` moves. Any session this store
        returned can be written back unchanged: its metadata decodes to the
        value that was stored and serialises to the same text.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: a limit is broken; nothing is written.
        """
        scope, sid = current_scope(), _parse_session_id(session.id, "session.id")
        metadata_json = encode_json(session.metadata, MAX_JSON_BYTES)
        return await self._run(
            scope,
            lambda conn: session_calls.update_session(
                conn, scope, sid, title=session.title, metadata_json=metadata_json
            ),
        )

    @boundary
    async def delete_session(self, session_id: SessionId) -> None:
        """Delete a visible session with its messages.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        await self._run(scope, lambda conn: session_calls.delete_session(conn, scope, sid))

    @boundary
    async def list_sessions(self, filter: Filter = None) -> list[Session]:
        """One page of visible sessions, newest activity first (then id).

        Raises:
            InvalidInput: the filter breaks a limit.
        """
        scope, flt = current_scope(), filter or ListFilter()
        return await self._run(
            scope,
            lambda conn: session_calls.select_page(
                conn,
                scope,
                flt,
                limit=flt.page_size,
                offset=flt.offset,
                distributed=self._distributed,
            ),
            flt=flt,
            single=True,
        )

    @boundary
    async def list_sessions_page(
        self, filter: Filter = None, *, cursor: ACursor = None
    ) -> SessionPage:
        """One page of visible sessions in list order, and the cursor of the next page.

        Keyset paging on (``updated_at``, ``id``), each page its own
        statement (one round trip with routines installed), so a walk may
        span requests and transactions. Between pages, a session created
        or written (moved to the front of the order) is not returned by
        the later pages; no session is ever returned twice, and every
        session that matched when the first page was read and was not
        written since is returned exactly once. ``limit`` is the page size
        and may change between pages. ``next_cursor`` is None on the last
        page. A cursor continues the listing it came from: the same scope
        and the same filter (``limit`` aside).

        Raises:
            InvalidInput: ``offset`` is not 0, the filter breaks a limit,
                or ``cursor`` belongs to another scope or filter.
        """
        scope, flt = current_scope(), filter or ListFilter()
        if flt.offset:
            raise InvalidInput("offset: list_sessions_page pages with a cursor; offset must be 0")
        listing = session_calls.listing_digest(scope, flt)
        after = None
        if cursor is not None:
            if cursor.listing != listing:
                raise InvalidInput("cursor: it continues another listing (another scope or filter)")
            after = (cursor.updated_at, _parse_session_id(cursor.id, "cursor.id"))
        size = flt.page_size
        # One row past the page tells whether there is a next one.
        rows = await self._run(
            scope,
            lambda conn: session_calls.select_page(
                conn, scope, flt, limit=size + 1, after=after, distributed=self._distributed
            ),
            flt=flt,
            single=True,
        )
        items = rows[:size]
        next_cursor = None
        if len(rows) > size:
            last = items[-1]
            next_cursor = SessionCursor(updated_at=last.updated_at, id=last.id, listing=listing)
        return SessionPage(items=items, next_cursor=next_cursor)

    @boundary
    async def count_sessions(self, filter: Filter = None) -> int:
        """How many sessions ``list_sessions`` would return without limit and offset."""
        scope, flt = current_scope(), filter or ListFilter()
        return await self._run(
            scope,
            lambda conn: session_calls.count_sessions(
                conn, scope, flt, distributed=self._distributed
            ),
            flt=flt,
            single=True,
        )

    @boundary
    def iter_sessions(self, filter: Filter = None) -> AsyncGenerator[Session, None]:
        """Every session that matched when the walk began, each exactly once, in list order.

        The walk reads every page in one ``REPEATABLE READ READ ONLY``
        transaction, so all pages see the same snapshot: sessions that get
        messages, are updated or are deleted during the walk are still
        yielded once, where they stood when it began (with the values they
        had then); sessions created during the walk are not yielded. Pages
        follow a keyset cursor on (updated_at, id), one index scan each, so
        a page costs the same however deep the walk goes; ``limit`` is the
        page size.

        The walk holds one pooled connection and one open (read-only)
        transaction from the first page until it is exhausted, closed
        (``aclose()``, ``break`` out of ``async for`` in an
        ``aclosing()`` block) or garbage collected. A slow consumer keeps
        that transaction open: it holds back vacuum's horizon, and a
        server-side ``idle_in_transaction_session_timeout`` ends the walk
        with DatabaseUnavailable.

        Raises:
            InvalidInput: ``offset`` is not 0, or the filter breaks a limit
                (raised by this call, before iteration).
        """
        flt = filter or ListFilter()
        if flt.offset:
            raise InvalidInput("offset: iter_sessions pages with a cursor; offset must be 0")
        return self._walk(flt)

    async def _walk(self, flt: ListFilter) -> AsyncGenerator[Session, None]:
        scope = current_scope()
        after: tuple[Any, Any] | None = None
        async with read_snapshot(self._engine, scope, custom_plans=bool(flt.search)) as snap:
            while True:
                batch = await snap.run(
                    partial(
                        session_calls.select_page,
                        scope=scope,
                        flt=flt,
                        limit=flt.page_size,
                        after=after,
                        distributed=self._distributed,
                    )
                )
                for session in batch:
                    yield session
                if len(batch) < flt.page_size:
                    return
                last = batch[-1]
                after = (last.updated_at, _parse_session_id(last.id))

    @boundary
    async def resolve_session(
        self,
        agent_id: AgentId,
        session_id: SessionId | None = None,
        *,
        key: SessionKey | None = None,
    ) -> Session:
        """The session a run of ``agent_id`` uses.

        With ``session_id``: that session, which must be visible and belong to
        ``agent_id``. With ``key``: the session of (agent, current exact
        scope) with that key, created if absent. With neither: the default
        session of (agent, current exact scope), created if absent. Concurrent
        callers resolving one key (or the default) all get the same session.

        Raises:
            NotFound: the named session is not visible or belongs to another agent.
            InvalidInput: both ``session_id`` and ``key`` are given.
        """
        scope = current_scope()
        if key is not None:
            if session_id is not None:
                raise InvalidInput("key: give a session id or a key, not both")
            return await self._run(
                scope,
                lambda conn: session_calls.resolve_key(
                    conn, scope, agent_id, key, distributed=self._distributed
                ),
                single=True,
            )
        if session_id is None:
            pair = (str(scope), agent_id)
            found = await self._run(
                scope,
                lambda conn: session_calls.resolve_default(
                    conn,
                    scope,
                    agent_id,
                    distributed=self._distributed,
                    known=pair in self._known_defaults,
                ),
                single=True,
            )
            self._known_defaults[pair] = None
            self._known_defaults.move_to_end(pair)
            if len(self._known_defaults) > _KNOWN_DEFAULTS:
                self._known_defaults.popitem(last=False)
            return found
        sid = _parse_session_id(session_id)
        session = await self._run(
            scope, lambda conn: session_calls.select_session(conn, scope, sid), single=True
        )
        if session.agent_id != agent_id:
            raise not_found(sid)
        return session

    @boundary
    async def set_default_session(self, session_id: SessionId) -> Session:
        """Make the session the default of its (agent, scope), atomically.

        The previous default is demoted in the same transaction: at no moment
        are there two defaults or, for a reader, none.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(scope, lambda conn: session_calls.set_default(conn, scope, sid))

    # --- messages -------------------------------------------------------------

    @boundary
    async def append_messages(
        self,
        session_id: SessionId,
        messages: Messages,
        *,
        data: Data | None = None,
        scope_data: ScopeData | None = None,
        expected_count: Seq | None = None,
    ) -> list[Message]:
        """Append messages in one transaction: all rows or none.

        State travels with the messages that change it: ``data`` is a delta
        merged key by key into the session's state document (a key's value
        is replaced whole; ``None`` is stored as null, not a deletion), and
        ``scope_data`` deltas (scope path to delta) into the documents of the
        session's scope or its ancestors, all in this transaction. With
        ``expected_count``, the append (and its deltas) happen only if the
        session still holds exactly that many messages: an optimistic check
        for writers that must not append to a conversation that moved on.

        ``message_count`` rises by their number, ``last_message`` becomes a
        preview of the last one, ``updated_at`` moves. Concurrent appends to one
        session get distinct, gap-free ``seq``s; the count always equals the rows.

        Safe retries: give every message an id (``NewMessage(..., id="msg_…")``,
        e.g. ``cortex.ids.format_id("msg", cortex.ids.new_uuid())``) and retry
        the same batch after an ambiguous failure (DatabaseUnavailable,
        OperationTimeout, a cancellation): if the first attempt committed,
        the retry returns the stored messages and writes nothing.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: no messages, more than 1,000, more than
                MAX_APPEND_BYTES (64 MiB) in all, one id twice, or a limit is broken.
            Conflict: a message id is stored already, in another session or
                with other content, or only part of the batch is stored; or
                the session no longer holds ``expected_count`` messages.
            InvalidInput: a delta would grow a state document past 1 MiB, or
                ``scope_data`` names a scope off the session's path.
        """
        return await self._append(session_id, list(messages), data, scope_data, expected_count)

    async def _append(
        self,
        session_id: SessionId,
        messages: list[NewMessage],
        data: Data | None,
        scope_data: ScopeData | None,
        expected_count: Seq | None,
    ) -> list[Message]:
        """:meth:`append_messages` past the boundary's validation (its arguments are checked)."""
        scope, sid = current_scope(), _parse_session_id(session_id)
        batch = message_calls.encode_batch(messages)
        data_delta, deltas = _data_json(data), _scope_deltas(scope_data)
        return await self._run(
            scope,
            lambda conn: message_calls.append_messages(
                conn,
                scope,
                sid,
                batch,
                data_delta=data_delta,
                scope_deltas=deltas,
                expected_count=expected_count,
                distributed=self._distributed,
            ),
            # On Citus a one-message append is one routine too (two router
            # statements inside it); a larger batch is a transaction there.
            single=deltas is None
            and message_calls.appends_in_one_statement(batch)
            and (not self._distributed or len(batch.messages) == 1),
        )

    @boundary
    async def append_message(self, session_id: SessionId, message: AMessage) -> Message:
        """Append one message; see :meth:`append_messages`."""
        # Validated once, here: append_messages' boundary would check it again.
        (stored,) = await self._append(session_id, [message], None, None, None)
        return stored

    @boundary
    async def list_messages(
        self,
        session_id: SessionId,
        *,
        after_seq: Seq = 0,
        limit: MessageLimit = DEFAULT_MESSAGE_LIMIT,
        since: Since = None,
    ) -> list[Message]:
        """Messages with ``seq > after_seq``, in ``seq`` order, at most ``limit`` (1-1000; 0: 100).

        With ``since`` (a tz-aware datetime): only messages appended after
        it (``created_at > since``); ``created_at`` never decreases along
        ``seq``, so these are the conversation's tail.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``after_seq`` outside 0 to 2**31 - 1, ``limit`` out
                of range, or ``since`` naive.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        if since is not None and since.utcoffset() is None:
            raise InvalidInput("since: a tz-aware datetime, got a naive one")
        return await self._run(
            scope,
            lambda conn: message_calls.list_messages(
                conn, scope, sid, after_seq=after_seq, limit=limit, since=since
            ),
            single=True,
        )

    @boundary
    async def pop_message(self, session_id: SessionId) -> Message | None:
        """Remove and return the session's last message (None if it has none).

        One transaction under the session's row lock: ``message_count``
        falls by one, ``last_message`` previews the new last message,
        ``seq`` stays gap-free, ``updated_at`` moves. Concurrent pops each
        remove a different message. Popping a question removes its pending
        input; popping an answer re-opens the question it answered.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(
            scope,
            lambda conn: message_calls.pop_message(conn, scope, sid, distributed=self._distributed),
        )

    @boundary
    async def clear_messages(self, session_id: SessionId) -> Session:
        """Remove every message of the session; returns it, emptied.

        One transaction under the session's row lock: ``message_count`` and
        ``pending_count`` become 0, ``last_message`` empty, ``updated_at``
        moves; the next append is ``seq`` 1. State documents are kept.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(scope, lambda conn: message_calls.clear_messages(conn, scope, sid))

    @boundary
    async def fork_session(
        self,
        session_id: SessionId,
        *,
        through_seq: Seq | None = None,
        title: Title | None = None,
    ) -> Session:
        """A new session holding copies of the session's messages 1 to ``through_seq`` (default: all).

        The fork is made in the source's scope, for its agent, with its
        metadata, its own state document and (unless ``title`` is given)
        its title; it has no key, is not the default and carries no marker.
        Each copied message keeps its seq, content, fields and
        ``created_at`` under a new id. Its counters are exact:
        ``message_count == through_seq``, ``last_message`` previews message
        ``through_seq``, and the questions of the copied messages that no
        copied message answers are pending in the fork (answers given later
        in the source are not copied). ``forked_from`` names the source and
        ``through_seq``. ``through_seq=0`` makes an empty fork.

        One transaction. Appends to the source go on meanwhile, and the fork
        is a prefix the source held: a forked whole session is its messages
        when the fork read its count. An aborted session may be forked; the
        fork is not aborted.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``through_seq`` is negative or past the last message,
                or ``title`` breaks a limit; nothing is written.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(
            scope,
            lambda conn: message_calls.fork_session(
                conn, scope, sid, through_seq=through_seq, title=title
            ),
        )

    @boundary
    async def rewind_session(self, session_id: SessionId, *, to_seq: Seq) -> Session:
        """Delete the session's messages after ``to_seq``; returns the session as it is then.

        One transaction under the session's row lock, like :meth:`pop_message`:
        ``message_count`` becomes ``to_seq``, ``last_message`` previews
        message ``to_seq`` (empty for 0), ``updated_at`` moves. A question
        asked after ``to_seq`` is gone; one asked up to it and answered after
        it is pending again. State documents and markers stay as they are.
        Rewinding to the current count changes nothing.

        ``seq`` stays gap-free: the next append is ``to_seq + 1``, a position
        the removed messages held (as after a pop), under a new message id
        and a later ``created_at``. A reader following the session by
        position keeps the id of the last message it read: if
        ``list_messages(after_seq=seq - 1)`` no longer starts with that id,
        the transcript was rewound past it (docs/guides/messages-and-state.md).

        Raises:
            NotFound: the session is not visible.
            SessionAborted: the session was aborted.
            InvalidInput: ``to_seq`` is negative or past the last message;
                nothing is written.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(
            scope, lambda conn: message_calls.rewind_session(conn, scope, sid, to_seq=to_seq)
        )

    @boundary
    async def recent_messages(
        self,
        session_id: SessionId,
        *,
        limit: MessageLimit = DEFAULT_MESSAGE_LIMIT,
        before_seq: BeforeSeq | None = None,
    ) -> list[Message]:
        """The newest ``limit`` messages (1-1000; 0: 100), oldest first: an agent's context window.

        With ``before_seq``, the newest ``limit`` messages older than that
        position, so ``before_seq=page[0].seq`` pages backwards until an empty
        page. Each page is one index scan of ``limit`` rows, whatever the
        conversation's length.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``limit`` out of range, or ``before_seq`` not 1 to 2**31-1.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        bound = SEQ_END if before_seq is None else before_seq
        return await self._run(
            scope,
            lambda conn: message_calls.recent_messages(
                conn, scope, sid, before_seq=bound, limit=limit
            ),
            single=True,
        )

    @boundary
    async def get_session_with_messages(
        self, session_id: SessionId, *, limit: MessageLimit = DEFAULT_MESSAGE_LIMIT
    ) -> SessionHistory:
        """The session and its newest ``limit`` messages (1-1000; 0: 100, oldest first), in one read.

        Both come from one snapshot: ``session.trimmed_count +
        session.message_count`` (``message_count`` alone unless retention
        trimmed the session) equals the ``seq`` of the last message
        returned, even while appends commit.
        Unpack it as ``session, messages = await store.get_session_with_messages(id)``.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``limit`` out of range (1-1000).
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(
            scope,
            lambda conn: message_calls.select_session_with_messages(conn, scope, sid, limit=limit),
            single=True,
        )

    # --- a scope's lifecycle ------------------------------------------------------

    @boundary
    async def erase_scope(
        self,
        path: str | Scope | None = None,
        *,
        dry_run: Flag = False,
        on_batch: Callable[[ErasureReport], None] | None = None,
    ) -> ErasureReport:
        """Remove everything at and beneath ``path`` (default: the current scope).

        Every session there with its messages, pending inputs and markers,
        markers parked there, and the scope state documents at and beneath
        it. Whole segments only: erasing ``acme/u1`` never touches
        ``acme/u10``. With ``dry_run``, nothing is written: the report
        counts what would be removed now.

        Online: the work goes in batches, each its own short transaction
        (at most 500 sessions holding 10,000 messages, one session at least),
        so no statement holds its locks long and calls in other scopes
        never wait on it. A durable receipt (:class:`cortex.Erasure`, see
        :meth:`list_erasures`) is written when the erasure begins and
        updated with each batch; it holds when, which scope and how much,
        never content.

        Resumable and idempotent: an erasure cut short (the process killed,
        the task cancelled) leaves its receipt ``running``, and the next
        call for the same scope finishes that erasure (its receipt counts
        both calls' work); erasing an empty scope again records an empty
        erasure. ``on_batch`` is told this call's counts after each batch.

        Concurrency: what was committed beneath the scope before the call
        began is gone when it returns. A session created after the call
        began (by the database's clock) survives it, with its messages;
        one created while the call runs may go or stay. An append to a
        session being removed waits for its batch, then finds it gone
        (NotFound). Scope state documents go whenever they were written: a
        document merges earlier deltas into itself.

        Raises:
            ScopeViolation: ``path`` is not the current scope or beneath it.
            InvalidInput: ``path`` is malformed.
        """
        bound = current_scope()
        target = _within(bound, path)
        if dry_run:
            return await self._run(bound, lambda conn: erasure_calls.count(conn, target))
        begun = await self._run(bound, lambda conn: erasure_calls.begin(conn, target))
        totals = dict.fromkeys(
            ("sessions", "messages", "pending_inputs", "markers", "scope_documents"), 0
        )

        def add(removed: erasure_calls.Removed) -> None:
            for name in totals:
                totals[name] += getattr(removed, name)
            if on_batch is not None:
                on_batch(ErasureReport(scope=target, receipt=removed.receipt, **totals))

        while True:
            removed = await self._run(
                bound, lambda conn: erasure_calls.erase_batch(conn, target, begun)
            )
            if removed.sessions == 0:
                break
            add(removed)
        for kind in ("markers", "unsessioned", "scope_documents"):
            while True:
                rest = partial(erasure_calls.erase_rest, target=target, begun=begun, kind=kind)
                removed = await self._run(bound, rest)
                if removed.rows == 0:
                    break
                add(removed)
        receipt = await self._run(bound, lambda conn: erasure_calls.finish(conn, target, begun))
        return ErasureReport(scope=target, receipt=receipt, **totals)

    @boundary
    async def list_erasures(self, path: str | Scope | None = None) -> list[Erasure]:
        """The receipts of erasures at or beneath ``path`` (default: the current scope), newest first.

        Raises:
            ScopeViolation: ``path`` is not the current scope or beneath it.
        """
        bound = current_scope()
        target = _within(bound, path)
        return await self._run(bound, lambda conn: erasure_calls.list_receipts(conn, target))

    @boundary
    def export_scope(self, path: str | Scope | None = None) -> AsyncGenerator[dict[str, Any], None]:
        """Every record of ``path``'s subtree (default: the current scope), from one snapshot.

        The records (docs/reference/export-format.md) are dicts of JSON
        values, one per line in JSON Lines: a header (format, version, root
        scope, the subtree's session and message counts), the scope state
        documents, each session followed by its messages and its pending
        inputs, the markers (parked ones too), and an end record counting
        each kind. Every stored column is carried (ids, positions,
        counters, defaults, keys, markers, state, digests, lineage, created
        and updated times), JSON columns as their text.

        One ``REPEATABLE READ READ ONLY`` transaction holds the snapshot,
        read in keyset pages, so memory stays flat whatever the subtree's
        size; writes during the export are not in it. As with
        :meth:`iter_sessions`, the walk holds one pooled connection and one
        open transaction until it is exhausted or closed.

        Raises:
            ScopeViolation: ``path`` is not the current scope or beneath it
                (raised by this call, before iteration).
        """
        bound = current_scope()
        return self._export(bound, _within(bound, path))

    async def _export(self, bound: Scope, target: Scope) -> AsyncGenerator[dict[str, Any], None]:
        async with read_snapshot(self._engine, bound) as snap:
            async for record in transfer_calls.export_records(snap, target):
                yield record

    @boundary
    async def import_scope(
        self,
        records: Any,
        *,
        into: str | Scope | None = None,
        on_records: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Restore an export (:meth:`export_scope`'s records, in order), in one transaction.

        Every row is written as exported: ids, positions, counters,
        defaults, keys, markers, state documents, created and updated
        times. With ``into``, the export's root scope becomes ``into`` and
        everything beneath it keeps its place relative to it (ids are kept:
        importing into the tenant the export came from while its source
        still exists is Conflict). ``records``: an iterable or async
        iterable of records, read once, as they come (memory stays flat).
        ``on_records`` is told, now and then, how many more were taken.

        A row whose key is stored already is compared: the same row is left
        as it is (importing an export twice changes nothing and reports it
        ``unchanged``); another one is Conflict, and nothing is written.

        Raises:
            ScopeViolation: ``into`` (or, without it, the export's root) is
                not the current scope or beneath it.
            InvalidInput: a record is malformed or out of place, a scope lies
                outside the export's root or would be deeper than 8, or the
                export is cut short (no end record); nothing is written.
            Conflict: an id, key, default or position holds something else;
                nothing is written.
        """
        bound = current_scope()
        target = None if into is None else _within(bound, into, "into")
        if isinstance(records, str | bytes | dict) or not isinstance(
            records, Iterable | AsyncIterable
        ):
            raise InvalidInput("records: an iterable of export records")
        stream = aiter(transfer_calls.records_of(records))
        first = await anext(stream, None)
        if first is None:
            raise InvalidInput("records: empty; an export starts with its header")
        header = transfer_calls.read_header(first)
        if target is None:
            target = _within(bound, header.root, "root")
        attempts = 0

        async def body(conn: Tx) -> ImportReport:
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                # The records were read once: a transaction run again has none.
                raise Conflict(
                    "the import met a concurrent write and was rolled back; nothing was"
                    " written: run it again"
                )
            importer = transfer_calls.Importer(conn, header, target, on_records)
            async for record in stream:
                await importer.add(record)
            return await importer.finish()

        return await self._run(bound, body)

    # --- retention --------------------------------------------------------------

    @boundary
    async def set_retention_policy(self, policy: APolicy, path: str | Scope | None = None) -> None:
        """Set the retention policy of ``path`` (default: the current scope); None removes it.

        It governs every session at ``path`` and beneath it that no nearer
        policy governs: a session follows the nearest policy at or above its
        own scope, as a whole. ``RetentionPolicy()`` (every field None) keeps
        everything beneath ``path`` whatever a policy above says. Nothing is
        removed until :meth:`apply_retention` runs.

        Raises:
            ScopeViolation: ``path`` is not the current scope or beneath it.
            InvalidInput: ``policy`` or ``path`` is malformed (nothing is written).
        """
        bound = current_scope()
        target = _within(bound, path)
        await self._run(bound, lambda conn: retention_calls.set_policy(conn, target, policy))

    @boundary
    async def get_retention_policy(self, path: str | Scope | None = None) -> RetentionPolicy | None:
        """The policy in force at ``path`` (default: the current scope): the nearest at or above it.

        None: no policy governs it (its sessions are kept).

        Raises:
            ScopeViolation: ``path`` is not the current scope or beneath it.
        """
        bound = current_scope()
        target = _within(bound, path)
        return await self._run(bound, lambda conn: retention_calls.get_policy(conn, target))

    @boundary
    async def apply_retention(
        self,
        *,
        dry_run: Flag = False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> RetentionReport:
        """Carry out the retention policies over the current scope's sessions and those beneath it.

        Each session follows the nearest policy at or above its own scope
        (:meth:`set_retention_policy`); one no policy governs is kept.

        - **Idle**: a session with no append and no update for longer than
          its policy's ``delete_idle_after`` (``updated_at`` older than the
          run's start, by the database's clock, less that period) is erased
          as :meth:`erase_scope` erases: with its messages, pending inputs
          and markers. One waiting for an answer (paused) is kept unless
          its policy has ``include_paused``.
        - **Long**: a session holding more than ``keep_last_messages`` loses
          its oldest messages, down to that many; never a pending question,
          nor anything after it (the kept messages stay one unbroken run).
          The kept ones keep their ``seq`` (cursors stay valid);
          ``message_count`` counts them, ``trimmed_count`` the ones gone;
          ``updated_at`` and ``last_message`` stay.

        Online: candidates are read in pages, and removed in batches of
        their own short transactions (at most 500 sessions holding 10,000
        messages), each checking its sessions again under their row locks:
        a session appended to meanwhile is not erased, a trim waits for an
        append in flight, and two runs at once never remove a row twice (the
        reports add up to what one run would remove). Idempotent: a second
        run removes nothing more. With ``dry_run`` nothing is written and
        the report counts what a run would remove now.
        ``on_progress(examined, total)`` is told, after each page, how many
        of the run's candidates it has looked at.

        Raises:
            DatabaseError: the database failed; the batches before it committed.
        """
        bound = current_scope()
        policies = await self._run(bound, lambda conn: retention_calls.load_policies(conn, bound))
        started = await self._run(bound, retention_calls.clock)
        plan = retention_calls.Plan.of(policies, started)
        total = retention_calls.Removed()
        if not plan.empty:
            await self._retain(bound, policies, plan, total, dry_run, on_progress)
        return RetentionReport(
            scope=bound,
            dry_run=dry_run,
            sessions=total.sessions,
            messages=total.messages,
            pending_inputs=total.pending_inputs,
            markers=total.markers,
            trimmed_sessions=total.trimmed_sessions,
            trimmed_messages=total.trimmed_messages,
        )

    async def _retain(
        self,
        bound: Scope,
        policies: retention_calls.Policies,
        plan: retention_calls.Plan,
        total: retention_calls.Removed,
        dry_run: bool,
        on_progress: Callable[[int, int], None] | None,
    ) -> None:
        """:meth:`apply_retention`'s walk: each page of candidates, then its batches."""
        calls = retention_calls
        expected = 0
        if on_progress is not None:
            expected = await self._run(
                bound, lambda conn: calls.count_candidates(conn, bound, plan)
            )
        examined = 0
        after: tuple[datetime, uuid.UUID] | None = None
        while True:
            page = await self._run(
                bound, partial(calls.candidates, target=bound, plan=plan, after=after)
            )
            erase: dict[str, list[calls.Candidate]] = {}
            trim: dict[str, list[uuid.UUID]] = {}
            for candidate in page:
                governing = policies.governing(candidate.scope)
                if governing is None:
                    continue
                path, policy = governing
                idle = policy.delete_idle_after
                if (
                    idle is not None
                    and candidate.updated_at < plan.started - idle
                    and (policy.include_paused or not candidate.paused)
                ):
                    erase.setdefault(path, []).append(candidate)
                elif (
                    policy.keep_last_messages is not None
                    and candidate.message_count > policy.keep_last_messages
                ):
                    trim.setdefault(path, []).append(candidate.id)
            for path, sessions in erase.items():
                for group in calls.erase_groups(sessions):
                    erased = partial(
                        calls.erase_batch,
                        target=bound,
                        ids=[s.id for s in group],
                        policy=policies.by_path[path],
                        started=plan.started,
                        dry_run=dry_run,
                    )
                    total.add(await self._run(bound, erased))
            for path, ids in trim.items():
                todo = ids
                while todo:
                    chunk, todo = todo[: calls.BATCH_SESSIONS], todo[calls.BATCH_SESSIONS :]
                    trimmed = partial(
                        calls.trim_batch,
                        target=bound,
                        ids=chunk,
                        policy=policies.by_path[path],
                        dry_run=dry_run,
                    )
                    removed = await self._run(bound, trimmed)
                    total.add(removed)
                    todo = removed.unfinished + todo
            examined += len(page)
            if on_progress is not None:
                on_progress(examined, max(expected, examined))
            if len(page) < calls.PAGE_SESSIONS:
                return
            after = (page[-1].updated_at, page[-1].id)

    # --- operator surface -------------------------------------------------------

    @boundary
    async def record_console_action(
        self,
        action: ActionKind,
        *,
        subject: Subject,
        session_id: SessionId | None = None,
        outcome: Outcome = "ok",
        detail: ActionDetail | None = None,
    ) -> ConsoleAction:
        """Append one operator action to the audit trail (``console_actions``), in its own transaction.

        Recorded in the session's scope when the current scope sees the
        session, else in the current scope (an action that met NotFound is
        recorded too). ``detail`` holds ids and counts; never put an
        answer's content or a reason's text there. The trail is append-only:
        the application role may not update or delete it.

        Raises:
            InvalidInput: an argument breaks a limit (before any SQL).
        """
        scope = current_scope()
        sid = None if session_id is None else _parse_session_id(session_id)
        detail = detail or {}
        text = json.dumps(detail, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        action_id, where, at = await self._run(
            scope,
            lambda conn: console_calls.record_action(
                conn,
                scope,
                sid,
                subject=subject,
                action=ActionKind(action).value,
                outcome=outcome,
                detail=text,
            ),
        )
        return ConsoleAction(
            id=format_id(ACTION_PREFIX, action_id),
            tenant=scope.tenant,
            scope=Scope.parse(where),
            session_id=session_id,
            subject=subject,
            action=ActionKind(action),
            outcome=outcome,
            detail=detail,
            at=at,
        )

    @boundary
    async def inspect_session(self, session_id: SessionId) -> SessionDetail:
        """The session with its state, every pending input and the marker reasons.

        An aborted session reports no pending inputs.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(scope, lambda conn: operator_calls.inspect(conn, scope, sid))

    @boundary
    async def abort_session(self, session_id: SessionId, reason: Reason) -> Session:
        """Write a durable abort marker (not preemption); pending inputs are cleared.

        Raises:
            NotFound: the session is not visible.
            AlreadyAborted: it was aborted before.
            InvalidInput: ``reason`` breaks a limit.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        return await self._run(scope, lambda conn: operator_calls.abort(conn, scope, sid, reason))

    @boundary
    async def resume(
        self,
        session_id: SessionId,
        interrupt_id: InterruptId,
        response: JsonValue,
        *,
        author: Author = "",
    ) -> Message:
        """Answer a pending input: append a function response, checked in one transaction.

        The appended message has role ``user``, ``author`` and
        ``function_response = FunctionResponse(id=interrupt_id, response=response)``.
        Concurrent resumes of one interrupt: exactly one wins, the others get Conflict.

        Raises:
            NotFound: the session is not visible, or never asked ``interrupt_id``.
            SessionAborted: the session was aborted.
            Conflict: the interrupt was already answered.
            InvalidInput: ``response`` fails the response schema (naming the
                failing path) or breaks a limit.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        answer = NewMessage(
            "user",
            author=author,
            function_response=FunctionResponse(id=interrupt_id, response=response),
        )
        batch = message_calls.encode_batch([answer])

        # The answer is checked against its schemas before the session's row
        # lock is taken, with no transaction open: however long validation
        # takes (bounded by cortex._schemas), it holds nothing anyone waits on.
        schemas = await self._run(
            scope, lambda conn: operator_calls.pending_schemas(conn, scope, sid, interrupt_id)
        )
        operator_calls.check_answer(response, schemas)

        async def body(conn: Tx) -> Message:
            await operator_calls.check_resumable(
                conn, scope, sid, interrupt_id, response, checked=schemas
            )
            (stored,) = await message_calls.append_messages(
                conn, scope, sid, batch, distributed=self._distributed
            )
            return stored

        return await self._run(scope, body)

    @boundary
    async def mark_interrupted(self, session_id: SessionId, reason: Reason) -> None:
        """Mark a turn cut short by a shutdown; re-marking overwrites the reason.

        The session need not exist yet: the marker waits, and shows once a
        session with this id is created in the current scope. Concurrency:
        whatever the interleaving, a marker set on a session that is being
        deleted goes with it, and one set for an id being created shows on
        the new session.

        Raises:
            NotFound: a session with this id exists, but not in this scope or
                beneath it (nothing is written).
            Conflict: no session has this id, and another scope parked a
                marker for it.
            InvalidInput: ``reason`` breaks a limit or the id is malformed.
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        await self._run(
            scope, lambda conn: operator_calls.mark_interrupted(conn, scope, sid, reason)
        )

    @boundary
    async def clear_interrupted(self, session_id: SessionId) -> None:
        """Clear the interrupt marker when the turn completes; a no-op if there is none.

        Raises:
            NotFound: a session with this id exists, but not in this scope or
                beneath it (nothing is changed).
        """
        scope, sid = current_scope(), _parse_session_id(session_id)
        await self._run(scope, lambda conn: operator_calls.clear_interrupted(conn, scope, sid))
