"""The operator console at ``/console``: server-rendered pages over OperatorView and the Store.

Reads across tenants go through :class:`cortex.console.OperatorView` (the
role ``cortex_console``, bound to the operator's scope); a resume or an
abort is the same :class:`cortex.Store` call the API makes, in the scope
of a session the view found within the operator's, and every action is
recorded with :meth:`cortex.Store.record_console_action`. Templates are
Jinja2 with autoescaping on, so host text is always shown as text; no page
carries script, and the Content-Security-Policy says so.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from cortex._db.engine import make_engine
from cortex.asgi import status_for
from cortex.console import ActionKind, OperatorView, WaitingFilter
from cortex.errors import CortexError, InvalidInput, NotFound
from cortex.integrations._payloads import tool_uses
from cortex.models import Message, PendingInput, SessionState
from cortex.scope import Scope, use_scope
from cortex.server.auth import SigningKey, Unauthorized
from cortex.server.console_session import (
    CSRF_FIELD,
    PATH,
    NotAnOperator,
    Operator,
    SessionCookies,
    console_root,
    operator_of,
)
from cortex.server.forms import Field, errors_by_field, fields_for, parse_form, refill
from cortex.store import Store

__all__ = ["DEFAULT_AUDIT_SCOPE", "Console", "install_console"]

# Where sign-ins and sign-outs of every-tenant operators are recorded (they have no tenant).
DEFAULT_AUDIT_SCOPE: Final = "cortex-console"
PAGE_ROWS: Final = 25
MESSAGE_ROWS: Final = 20
ACTION_ROWS: Final = 20
# No script at all; styles from this server only; forms post here only.
CSP: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
    " frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# What a page says after a redirect: fixed texts chosen by a query word, never echoed input.
NOTICES: Final = {
    "resumed": "The answer was recorded; the session is resumed.",
    "aborted": "The session was aborted.",
    "signed-out": "You are signed out.",
    "expired": "Your sign-in has expired; sign in again with a new token.",
}
STATES: Final = ("paused", "interrupted", "aborted")


def _pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cortex.server", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = _pretty
    return env


class Console:
    """The console's shared parts: templates, cookies, the store and the console role's engine."""

    def __init__(
        self,
        store: Callable[[], Awaitable[Store]],
        key: SigningKey,
        csrf_key: bytes,
        *,
        console_url: str | URL | None,
        secure_cookies: bool,
        audit_scope: str,
    ) -> None:
        self._store = store
        self._url = console_url
        self._engine: AsyncEngine | None = None
        self.cookies = SessionCookies(key, csrf_key, secure=secure_cookies)
        self.audit_scope = Scope.parse(audit_scope)
        self.env = _templates()

    async def store(self) -> Store:
        """The server's store (the application role): where actions are carried out."""
        return await self._store()

    async def view(self, operator: Operator) -> OperatorView:
        """An OperatorView at the operator's scope, on the console login (or the store's)."""
        if self._engine is None:
            if self._url is not None:
                self._engine = make_engine(self._url, pool_size=5)
            else:
                # The store's own login: a superuser (the embedded demo) or one granted the role.
                self._engine = (await self.store()).engine
        return OperatorView(self._engine, operator_scope=operator.scope)

    async def close(self) -> None:
        """Dispose of the console login's engine, if one was made."""
        if self._url is not None and self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    def page(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """A rendered page with the security headers; its forms carry the browser's CSRF token."""
        nonce = self.cookies.nonce(request)
        fresh = nonce is None
        if nonce is None:
            nonce = secrets.token_urlsafe(32)
        html = self.env.get_template(template).render(
            csrf_field=CSRF_FIELD,
            csrf=self.cookies.csrf_token(request, nonce),
            root=console_root(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if fresh:
            self.cookies.new_nonce(request, response, nonce)
        return response

    async def record(
        self,
        operator: Operator,
        action: ActionKind,
        *,
        scope: Scope | None = None,
        session_id: str | None = None,
        outcome: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """One audit row, in the session's scope, else the operator's (or the audit scope)."""
        where = scope or operator.scope or self.audit_scope
        store = await self.store()
        with use_scope(where):
            await store.record_console_action(
                action,
                subject=operator.subject,
                session_id=session_id,
                outcome=outcome,
                detail=detail or {},
            )


def _redirect(request: Request, location: str) -> RedirectResponse:
    """A redirect to ``location``, a path within the console (``/sign-in``)."""
    where = console_root(request) + location
    return RedirectResponse(where, status_code=303, headers=SECURITY_HEADERS)


def _session_url(tenant: str, session_id: str) -> str:
    return f"/tenants/{tenant}/sessions/{session_id}"


@dataclass
class Question:
    """A pending input on the session page: its question, payload and answer form."""

    pending: PendingInput
    form: Field
    errors: dict[str, list[str]]
    general: list[str]


@dataclass
class Shown:
    """One message as the session page shows it."""

    message: Message
    # ("calls" | "answers", tool name, its arguments or answer as text)
    tools: list[tuple[str, str, str]]


def _shown(messages: list[Message]) -> list[Shown]:
    names = {
        use.call_id: use.name
        for m in messages
        for use in tool_uses(m.payload)
        if use.kind == "call" and use.call_id and use.name
    }
    out = []
    for m in reversed(messages):
        tools = []
        for use in tool_uses(m.payload):
            verb = "calls" if use.kind == "call" else "answers"
            name = use.name or names.get(use.call_id) or use.call_id
            body = use.body if isinstance(use.body, str) else _pretty(use.body)
            tools.append((verb, name, body))
        out.append(Shown(m, tools))
    return out


def _question(pending: PendingInput) -> Question:
    schema = pending.response_schema
    form = (
        fields_for(schema)
        if schema is not None
        else Field("json", "f", "answer", required=True, description="any JSON value")
    )
    return Question(pending, form, {}, [])


def install_console(app: FastAPI, console: Console) -> None:
    """Mount the console's pages at ``/console`` and its stylesheet at ``/console/static``."""
    app.state.console = console
    router = APIRouter(prefix=PATH, include_in_schema=False)
    static = StaticFiles(directory=str(files("cortex.server") / "static"))
    _routes(router, console)
    app.include_router(router)
    app.mount(PATH + "/static", static, name="console-static")


def _routes(router: APIRouter, console: Console) -> None:
    async def signed_in(request: Request) -> Operator | Response:
        operator = console.cookies.operator(request)
        if operator is not None:
            return operator
        if console.cookies.session_token(request):
            response = _redirect(request, "/sign-in?notice=expired")
            console.cookies.sign_out(request, response)
            return response
        return _redirect(request, "/sign-in")

    def refused(request: Request) -> HTMLResponse:
        return console.page(
            request,
            "error.html",
            403,
            operator=None,
            title="Refused",
            message="The form's CSRF token is missing or wrong: reload the page and try again.",
        )

    def failed(request: Request, operator: Operator | None, exc: CortexError) -> HTMLResponse:
        status = status_for(exc)
        title = "Not found" if isinstance(exc, NotFound) else type(exc).__name__
        message = "No such session within your scope." if isinstance(exc, NotFound) else str(exc)
        return console.page(
            request, "error.html", status, operator=operator, title=title, message=message
        )

    @router.get("")
    async def root(request: Request) -> Response:
        return _redirect(request, "/")

    @router.get("/sign-in")
    async def sign_in_page(request: Request, notice: str = "") -> Response:
        return console.page(
            request, "sign_in.html", operator=None, notice=NOTICES.get(notice), error=None
        )

    @router.post("/sign-in")
    async def sign_in(request: Request) -> Response:
        form = await request.form()
        if not console.cookies.csrf_ok(request, _text(form.get(CSRF_FIELD))):
            return refused(request)
        try:
            operator = operator_of(console.cookies.key, _text(form.get("token")) or "")
        except (Unauthorized, NotAnOperator) as exc:
            status = 403 if isinstance(exc, NotAnOperator) else 401
            return console.page(
                request, "sign_in.html", status, operator=None, notice=None, error=str(exc)
            )
        await console.record(operator, ActionKind.SIGN_IN)
        response = _redirect(request, "/")
        console.cookies.sign_in(request, response, operator)
        return response

    @router.post("/sign-out")
    async def sign_out(request: Request) -> Response:
        form = await request.form()
        if not console.cookies.csrf_ok(request, _text(form.get(CSRF_FIELD))):
            return refused(request)
        operator = console.cookies.operator(request)
        if operator is not None:
            await console.record(operator, ActionKind.SIGN_OUT)
        response = _redirect(request, "/sign-in?notice=signed-out")
        console.cookies.sign_out(request, response)
        return response

    @router.get("/")
    async def waiting(
        request: Request,
        state: str = "paused",
        tenant: str = "",
        agent: str = "",
        search: str = "",
        cursor: str = "",
    ) -> Response:
        operator = await signed_in(request)
        if not isinstance(operator, Operator):
            return operator
        filters = {"state": state, "tenant": tenant, "agent": agent, "search": search}
        error, rows, following = None, [], None
        status = 200
        try:
            flt = WaitingFilter(
                state=SessionState(state) if state in STATES else state,
                tenant=tenant or None,
                agent_id=agent or None,
                search=search or None,
                limit=PAGE_ROWS,
            )
            view = await console.view(operator)
            page = await view.list_waiting(flt, cursor or None)
            rows, following = page.rows, page.next_cursor
        except InvalidInput as exc:
            error, status = str(exc), 422
        except CortexError as exc:
            return failed(request, operator, exc)
        kept = {k: v for k, v in filters.items() if v}
        return console.page(
            request,
            "waiting.html",
            status,
            operator=operator,
            filters=filters,
            states=STATES,
            rows=rows,
            error=error,
            caption=f"{state.capitalize() if state in STATES else 'Waiting'} sessions",
            next_url=None if following is None else "?" + urlencode({**kept, "cursor": following}),
            first_url=("?" + urlencode(kept)) if cursor else None,
            session_url=_session_url,
        )

    async def session_page(
        request: Request,
        operator: Operator,
        tenant: str,
        session_id: str,
        *,
        before: int | None = None,
        status: int = 200,
        notice: str | None = None,
        error: str | None = None,
        answered: Question | None = None,
        abort_error: str | None = None,
        reason: str = "",
    ) -> Response:
        try:
            view = await console.view(operator)
            scope = await view.session_scope(tenant, session_id)
            store = await console.store()
            with use_scope(scope):
                detail = await store.inspect_session(session_id)
                messages = await store.recent_messages(
                    session_id, limit=MESSAGE_ROWS, before_seq=before
                )
            actions = await view.list_actions(
                tenant=tenant, session_id=session_id, limit=ACTION_ROWS
            )
        except CortexError as exc:
            return failed(request, operator, exc)
        questions = [
            answered
            if answered is not None and answered.pending.interrupt_id == p.interrupt_id
            else _question(p)
            for p in detail.pending
        ]
        oldest = messages[0].seq if messages else None
        here = console_root(request) + _session_url(tenant, session_id)
        return console.page(
            request,
            "session.html",
            status,
            operator=operator,
            detail=detail,
            tenant=tenant,
            here=here,
            shown=_shown(messages),
            older_url=f"{here}?before={oldest}" if oldest is not None and oldest > 1 else None,
            newest_url=here if before is not None else None,
            questions=questions,
            actions=actions.rows,
            notice=notice,
            error=error,
            abort_error=abort_error,
            reason=reason,
        )

    @router.get("/tenants/{tenant}/sessions/{session_id}")
    async def session(
        request: Request, tenant: str, session_id: str, before: int | None = None, outcome: str = ""
    ) -> Response:
        operator = await signed_in(request)
        if not isinstance(operator, Operator):
            return operator
        return await session_page(
            request, operator, tenant, session_id, before=before, notice=NOTICES.get(outcome)
        )

    async def acting(
        request: Request, tenant: str, session_id: str
    ) -> tuple[Operator, Scope, dict[str, str]] | Response:
        """The operator, the session's scope and the form of a POST; or the refusal."""
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        # Signed out first (it acts on nothing): a form of a session that has
        # since expired leads to the sign-in page, not to a CSRF refusal.
        operator = await signed_in(request)
        if not isinstance(operator, Operator):
            return operator
        if not console.cookies.csrf_ok(request, form.get(CSRF_FIELD)):
            return refused(request)
        try:
            scope = await (await console.view(operator)).session_scope(tenant, session_id)
        except CortexError as exc:
            return failed(request, operator, exc)
        return operator, scope, form

    @router.post("/tenants/{tenant}/sessions/{session_id}/resume")
    async def resume(request: Request, tenant: str, session_id: str) -> Response:
        found = await acting(request, tenant, session_id)
        if not isinstance(found, tuple):
            return found
        operator, scope, form = found
        interrupt_id = form.get("interrupt_id", "")
        store = await console.store()
        detail_of: dict[str, Any] = {"interrupt_id": interrupt_id[:256]}
        question: Question | None = None

        async def done(outcome: str) -> None:
            await console.record(
                operator,
                ActionKind.RESUME,
                scope=scope,
                session_id=session_id,
                outcome=outcome,
                detail=detail_of,
            )

        try:
            with use_scope(scope):
                detail = await store.inspect_session(session_id)
            pending = next((p for p in detail.pending if p.interrupt_id == interrupt_id), None)
            if pending is None:
                raise NotFound(f"no pending input {interrupt_id!r}: answered or withdrawn")
            question = _question(pending)
            parsed = parse_form(question.form, form)
            refill(question.form, form)
            if parsed.absent and not parsed.errors:
                parsed.errors[question.form.name] = "give an answer"
            if parsed.errors:
                question.errors = {k: [v] for k, v in parsed.errors.items()}
                _refuse_form()
            with use_scope(scope):
                await store.resume(session_id, interrupt_id, parsed.value, author=operator.subject)
        except InvalidInput as exc:
            await done("InvalidInput")
            if question is None:
                return await session_page(
                    request, operator, tenant, session_id, status=422, error=str(exc)
                )
            schema = question.pending.response_schema
            if schema is not None and not question.errors:
                question.errors, question.general = errors_by_field(schema, parsed)
            if not question.errors and not question.general:
                question.general = [str(exc)]
            return await session_page(
                request, operator, tenant, session_id, status=422, answered=question
            )
        except CortexError as exc:
            await done(type(exc).__name__)
            return await session_page(
                request, operator, tenant, session_id, status=status_for(exc), error=str(exc)
            )
        await done("ok")
        return _redirect(request, _session_url(tenant, session_id) + "?outcome=resumed")

    @router.post("/tenants/{tenant}/sessions/{session_id}/abort")
    async def abort(request: Request, tenant: str, session_id: str) -> Response:
        found = await acting(request, tenant, session_id)
        if not isinstance(found, tuple):
            return found
        operator, scope, form = found
        reason = form.get("reason", "")
        store = await console.store()
        failure: CortexError | None = None
        try:
            with use_scope(scope):
                await store.abort_session(session_id, reason)
        except CortexError as exc:
            failure = exc
        await console.record(
            operator,
            ActionKind.ABORT,
            scope=scope,
            session_id=session_id,
            outcome="ok" if failure is None else type(failure).__name__,
        )
        if failure is None:
            return _redirect(request, _session_url(tenant, session_id) + "?outcome=aborted")
        return await session_page(
            request,
            operator,
            tenant,
            session_id,
            status=status_for(failure),
            abort_error=str(failure),
            reason=reason,
        )


def _refuse_form() -> None:
    """Raises: InvalidInput: a control holds text that is not what it must (JSON)."""
    raise InvalidInput("the form holds no valid answer")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
