"""cortex in an ASGI app: bind the scope from the request, map cortex errors to HTTP statuses.

Framework-free (no import of Starlette or FastAPI); :mod:`cortex.fastapi`
adds the FastAPI dependency and exception handler.

Why a middleware (or cortex's async dependency) and not ``use_scope`` in a
plain ``def`` dependency: the scope lives on a ``ContextVar``. A pure ASGI
middleware runs the whole request in its own task, so what it binds reaches
every ``async def`` endpoint, and a ``def`` endpoint too (Starlette's
threadpool copies the context when it starts the thread). A ``def``
dependency is itself run in the threadpool, in a *copy* of the context:
what it binds stays in that copy and never reaches the endpoint
(``ScopeMissing``), and leaving ``use_scope`` there fails ("Token … was
created in a different Context").
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final

from cortex.errors import (
    AlreadyAborted,
    Conflict,
    CortexError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidScope,
    NotFound,
    OperationTimeout,
    SchemaMismatch,
    ScopeMissing,
    ScopeViolation,
    SessionAborted,
)
from cortex.scope import Scope, use_scope

__all__ = [
    "HTTP_STATUS",
    "PROBLEM_JSON",
    "ScopeMiddleware",
    "error_body",
    "from_header",
    "header",
    "problem",
    "route_path",
    "status_for",
]

ASGIScope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[ASGIScope, Receive, Send], Awaitable[None]]
# What the host provides: the request's ASGI scope in, the cortex scope out
# (None when the request carries none). May be async, e.g. to fetch JWT keys.
ScopeFrom = Callable[[Mapping[str, Any]], "str | Scope | Awaitable[str | Scope | None] | None"]

# Most specific first: the first class an error is an instance of decides.
HTTP_STATUS: Final[tuple[tuple[type[CortexError], int], ...]] = (
    (NotFound, 404),  # missing or another scope's: the same answer, no hint
    (InvalidScope, 422),
    (InvalidInput, 422),
    (ScopeViolation, 403),
    (ScopeMissing, 500),  # the app forgot to bind a scope: a server bug
    (AlreadyAborted, 409),
    (Conflict, 409),
    (SessionAborted, 409),
    (SchemaMismatch, 503),  # deploy order: run `cortex db upgrade`
    (DatabaseUnavailable, 503),
    (OperationTimeout, 504),
    (DatabaseError, 500),
    (CortexError, 500),
)


def status_for(exc: CortexError) -> int:
    """The HTTP status a cortex error should answer with."""
    return next(status for cls, status in HTTP_STATUS if isinstance(exc, cls))


# RFC 9457's media type: every error cortex answers is a problem details document.
PROBLEM_JSON: Final = "application/problem+json"


def problem(name: str, status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """A problem details document (RFC 9457) naming cortex's error class ``name``.

    ``type`` is a URN per class, ``title`` the class name; ``error`` repeats
    it for clients that read the earlier ``{"error", "detail"}`` body.
    """
    return {
        "type": f"urn:cortex:error:{name}",
        "title": name,
        "status": status,
        "detail": detail,
        "error": name,
        **extra,
    }


def error_body(exc: CortexError, status: int | None = None) -> dict[str, Any]:
    """The problem details document of a cortex error (its status: :func:`status_for`)."""
    return problem(type(exc).__name__, status_for(exc) if status is None else status, str(exc))


def route_path(request: Mapping[str, Any]) -> str:
    """The path an app's routes match: ``path`` without the ``root_path`` prefix it carries.

    Under a prefix (a proxy's ``--root-path``) ``path`` is the full path
    ("/api/v1/sessions") and routers match what follows ``root_path``; a
    middleware that decides by path must look at the same part. As
    Starlette's router computes it.
    """
    path: str = request.get("path", "")
    root = request.get("root_path", "")
    if root and path.startswith(root):
        if path == root:
            return ""
        if path[len(root)] == "/":
            return path[len(root) :]
    return path


def header(request: Mapping[str, Any], name: str) -> str | None:
    """A request header's value (the last one if repeated), from an ASGI scope."""
    wanted = name.lower().encode("latin-1")
    found = None
    for key, value in request.get("headers", ()):
        if key.lower() == wanted:
            found = value.decode("latin-1")
    return found


def from_header(name: str) -> Callable[[Mapping[str, Any]], str | None]:
    """A ``scope_from`` that reads the scope from a header set by a trusted proxy or gateway.

    Only for headers the client cannot set itself; otherwise derive the scope
    from a verified credential (a JWT claim) in a callable of your own.
    """
    return lambda request: header(request, name)


async def resolve(scope_from: Callable[..., Any], request: Any) -> Scope:
    """Call the host's ``scope_from`` (sync or async) and parse what it returns.

    Raises:
        ScopeMissing: it returned None or an empty string.
        InvalidScope: it returned something that is not a scope.
    """
    value = scope_from(request)
    if inspect.isawaitable(value):
        value = await value
    if value is None or value == "":
        raise ScopeMissing("no scope for this request")
    if isinstance(value, Scope):
        return value
    if not isinstance(value, str):
        raise InvalidScope(f"scope: expected a string or Scope, got {type(value).__name__}")
    return Scope.parse(value)


class ScopeMiddleware:
    """Pure ASGI middleware: every HTTP and WebSocket request runs inside ``use_scope``.

    ``scope_from(asgi_scope)`` returns the request's cortex scope. A request
    without one is answered 401, one whose scope is malformed 422 (a problem
    details document, :func:`error_body`), before the app sees it. Lifespan events pass
    through unbound, and so do requests for an ``exempt`` path: each entry
    is a whole path (``"/healthz"``, ``"/openapi.json"``), or a folder when
    it ends in ``/`` (``"/static/"`` lets ``/static/app.css`` through),
    compared with the path routes match (:func:`route_path`, without a
    ``root_path`` prefix). An exempt route runs with no scope bound, so a store call there raises
    ``ScopeMissing``.
    """

    def __init__(self, app: ASGIApp, *, scope_from: ScopeFrom, exempt: Iterable[str] = ()) -> None:
        self.app = app
        self.scope_from = scope_from
        paths = tuple(exempt)
        for path in paths:
            if not isinstance(path, str) or not path.startswith("/"):
                raise InvalidInput(f"exempt: a path starting with '/', got {path!r}")
        self._exempt = frozenset(p for p in paths if not p.endswith("/"))
        self._exempt_folders = tuple(p for p in paths if p.endswith("/"))

    def _is_exempt(self, path: str) -> bool:
        return path in self._exempt or path.startswith(self._exempt_folders)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        """Bind the request's scope around the app, or answer 401/422 without calling it."""
        if scope["type"] not in ("http", "websocket") or self._is_exempt(route_path(scope)):
            await self.app(scope, receive, send)
            return
        try:
            bound = await resolve(self.scope_from, scope)
        except CortexError as exc:
            status = 401 if isinstance(exc, ScopeMissing) else status_for(exc)
            await _respond(scope, send, status, error_body(exc, status))
            return
        with use_scope(bound):
            await self.app(scope, receive, send)


async def _respond(scope: ASGIScope, send: Send, status: int, body: dict[str, Any]) -> None:
    if scope["type"] == "websocket":
        # Before accept, a close is the refusal (HTTP 403 to the client).
        await send({"type": "websocket.close", "code": 1008})
        return
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
