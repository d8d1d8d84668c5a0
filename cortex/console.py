"""The operator console's data: sessions waiting on a human across tenants, and the audit trail.

:class:`OperatorView` reads as the database role ``cortex_console``
(revision 20261205000025) through a login a DBA granted it. Every
transaction sets ``ROLE cortex_console`` and binds the operator's scope in
``cortex.operator_scope``; the role's own policies then show only rows at or
beneath that scope, and it may only read. The application role's policies
are untouched: the view adds no reach to it (SECURITY.md, "The operator
console").

The view never writes. An operator's action (a resume, an abort) is carried
out by a :class:`cortex.Store` bound to the session's scope, and recorded
there with :meth:`cortex.Store.record_console_action`, which writes the audit
row as the application role in the session's tenant.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, Strict
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cortex._db.engine import make_engine
from cortex._sql import console as sql
from cortex._sql.params import (
    AFTER_AT,
    AFTER_ID,
    AFTER_TENANT,
    AFTER_UPDATED_AT,
    C_AGENT_ID,
    C_SEARCH,
    C_TENANT,
    LIMIT,
    SCOPE_PATH,
    SESSION_ID,
)
from cortex._sql.predicates import escape_like, scope_params
from cortex._validate import boundary
from cortex.errors import DatabaseError, InvalidInput, NotFound, sqlstate_of, translate_errors
from cortex.ids import SESSION_PREFIX, format_id
from cortex.models import AgentId, SearchTerm, SessionId, SessionState, _Model, session_uuid
from cortex.scope import Scope

__all__ = [
    "ACTION_PREFIX",
    "CONSOLE_ROLE",
    "MAX_CONSOLE_PAGE",
    "ActionDetail",
    "ActionKind",
    "ActionPage",
    "ConsoleAction",
    "OperatorView",
    "Outcome",
    "Subject",
    "WaitingFilter",
    "WaitingPage",
    "WaitingSession",
]

# The NOLOGIN role whose policies let the console read across tenants.
CONSOLE_ROLE: Final = "cortex_console"
# TypeID prefix of an audit row.
ACTION_PREFIX: Final = "act"
# A page holds at most this many rows; at least 20, so a console page is never thin.
MAX_CONSOLE_PAGE: Final = 200
MIN_CONSOLE_PAGE: Final = 20
DEFAULT_CONSOLE_PAGE: Final = 50
# console_actions' check constraints, refused before SQL.
MAX_SUBJECT_LENGTH: Final = 256
# Half the column's bound: jsonb prints a space after every ':' and ','.
MAX_DETAIL_BYTES: Final = 2048
_OUTCOME: Final = re.compile(r"(ok|[A-Z][A-Za-z]{0,63})\Z")
_DETAIL_KEY: Final = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
# insufficient_privilege: SET ROLE by a login that is not a member of the role.
_NOT_A_MEMBER: Final = "42501"


class ActionKind(StrEnum):
    """What an operator did (``console_actions.action``)."""

    RESUME = "resume"
    ABORT = "abort"
    MARK = "mark"
    UNMARK = "unmark"
    SIGN_IN = "sign_in"
    SIGN_OUT = "sign_out"
    ERASE = "erase"


def _subject(text: str) -> str:
    if not 1 <= len(text) <= MAX_SUBJECT_LENGTH:
        raise ValueError(f"must be 1-{MAX_SUBJECT_LENGTH} characters")
    if not text.isprintable():
        raise ValueError("must be printable characters")
    return text


def _outcome(text: str) -> str:
    if _OUTCOME.match(text) is None:
        raise ValueError("must be 'ok' or a CortexError class name such as 'Conflict'")
    return text


def _detail(value: dict[str, Any]) -> dict[str, Any]:
    for key in value:
        if _DETAIL_KEY.match(key) is None:
            raise ValueError(f"key {key[:64]!r}: lower-case letters, digits and _ (1-64)")
    if len(_detail_json(value).encode()) > MAX_DETAIL_BYTES:
        raise ValueError(f"must be at most {MAX_DETAIL_BYTES} bytes of JSON")
    return value


def _detail_json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


Subject = Annotated[str, Strict(), AfterValidator(_subject)]
"""The operator's token subject (``sub``): 1-256 printable characters."""
Outcome = Annotated[str, Strict(), AfterValidator(_outcome)]
"""``ok``, or the name of the :class:`cortex.CortexError` the action met."""
DetailValue = Annotated[str, Strict(), Field(max_length=256)] | int | bool | None
ActionDetail = Annotated[
    dict[str, DetailValue | list[Annotated[str, Strict(), Field(max_length=256)]]],
    AfterValidator(_detail),
]
"""Ids and counts (``{"interrupt_id": "...", "answers": 1}``), never an answer's content.

Flat: text (at most 256 characters), integers, booleans, null, or lists of
text; keys are lower-case identifiers; at most 2,048 bytes as compact JSON.
"""


def _waiting_state(state: SessionState) -> SessionState:
    if state is SessionState.IDLE:
        raise ValueError("the console lists paused, interrupted or aborted sessions, not idle")
    return state


def _tenant(text: str) -> str:
    try:
        scope = Scope.parse(text)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if scope.depth != 1:
        raise ValueError("a tenant is one scope segment")
    return text


Tenant = Annotated[str, Strict(), AfterValidator(_tenant)]


class WaitingFilter(_Model):
    """Which waiting sessions a console page shows: one state, optionally narrowed."""

    state: Annotated[SessionState, AfterValidator(_waiting_state)] = SessionState.PAUSED
    # Only this tenant (within the operator's scope).
    tenant: Annotated[str, Strict(), AfterValidator(_tenant)] | None = None
    agent_id: AgentId | None = None
    # A case-insensitive substring of the title.
    search: SearchTerm | None = None
    limit: Annotated[int, Strict(), Field(ge=MIN_CONSOLE_PAGE, le=MAX_CONSOLE_PAGE)] = (
        DEFAULT_CONSOLE_PAGE
    )


class WaitingSession(_Model):
    """One row of the console's list: a session and what it waits on."""

    tenant: str
    scope: Scope
    # "ses_" TypeID.
    session_id: str
    agent_id: str
    title: str
    state: SessionState
    # Paused: the oldest open question's message, its first 200 characters, and its id.
    question: str | None = None
    interrupt_id: str | None = None
    # Interrupted or aborted: the marker's reason.
    reason: str | None = None
    # When the question was asked, or the marker set (else the last change).
    waiting_since: datetime
    updated_at: datetime


class WaitingPage(_Model):
    """A page of :class:`WaitingSession`; ``next_cursor`` is None on the last page."""

    rows: list[WaitingSession]
    next_cursor: str | None = None


class ConsoleAction(_Model):
    """One audit row: who did what to which session, and how it ended. Never what was answered."""

    # "act_" TypeID over a UUIDv7.
    id: str
    tenant: str
    # The session's scope, or the operator's when the action has no session.
    scope: Scope
    session_id: str | None = None
    subject: str
    action: ActionKind
    outcome: str
    detail: dict[str, Any]
    at: datetime


class ActionPage(_Model):
    """A page of :class:`ConsoleAction`, newest first; ``next_cursor`` is None on the last page."""

    rows: list[ConsoleAction]
    next_cursor: str | None = None


Limit = Annotated[int, Strict(), Field(ge=MIN_CONSOLE_PAGE, le=MAX_CONSOLE_PAGE)]
Cursor = Annotated[str, Strict(), Field(max_length=512)]


def _encode_cursor(kind: str, at: datetime, row_id: uuid.UUID, tenant: str) -> str:
    text = json.dumps([kind, at.isoformat(), row_id.hex, tenant], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(kind: str, cursor: str) -> tuple[datetime, uuid.UUID, str]:
    """The position a cursor of this kind names.

    Raises:
        InvalidInput: it is not a cursor this kind of listing returned.
    """
    refused = InvalidInput("cursor: not a cursor this listing returned")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        found, at, row_id, tenant = json.loads(raw)
        moment = datetime.fromisoformat(at)
        position = moment, uuid.UUID(hex=row_id), tenant
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise refused from None
    if found != kind or not isinstance(tenant, str) or moment.tzinfo is None:
        raise refused
    return position


def _operator_setting(scope: Scope | None) -> tuple[int, str, dict[str, Any]]:
    """The scope's kind, its ``cortex.operator_scope`` value and the statement's scope binds."""
    if scope is None:
        return sql.ALL, "/", {}
    kind = sql.TENANT if scope.depth == 1 else sql.SUBTREE
    return kind, f"{scope}/", scope_params(scope)


class OperatorView:
    """Read-only, cross-tenant reads for an operator console, as the role ``cortex_console``.

    ``url``: a login granted ``cortex_console`` (``GRANT cortex_console TO
    console_login``), or an engine on one. ``operator_scope``: the operator
    token's scope: a :class:`Scope` (or path) shows that scope and everything
    beneath it; ``None`` or ``""`` shows every tenant. Safe to share across
    tasks: each call checks out its own connection.
    """

    def __init__(
        self,
        url: str | URL | AsyncEngine,
        *,
        operator_scope: Scope | str | None,
        **pool_options: Any,
    ) -> None:
        """Raises: InvalidInput: ``operator_scope`` is not a scope path."""
        if operator_scope is None or operator_scope == "":
            self._scope: Scope | None = None
        elif isinstance(operator_scope, Scope):
            self._scope = operator_scope
        elif isinstance(operator_scope, str):
            self._scope = Scope.parse(operator_scope)
        else:
            raise InvalidInput("operator_scope: a Scope, a path, or None for every tenant")
        if isinstance(url, AsyncEngine):
            self._engine, self._owned = url, False
        else:
            self._engine, self._owned = make_engine(url, **pool_options), True
        self._kind, self._setting, self._scope_binds = _operator_setting(self._scope)

    @property
    def operator_scope(self) -> Scope | None:
        """The scope this view reads at and beneath; None: every tenant."""
        return self._scope

    async def close(self) -> None:
        """Dispose of the engine the view made (not one it was given)."""
        if self._owned:
            await self._engine.dispose()

    async def __aenter__(self) -> OperatorView:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read(self, stmt: Any, params: dict[str, Any]) -> list[Any]:
        """One READ ONLY transaction as ``cortex_console`` with the operator scope bound."""
        with translate_errors():
            async with self._engine.connect() as conn:
                # The first statement of the transaction SQLAlchemy begins.
                await conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                try:
                    await self._bind(conn)
                    return list((await conn.execute(stmt, params)).all())
                finally:
                    await conn.rollback()

    async def _bind(self, conn: AsyncConnection) -> None:
        try:
            await conn.exec_driver_sql(sql.ROLE_STATEMENT)
        except DBAPIError as exc:
            if sqlstate_of(exc) != _NOT_A_MEMBER:
                raise
            user = self._engine.url.username or "this login"
            raise DatabaseError(
                f"{user} cannot act as {CONSOLE_ROLE}: as a superuser, GRANT {CONSOLE_ROLE}"
                f" TO {user} (and run `cortex db upgrade`, which makes the role's policies)"
            ) from exc
        await conn.execute(sql.bind_statement(), {SCOPE_PATH: self._setting})

    @boundary
    async def list_waiting(
        self, filter: WaitingFilter | None = None, cursor: Cursor | None = None
    ) -> WaitingPage:
        """One page of sessions waiting on a human, newest change first, across the scope's tenants.

        ``cursor``: the ``next_cursor`` of the previous page. Pages are
        keyset pages (stable under inserts; a session that changes moves to
        the top and may show twice or not at all across pages).

        Raises:
            InvalidInput: a filter value or the cursor is malformed (before any SQL).
            DatabaseError: the login cannot act as ``cortex_console``.
        """
        flt = filter or WaitingFilter()
        after = None if cursor is None else _decode_cursor("w", cursor)
        stmt = sql.waiting_statement(
            flt.state.value,
            self._kind,
            tenant=flt.tenant is not None,
            agent=flt.agent_id is not None,
            search=bool(flt.search),
            after=after is not None,
        )
        params: dict[str, Any] = {**self._scope_binds, LIMIT: flt.limit + 1}
        if flt.tenant is not None:
            params[C_TENANT] = flt.tenant
        if flt.agent_id is not None:
            params[C_AGENT_ID] = flt.agent_id
        if flt.search:
            params[C_SEARCH] = escape_like(flt.search)
        if after is not None:
            params |= {AFTER_UPDATED_AT: after[0], AFTER_ID: after[1], AFTER_TENANT: after[2]}
        rows = await self._read(stmt, params)
        more = len(rows) > flt.limit
        rows = rows[: flt.limit]
        page = [_waiting(row) for row in rows]
        last = rows[-1] if more else None
        return WaitingPage(
            rows=page,
            next_cursor=None
            if last is None
            else _encode_cursor("w", last.updated_at, last.id, last.tenant_id),
        )

    @boundary
    async def session_scope(self, tenant: Tenant, session_id: SessionId) -> Scope:
        """The scope of ``tenant``'s session ``session_id``, if it is at or beneath the operator scope.

        Whatever its state: a console page keeps showing a session once answered.

        Raises:
            InvalidInput: ``tenant`` or ``session_id`` is malformed (before any SQL).
            NotFound: no such session within the operator scope (another tenant's too).
            DatabaseError: the login cannot act as ``cortex_console``.
        """
        params = {**self._scope_binds, C_TENANT: tenant, SESSION_ID: session_uuid(session_id)}
        rows = await self._read(sql.session_scope_statement(self._kind), params)
        if not rows:
            raise NotFound(f"session {session_id} not found")
        return Scope.parse(rows[0].scope)

    @boundary
    async def list_actions(
        self,
        *,
        tenant: Tenant | None = None,
        session_id: SessionId | None = None,
        limit: Limit = DEFAULT_CONSOLE_PAGE,
        cursor: Cursor | None = None,
    ) -> ActionPage:
        """One page of the audit trail at or beneath the scope (of one tenant, or session), newest first.

        ``session_id`` names a session of ``tenant`` (session ids are unique
        within a tenant only); ``tenant`` may be left out when the operator
        scope lies within one tenant.

        Raises:
            InvalidInput: ``tenant``, ``session_id``, ``limit`` or the cursor is
                malformed, or ``session_id`` comes without a tenant (before any SQL).
            DatabaseError: the login cannot act as ``cortex_console``.
        """
        after = None if cursor is None else _decode_cursor("a", cursor)
        if tenant is None and session_id is not None:
            if self._scope is None:
                raise InvalidInput(
                    "session_id: name its tenant too; session ids are unique within a tenant"
                )
            tenant = self._scope.tenant
        stmt = sql.actions_statement(
            self._kind,
            tenant=tenant is not None,
            session=session_id is not None,
            after=after is not None,
        )
        params: dict[str, Any] = {**self._scope_binds, LIMIT: limit + 1}
        if tenant is not None:
            params[C_TENANT] = tenant
        if session_id is not None:
            params[SESSION_ID] = session_uuid(session_id)
        if after is not None:
            params |= {AFTER_AT: after[0], AFTER_ID: after[1], AFTER_TENANT: after[2]}
        rows = await self._read(stmt, params)
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if more else None
        return ActionPage(
            rows=[action_from_row(row) for row in rows],
            next_cursor=None
            if last is None
            else _encode_cursor("a", last.at, last.id, last.tenant_id),
        )


def _waiting(row: Any) -> WaitingSession:
    state = SessionState(row.state)
    since = row.since or row.updated_at
    return WaitingSession(
        tenant=row.tenant_id,
        scope=Scope.parse(row.scope),
        session_id=format_id(SESSION_PREFIX, row.id),
        agent_id=row.agent_id,
        title=row.title,
        state=state,
        question=row.question if state is SessionState.PAUSED else None,
        interrupt_id=row.interrupt_id if state is SessionState.PAUSED else None,
        reason=None if state is SessionState.PAUSED else row.reason,
        waiting_since=since,
        updated_at=row.updated_at,
    )


def action_from_row(row: Any) -> ConsoleAction:
    """A ``console_actions`` row as the public model."""
    detail = row.detail
    return ConsoleAction(
        id=format_id(ACTION_PREFIX, row.id),
        tenant=row.tenant_id,
        scope=Scope.parse(row.scope),
        session_id=None if row.session_id is None else format_id(SESSION_PREFIX, row.session_id),
        subject=row.subject,
        action=ActionKind(row.action),
        outcome=row.outcome,
        detail=json.loads(detail) if isinstance(detail, str) else dict(detail),
        at=row.at,
    )
