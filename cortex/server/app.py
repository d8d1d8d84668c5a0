"""``create_app``: cortex's HTTP API as one ASGI app (FastAPI), for ``cortex serve`` or a host.

Layers, outermost first: CORS (only when configured), telemetry (a span
and metrics per request; off with ``telemetry=False``), the host's
middleware, the body bound, token verification with the scope bound
(cortex.server.auth), then FastAPI's routing. Every error is a problem details document (RFC 9457);
an unexpected one says nothing of its cause.
"""

from __future__ import annotations

import inspect
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy.engine import URL
from starlette.exceptions import HTTPException
from starlette.routing import Route

from cortex._db.engine import SCHEMA_REVISION, check_schema
from cortex._version import __version__
from cortex.asgi import (
    PROBLEM_JSON,
    ASGIApp,
    ASGIScope,
    Receive,
    Send,
    error_body,
    problem,
    route_path,
)
from cortex.asgi import status_for as cortex_status
from cortex.errors import CortexError
from cortex.fastapi import validation_error_handler
from cortex.server.auth import AuthMiddleware, SigningKey
from cortex.server.bodies import Problem
from cortex.server.console_pages import DEFAULT_AUDIT_SCOPE, Console, install_console
from cortex.server.cursors import CursorSigner, InvalidCursor
from cortex.server.routes import router
from cortex.store import Store, open_store

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_IMPORT_BYTES", "create_app"]

log = logging.getLogger("cortex.server")

DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_MAX_IMPORT_BYTES: Final = 256 * 1024 * 1024
IMPORT_PATH: Final = "/v1/scope/import"
METRICS_PATH: Final = "/metrics"
OPEN_PATHS: Final = frozenset({"/v1/openapi.json", "/v1/docs", "/v1/docs/oauth2-redirect"})

# The problems every /v1 route may answer, for the OpenAPI document.
_PROBLEMS: Final = {
    400: "a cursor that is not this server's, or belongs to another listing",
    401: "no token, or one that does not verify",
    403: "a scope outside the token's",
    404: "not found, or not visible from the request's scope",
    409: "the request contradicts stored state",
    413: "the request body is larger than the server accepts",
    422: "the input breaks a limit; nothing was written",
    500: "an unexpected failure (nothing of it is said)",
    503: "the database is unreachable or not at this code's revision",
    504: "the database cancelled the operation",
}


class StoreHolder:
    """The app's store: given by the host, or opened from a URL (again, until it opens)."""

    def __init__(
        self,
        store_or_url: Store | str | URL,
        pool_options: dict[str, Any],
        on_open: Callable[[Store], None] | None = None,
    ) -> None:
        self._store = store_or_url if isinstance(store_or_url, Store) else None
        self._url = None if isinstance(store_or_url, Store) else store_or_url
        self._pool_options = pool_options
        self._on_open = on_open
        self._lock = anyio.Lock()
        self.signer: CursorSigner

    @property
    def owned(self) -> bool:
        """Whether the app opened the store (and so closes it)."""
        return self._url is not None

    async def store(self) -> Store:
        """The store, opened on first use.

        Raises:
            DatabaseUnavailable: the database cannot be reached (tried again next time).
            SchemaMismatch: the database is not at this code's revision.
        """
        if self._store is not None:
            return self._store
        async with self._lock:
            if self._store is None:
                assert self._url is not None  # a store or a URL was given
                store = await open_store(self._url, **self._pool_options)
                if self._on_open is not None:
                    self._on_open(store)
                self._store = store
            return self._store

    async def close(self) -> None:
        """Close the pool of a store the app opened."""
        if self.owned and self._store is not None:
            await self._store.engine.dispose()
            self._store = None


class BodyLimit:
    """Pure ASGI: refuse a request body larger than its bound with 413, as problem details.

    A declared ``Content-Length`` over the bound is refused before the app
    runs; a body that grows past it while read raises a 413 HTTPException,
    which the app answers (FastAPI passes it through its body parsing).
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, max_import_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_import_bytes = max_import_bytes

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        """Count the body as it is received."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bound = self.max_import_bytes if route_path(scope) == IMPORT_PATH else self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > bound:
            body = problem("InvalidInput", 413, _too_large(bound))
            response = JSONResponse(body, status_code=413, media_type=PROBLEM_JSON)
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > bound:
                    raise HTTPException(413, _too_large(bound))
            return message

        await self.app(scope, counted, send)


def _too_large(bound: int) -> str:
    return f"the request body is larger than {bound} bytes"


def _content_length(scope: ASGIScope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _fastapi_telemetry_off() -> dict[str, Any]:
    """FastAPI's own request telemetry turned off, where its release has any (0.165 and later).

    It traces every request whenever a global provider is set: beside
    cortex's span each request would be two spans, and one even with
    ``telemetry=False``.
    """
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    off = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}
    return {"telemetry": off}


def create_app(
    store_or_url: Store | str | URL,
    *,
    signing_key: str | bytes | SigningKey,
    cursor_key: bytes | None = None,
    cors_origins: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_import_bytes: int = DEFAULT_MAX_IMPORT_BYTES,
    middleware: Iterable[Callable[[ASGIApp], ASGIApp]] = (),
    telemetry: bool = True,
    access_log: bool = False,
    record_scope: bool = False,
    registry: CollectorRegistry | None = None,
    tracer_provider: TracerProvider | None = None,
    console_url: str | URL | None = None,
    secure_cookies: bool = False,
    console_audit_scope: str = DEFAULT_AUDIT_SCOPE,
    **pool_options: Any,
) -> FastAPI:
    """Cortex's HTTP API on a store (the host's, which it keeps) or a URL (opened and closed here).

    Args:
        store_or_url: a :class:`cortex.Store`, or the URL ``cortex.connect`` takes.
        signing_key: verifies bearer tokens: a secret of at least 32 bytes
            (HS256), or a PEM public key (RS256, ES256, EdDSA).
        cursor_key: signs listing cursors; default: derived from an HS256
            secret, else random per process (give one to every replica
            behind one address, so a cursor works on each).
        cors_origins: origins browsers may call from; none (CORS off) by default.
        max_body_bytes: the largest request body; 413 beyond it.
        max_import_bytes: the same, for ``POST /v1/scope/import``.
        middleware: ASGI middleware factories wrapped around the API (each
            ``factory(app) -> app``, the first outermost): where a host adds
            their own middleware.
        telemetry: a server span per request (continuing the caller's
            ``traceparent``) and request metrics, Prometheus's ``/metrics``
            (no token), and spans and metrics for each call of a store the
            app opens (a host's store keeps the host's choice:
            :func:`cortex.telemetry.instrument`). Spans go nowhere until
            OpenTelemetry is configured (``tracer_provider``, or the
            global one ``opentelemetry-instrument`` installs).
        access_log: one JSON line per request on the ``cortex.access`` logger.
        record_scope: put the scope path (tenant data) on each store span.
        registry: the Prometheus registry (default: prometheus_client's global one).
        tracer_provider: where spans go (default: OpenTelemetry's global provider).
        console_url: the operator console's login, granted ``cortex_console``
            (docs/console.md); default: the store's own login, which works
            when it is a superuser or was granted the role.
        secure_cookies: mark the console's cookies Secure even when the
            request did not arrive over TLS (behind a TLS-terminating proxy).
        console_audit_scope: where sign-ins and sign-outs of every-tenant
            operators are recorded (they have no tenant of their own).
        pool_options: for ``cortex.connect`` when a URL is given.

    Raises:
        InvalidInput: the signing key is missing, short or of an unknown kind.
    """
    key = signing_key if isinstance(signing_key, SigningKey) else SigningKey.parse(signing_key)
    on_open: Callable[[Store], None] | None = None
    if telemetry:
        from cortex.telemetry import instrument

        def on_open(store: Store) -> None:
            instrument(
                store,
                tracer_provider=tracer_provider,
                registry=registry,
                record_scope=record_scope,
            )

    holder = StoreHolder(store_or_url, pool_options, on_open)
    holder.signer = CursorSigner(cursor_key or key.secret or secrets.token_bytes(32))
    console = Console(
        holder.store,
        key,
        cursor_key or key.secret or secrets.token_bytes(32),
        console_url=console_url,
        secure_cookies=secure_cookies,
        audit_scope=console_audit_scope,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if holder.owned:
            try:
                await holder.store()
            except CortexError as exc:
                # Served all the same: /readyz says 503 until the database answers.
                log.warning("cortex: the database is not ready: %s", exc)
        try:
            yield
        finally:
            await console.close()
            await holder.close()

    app = FastAPI(
        title="cortex",
        version=__version__,
        description="cortex's HTTP API: sessions, messages and scope state, per tenant scope.",
        openapi_url="/v1/openapi.json",
        docs_url="/v1/docs",
        redoc_url=None,
        lifespan=lifespan,
        responses={
            status: {"model": Problem, "description": text} for status, text in _PROBLEMS.items()
        },
        **_fastapi_telemetry_off(),
    )
    app.state.cortex = holder
    _install_handlers(app)
    _add_health(app, holder)
    app.include_router(router)
    if telemetry:
        from cortex.telemetry import metrics_app

        app.router.routes.append(Route(METRICS_PATH, metrics_app(registry), methods=["GET"]))
    install_console(app, console)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented hook
    # Added innermost first: Starlette puts the last one added outermost.
    app.add_middleware(AuthMiddleware, key=key, open_paths=OPEN_PATHS)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, max_import_bytes=max_import_bytes)
    for factory in reversed(list(middleware)):
        app.add_middleware(_Wrapped, factory=factory)
    if telemetry or access_log:
        from cortex.telemetry import TelemetryMiddleware

        if not telemetry:
            # An access log alone: its metrics go to a registry nobody serves, its spans nowhere.
            from opentelemetry.trace import NoOpTracerProvider
            from prometheus_client import CollectorRegistry

            registry, tracer_provider = CollectorRegistry(), NoOpTracerProvider()
        app.add_middleware(
            TelemetryMiddleware,
            registry=registry,
            tracer_provider=tracer_provider,
            access_log=access_log,
            exclude_paths={METRICS_PATH},
        )
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "PATCH", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Cortex-Scope"],
        )
    return app


class _Wrapped:
    """A host's ``factory(app) -> app`` as a Starlette middleware class."""

    def __init__(self, app: ASGIApp, *, factory: Callable[[ASGIApp], ASGIApp]) -> None:
        self.app = factory(app)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _problem_response(
    body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON, headers=headers)


def _install_handlers(app: FastAPI) -> None:
    async def on_cortex_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, CortexError)  # registered for CortexError only
        if isinstance(exc, InvalidCursor):
            return _problem_response(problem("InvalidInput", 400, str(exc)))
        return _problem_response(error_body(exc, cortex_status(exc)))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)  # registered for it only
        name = {404: "NotFound", 405: "MethodNotAllowed", 413: "InvalidInput"}.get(
            exc.status_code, "HTTPError"
        )
        return _problem_response(
            problem(name, exc.status_code, str(exc.detail)), headers=exc.headers
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "cortex: unexpected error on %s %s", request.method, request.url.path, exc_info=exc
        )
        return _problem_response(
            problem("InternalError", 500, "an unexpected error; see the server's log")
        )

    app.add_exception_handler(CortexError, on_cortex_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(Exception, on_unexpected)


def _add_health(app: FastAPI, holder: StoreHolder) -> None:
    @app.get("/healthz", tags=["health"], responses={})
    async def healthz() -> dict[str, str]:
        """The process is up (nothing else is checked)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> dict[str, str]:
        """The database answers and serves this code's schema revision; 503 otherwise."""
        store = await holder.store()
        await check_schema(store.engine)
        return {"status": "ready", "revision": SCHEMA_REVISION}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with errors under ``application/problem+json`` as they are sent."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            responses = operation.get("responses", {})
            if path == "/healthz":
                responses.pop("500", None)
                for status in [s for s in responses if s != "200"]:
                    responses.pop(status)
            elif not path.startswith("/v1/"):
                for status in [s for s in responses if s not in ("200", "500", "503")]:
                    responses.pop(status)
            for status, response in responses.items():
                content = response.get("content", {})
                if status.startswith(("4", "5")) and "application/json" in content:
                    content[PROBLEM_JSON] = content.pop("application/json")
    app.openapi_schema = schema
    return schema
