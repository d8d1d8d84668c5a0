"""Telemetry for an HTTP service on cortex: a pure ASGI middleware and the metrics endpoint.

Framework-free: no import of Starlette or FastAPI. The route label is the
route's template, read from ``scope["route"].path_format`` when a router
(Starlette, FastAPI) has set it, so a label never holds an id, a key or a
scope from the path; a request no route matched is labelled
``UNMATCHED``. The middleware passes every message through as it comes, so a
streamed response stays streamed. It must not record a request's path,
headers or body: they carry credentials and tenant data.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Collection, MutableMapping
from typing import Any, Final

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, make_asgi_app

from cortex._version import __version__
from cortex.asgi import ASGIApp, ASGIScope, Receive, Send
from cortex.telemetry._store import STORE_BUCKETS

__all__ = ["UNMATCHED", "TelemetryMiddleware", "metrics_app"]

UNMATCHED: Final = "UNMATCHED"
"""The route label of a request no route matched (its raw path would be unbounded)."""

# Methods outside this set share one label, as OpenTelemetry's conventions say.
_METHODS: Final = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
)
_OTHER_METHOD: Final = "_OTHER"

# The store's buckets but the half millisecond: no request through the HTTP stack is that quick.
HTTP_BUCKETS: Final = STORE_BUCKETS[1:]

access_log = logging.getLogger("cortex.access")


class _HttpMetrics:
    """The request metrics of one registry, shared by every middleware on it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "cortex_http_requests",
            "HTTP requests, by method, route template and status code.",
            ("method", "route", "status"),
            registry=registry,
        )
        self.duration = Histogram(
            "cortex_http_request_duration_seconds",
            "HTTP request duration, to the response's last byte, by method and route template.",
            ("method", "route"),
            registry=registry,
            buckets=HTTP_BUCKETS,
        )


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _HttpMetrics] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _metrics_of(registry: CollectorRegistry) -> _HttpMetrics:
    with _lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = _HttpMetrics(registry)
        return found


def _route(scope: ASGIScope) -> str:
    """The matched route's template, or UNMATCHED."""
    template = getattr(scope.get("route"), "path_format", None)
    return template if isinstance(template, str) else UNMATCHED


def _carrier(scope: ASGIScope, fields: Collection[str]) -> dict[str, str]:
    """The request headers the propagator reads (``traceparent``...), and no other."""
    carrier: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or ():
        name = raw_name.decode("latin-1").lower()
        if name in fields:
            value = raw_value.decode("latin-1")
            carrier[name] = f"{carrier[name]},{value}" if name in carrier else value
    return carrier


class TelemetryMiddleware:
    """A pure ASGI middleware: a server span, metrics and an access log line per HTTP request.

    Each ``http`` request gets a SERVER span continuing the trace of its
    ``traceparent`` header (W3C trace context, through OpenTelemetry's
    global propagator), current while the app runs, so the spans of the
    store calls it makes (:func:`cortex.telemetry.instrument`) are its
    children. The span is named ``METHOD route`` and carries
    ``http.request.method``, ``http.route``, ``url.scheme`` and
    ``http.response.status_code``; a 5xx or an exception sets its status to
    ERROR (an exception's class is ``error.type``). On ``registry``:
    ``cortex_http_requests_total{method, route, status}`` and
    ``cortex_http_request_duration_seconds{method, route}``. ``route`` is
    the route template (``/sessions/{session_id}``), ``UNMATCHED`` when no
    route matched; a method outside the standard ones is ``_OTHER``.

    With ``access_log``, one JSON line per request on the ``cortex.access``
    logger at INFO: ``method``, ``route``, ``status``, ``duration_ms``,
    ``trace_id`` (32 hex digits, or null without a recording span). Never
    the path, a header or a body.

    Lifespan and websocket traffic, and requests to ``exclude_paths``,
    pass through untouched. Messages are passed on as they come: a
    streamed response streams, and its duration runs to its last byte.

    Args:
        app: the ASGI app to wrap.
        registry: the Prometheus registry for the metrics (default:
            prometheus_client's global ``REGISTRY``).
        tracer_provider: where spans go (default: OpenTelemetry's global provider).
        access_log: log one JSON line per request on ``cortex.access``.
        exclude_paths: exact request paths left alone (``/metrics``, a health check).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
        access_log: bool = False,
        exclude_paths: Collection[str] = (),
    ) -> None:
        self.app = app
        self.metrics = _metrics_of(REGISTRY if registry is None else registry)
        self.tracer = trace.get_tracer("cortex.http", __version__, tracer_provider=tracer_provider)
        self.access_log = access_log
        self.exclude_paths = frozenset(exclude_paths)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.exclude_paths:
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        if method not in _METHODS:
            method = _OTHER_METHOD
        parent = propagate.extract(_carrier(scope, propagate.get_global_textmap().fields))
        status = 500  # what the server answers if the app fails before its response starts
        began = time.perf_counter()

        async def send_observed(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with self.tracer.start_as_current_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.scheme": scope.get("scheme", "http"),
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await self.app(scope, receive, send_observed)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            finally:
                seconds = time.perf_counter() - began
                route = _route(scope)
                if route != UNMATCHED:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                self.metrics.requests.labels(method, route, str(status)).inc()
                self.metrics.duration.labels(method, route).observe(seconds)
                if self.access_log and access_log.isEnabledFor(logging.INFO):
                    self._log(method, route, status, seconds, span)

    def _log(self, method: str, route: str, status: int, seconds: float, span: Any) -> None:
        context = span.get_span_context()
        line = {
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "trace_id": trace.format_trace_id(context.trace_id) if context.is_valid else None,
        }
        access_log.info(json.dumps(line, separators=(",", ":")))


class _MetricsApp:
    """prometheus_client's exposition app as an object, so a router mounts it as an ASGI app.

    Starlette calls a plain function given as a route's endpoint with a
    Request; an instance with ``__call__`` it runs as an ASGI app.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.app: ASGIApp = make_asgi_app(registry)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def metrics_app(registry: CollectorRegistry | None = None) -> ASGIApp:
    """An ASGI app answering every HTTP request with ``registry``'s metrics, for Prometheus.

    The Prometheus text format (or OpenMetrics, if the scraper asks for it),
    gzipped when accepted. Serve it where Prometheus scrapes, e.g.
    ``Route("/metrics", metrics_app(registry))`` among a Starlette or
    FastAPI app's ``routes``, and keep that path out of the middleware
    (``exclude_paths``) so scrapes are not counted as traffic.

    Args:
        registry: the registry to serve (default: prometheus_client's global ``REGISTRY``).
    """
    return _MetricsApp(REGISTRY if registry is None else registry)
