"""``connect()`` and :class:`Store`: the public façade, one transaction per method.

Each method validates its arguments (refusing bad input before any SQL runs),
reads the scope from the context, and runs one function of
``cortex._sessions``/``cortex._messages`` inside
:func:`cortex._db.run_transaction`. The store holds only the engine, so one
instance is safe to share across concurrent tasks: each call checks out its
own connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from cortex import _messages, _operator, _sessions
from cortex._db import run_transaction
from cortex._engine import check_schema, make_engine
from cortex._executor import Tx
from cortex._messages import SessionHistory
from cortex.errors import InvalidInput, NotFound
from cortex.ids import SESSION_PREFIX, new_uuid, parse_id
from cortex.models import (
    DEFAULT_MESSAGE_LIMIT,
    MAX_APPEND_BATCH,
    MAX_AUTHOR_LENGTH,
    MAX_MESSAGE_LIMIT,
    MAX_TITLE_LENGTH,
    FunctionResponse,
    ListFilter,
    Message,
    NewMessage,
    Session,
    SessionDetail,
    check_identifier,
    check_json,
    check_text,
)
from cortex.scope import Scope, current_scope

__all__ = ["Store", "connect"]

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
    engine = make_engine(url, manual_transactions=True, **pool_options)
    try:
        await check_schema(engine)
        yield Store(engine)
    finally:
        await engine.dispose()


def _session_id(value: object) -> Any:
    return parse_id(SESSION_PREFIX, value, field="session_id")


def _filter(flt: ListFilter | None) -> ListFilter:
    if flt is None:
        return ListFilter()
    if not isinstance(flt, ListFilter):
        raise InvalidInput(f"filter: expected a ListFilter, got {type(flt).__name__}")
    return flt


def _check_limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_MESSAGE_LIMIT:
        raise InvalidInput(f"limit: must be 1 to {MAX_MESSAGE_LIMIT}")


def _copy_filter(flt: ListFilter) -> ListFilter:
    """Re-validate, in case the caller built the filter with model_construct."""
    return ListFilter(**flt.model_dump())


class Store:
    """The session store. Every method acts inside ``current_scope()``.

    Visibility: a session is visible when its scope is the current scope or
    beneath it. Nothing outside is ever read, written or hinted at.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @property
    def engine(self) -> AsyncEngine:
        """The underlying SQLAlchemy engine (for health checks and tests)."""
        return self._engine

    async def _run(
        self,
        scope: Scope,
        body: Callable[[Tx], Awaitable[T]],
        *,
        flt: ListFilter | None = None,
    ) -> T:
        # A search is planned for its own term each time (see cortex._db).
        custom_plans = flt is not None and bool(flt.search)
        return await run_transaction(self._engine, scope, body, custom_plans=custom_plans)

    # --- sessions -------------------------------------------------------------

    async def create_session(
        self,
        agent_id: str,
        *,
        title: str = "",
        metadata: dict[str, Any] | None = None,
        is_default: bool = False,
        session_id: str | None = None,
    ) -> Session:
        """Create a session at exactly the current scope.

        Args:
            agent_id: opaque agent id, 1-128 printable characters, no whitespace.
            title: up to 1,000 characters.
            metadata: a JSON object of at most 64 KiB, stored verbatim.
            is_default: make it the default of (agent, scope); refused if one exists.
            session_id: a caller-chosen ``ses_…`` id, for idempotent retries.

        Raises:
            InvalidInput: a limit is broken; nothing is written.
            Conflict: the id is taken in this tenant, or a default already exists.
        """
        scope = current_scope()
        check_identifier(agent_id, "agent_id")
        check_text(title, "title", MAX_TITLE_LENGTH)
        meta = {} if metadata is None else metadata
        if not isinstance(meta, dict):
            raise InvalidInput("metadata: expected a JSON object")
        metadata_json = check_json(meta, "metadata")
        sid = new_uuid() if session_id is None else _session_id(session_id)
        return await self._run(
            scope,
            lambda conn: _sessions.insert_session(
                conn,
                scope,
                session_id=sid,
                agent_id=agent_id,
                title=title,
                metadata_json=metadata_json,
                is_default=bool(is_default),
            ),
        )

    async def get_session(self, session_id: str) -> Session:
        """The session, if visible from the current scope.

        Raises:
            NotFound: missing, or outside the current scope.
            InvalidInput: a malformed id.
        """
        scope, sid = current_scope(), _session_id(session_id)
        return await self._run(scope, lambda conn: _sessions.select_session(conn, scope, sid))

    async def update_session(self, session: Session) -> Session:
        """Write ``session.title`` and ``session.metadata``; every other field is ignored.

        Counters, scope, ``is_default`` and ``backfilled_by`` cannot change
        through this call. ``updated_at`` moves.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: a limit is broken; nothing is written.
        """
        if not isinstance(session, Session):
            raise InvalidInput(f"session: expected a Session, got {type(session).__name__}")
        scope, sid = current_scope(), _session_id(session.id)
        title = check_text(session.title, "title", MAX_TITLE_LENGTH)
        if not isinstance(session.metadata, dict):
            raise InvalidInput("metadata: expected a JSON object")
        metadata_json = check_json(session.metadata, "metadata")
        return await self._run(
            scope,
            lambda conn: _sessions.update_session(
                conn, scope, sid, title=title, metadata_json=metadata_json
            ),
        )

    async def delete_session(self, session_id: str) -> None:
        """Delete a visible session with its messages.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _session_id(session_id)
        await self._run(scope, lambda conn: _sessions.delete_session(conn, scope, sid))

    async def list_sessions(self, filter: ListFilter | None = None) -> list[Session]:
        """One page of visible sessions, newest activity first (then id).

        Raises:
            InvalidInput: the filter breaks a limit.
        """
        scope, flt = current_scope(), _copy_filter(_filter(filter))
        return await self._run(
            scope,
            lambda conn: _sessions.select_page(
                conn, scope, flt, limit=flt.page_size, offset=flt.offset
            ),
            flt=flt,
        )

    async def count_sessions(self, filter: ListFilter | None = None) -> int:
        """How many sessions ``list_sessions`` would return without limit and offset."""
        scope, flt = current_scope(), _copy_filter(_filter(filter))
        return await self._run(
            scope, lambda conn: _sessions.count_sessions(conn, scope, flt), flt=flt
        )

    async def iter_sessions(self, filter: ListFilter | None = None) -> AsyncIterator[Session]:
        """Every matching session in list order, fetched page by page.

        Pages follow a keyset cursor on (updated_at, id), so each page costs
        the same however deep the iteration goes. ``limit`` is the page size.
        Each page is its own short transaction: a session that gets a message
        while the iteration runs moves to the top and is not seen again.

        Raises:
            InvalidInput: ``offset`` is not 0, or the filter breaks a limit.
        """
        scope, flt = current_scope(), _copy_filter(_filter(filter))
        if flt.offset:
            raise InvalidInput("offset: iter_sessions pages with a cursor; offset must be 0")
        after: tuple[Any, Any] | None = None
        while True:
            batch = await self._run(
                scope,
                partial(
                    _sessions.select_page, scope=scope, flt=flt, limit=flt.page_size, after=after
                ),
                flt=flt,
            )
            for session in batch:
                yield session
            if len(batch) < flt.page_size:
                return
            last = batch[-1]
            after = (last.updated_at, _session_id(last.id))

    async def resolve_session(self, agent_id: str, session_id: str | None = None) -> Session:
        """The session a run of ``agent_id`` uses.

        With ``session_id``: that session, which must be visible and belong to
        ``agent_id``. Without: the default session of (agent, current exact
        scope), created if absent; concurrent callers all get the same one.

        Raises:
            NotFound: the named session is not visible or belongs to another agent.
        """
        scope = current_scope()
        check_identifier(agent_id, "agent_id")
        if session_id is None:
            return await self._run(
                scope, lambda conn: _sessions.resolve_default(conn, scope, agent_id)
            )
        sid = _session_id(session_id)
        session = await self._run(scope, lambda conn: _sessions.select_session(conn, scope, sid))
        if session.agent_id != agent_id:
            raise NotFound(f"session {session_id} not found")
        return session

    async def set_default_session(self, session_id: str) -> Session:
        """Make the session the default of its (agent, scope), atomically.

        The previous default is demoted in the same transaction: at no moment
        are there two defaults or, for a reader, none.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _session_id(session_id)
        return await self._run(scope, lambda conn: _sessions.set_default(conn, scope, sid))

    # --- messages -------------------------------------------------------------

    async def append_messages(
        self, session_id: str, messages: Sequence[NewMessage]
    ) -> list[Message]:
        """Append messages in one transaction: all rows or none.

        ``message_count`` rises by their number, ``last_message`` becomes a
        preview of the last one, ``updated_at`` moves. Concurrent appends to one
        session get distinct, gap-free ``seq``s; the count always equals the rows.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: no messages, more than 1,000, or a limit is broken.
        """
        scope, sid = current_scope(), _session_id(session_id)
        batch = list(messages)
        if not 1 <= len(batch) <= MAX_APPEND_BATCH:
            raise InvalidInput(f"messages: 1 to {MAX_APPEND_BATCH} per call, got {len(batch)}")
        for message in batch:
            if not isinstance(message, NewMessage):
                raise InvalidInput(f"messages: expected NewMessage, got {type(message).__name__}")
        # Re-validate: a model built with model_construct skipped its checks.
        batch = [NewMessage(**m.model_dump()) for m in batch]
        return await self._run(
            scope, lambda conn: _messages.append_messages(conn, scope, sid, batch)
        )

    async def append_message(self, session_id: str, message: NewMessage) -> Message:
        """Append one message; see :meth:`append_messages`."""
        (stored,) = await self.append_messages(session_id, [message])
        return stored

    async def list_messages(
        self, session_id: str, *, after_seq: int = 0, limit: int = DEFAULT_MESSAGE_LIMIT
    ) -> list[Message]:
        """Messages with ``seq > after_seq``, in ``seq`` order, at most ``limit`` (1-1000).

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``after_seq`` < 0 or ``limit`` out of range.
        """
        scope, sid = current_scope(), _session_id(session_id)
        if isinstance(after_seq, bool) or not isinstance(after_seq, int) or after_seq < 0:
            raise InvalidInput("after_seq: must be an integer, 0 or more")
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_MESSAGE_LIMIT
        ):
            raise InvalidInput(f"limit: must be 1 to {MAX_MESSAGE_LIMIT}")
        return await self._run(
            scope,
            lambda conn: _messages.list_messages(
                conn, scope, sid, after_seq=after_seq, limit=limit
            ),
        )

    async def recent_messages(
        self,
        session_id: str,
        *,
        limit: int = DEFAULT_MESSAGE_LIMIT,
        before_seq: int | None = None,
    ) -> list[Message]:
        """The newest ``limit`` messages (1-1000), oldest first: an agent's context window.

        With ``before_seq``, the newest ``limit`` messages older than that
        position, so ``before_seq=page[0].seq`` pages backwards until an empty
        page. Each page is one index scan of ``limit`` rows, whatever the
        conversation's length.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``limit`` out of range, or ``before_seq`` not 1 to 2**31-1.
        """
        scope, sid = current_scope(), _session_id(session_id)
        _check_limit(limit)
        if before_seq is None:
            before_seq = _messages.SEQ_END
        elif (
            isinstance(before_seq, bool)
            or not isinstance(before_seq, int)
            or not 1 <= before_seq <= _messages.SEQ_END
        ):
            raise InvalidInput(f"before_seq: must be an integer, 1 to {_messages.SEQ_END}")
        bound = before_seq
        return await self._run(
            scope,
            lambda conn: _messages.recent_messages(conn, scope, sid, before_seq=bound, limit=limit),
        )

    async def get_session_with_messages(
        self, session_id: str, *, limit: int = DEFAULT_MESSAGE_LIMIT
    ) -> SessionHistory:
        """The session and its newest ``limit`` messages (oldest first), in one read.

        Both come from one snapshot: ``session.message_count`` equals the
        ``seq`` of the last message returned, even while appends commit.
        Unpack it as ``session, messages = await store.get_session_with_messages(id)``.

        Raises:
            NotFound: the session is not visible.
            InvalidInput: ``limit`` out of range (1-1000).
        """
        scope, sid = current_scope(), _session_id(session_id)
        _check_limit(limit)
        return await self._run(
            scope,
            lambda conn: _messages.select_session_with_messages(conn, scope, sid, limit=limit),
        )

    # --- operator surface -------------------------------------------------------

    async def inspect_session(self, session_id: str) -> SessionDetail:
        """The session with its state, every pending input and the marker reasons.

        An aborted session reports no pending inputs.

        Raises:
            NotFound: the session is not visible.
        """
        scope, sid = current_scope(), _session_id(session_id)
        return await self._run(scope, lambda conn: _operator.inspect(conn, scope, sid))

    async def abort_session(self, session_id: str, reason: str) -> Session:
        """Write a durable abort marker (not preemption); pending inputs are cleared.

        Raises:
            NotFound: the session is not visible.
            AlreadyAborted: it was aborted before.
            InvalidInput: ``reason`` breaks a limit.
        """
        scope, sid = current_scope(), _session_id(session_id)
        check_text(reason, "reason", MAX_TITLE_LENGTH)
        return await self._run(scope, lambda conn: _operator.abort(conn, scope, sid, reason))

    async def resume(
        self, session_id: str, interrupt_id: str, response: Any, *, author: str = ""
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
        scope, sid = current_scope(), _session_id(session_id)
        check_identifier(interrupt_id, "interrupt_id")
        check_text(author, "author", MAX_AUTHOR_LENGTH)
        check_json(response, "response")
        answer = NewMessage(
            "user",
            author=author,
            function_response=FunctionResponse(id=interrupt_id, response=response),
        )

        async def body(conn: Tx) -> Message:
            await _operator.check_resumable(conn, scope, sid, interrupt_id, response)
            (stored,) = await _messages.append_messages(conn, scope, sid, [answer])
            return stored

        return await self._run(scope, body)

    async def mark_interrupted(self, session_id: str, reason: str) -> None:
        """Mark a turn cut short by a shutdown; re-marking overwrites the reason.

        The session need not exist yet: the marker waits, and shows once a
        session with this id is created in the current scope.

        Raises:
            InvalidInput: ``reason`` breaks a limit or the id is malformed.
        """
        scope, sid = current_scope(), _session_id(session_id)
        check_text(reason, "reason", MAX_TITLE_LENGTH)
        await self._run(scope, lambda conn: _operator.mark_interrupted(conn, scope, sid, reason))

    async def clear_interrupted(self, session_id: str) -> None:
        """Clear the interrupt marker when the turn completes; a no-op if there is none."""
        scope, sid = current_scope(), _session_id(session_id)
        await self._run(scope, lambda conn: _operator.clear_interrupted(conn, scope, sid))
