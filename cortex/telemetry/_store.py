"""Spans and Prometheus metrics for one store's calls: the observer behind :func:`instrument`.

The store reports each public call to its observer (cortex._observe); this
module turns the report into an OpenTelemetry span, a call counter and a
duration histogram, and reads the store's pool for a gauge. It must not
record a scope path unless asked (a scope names a tenant) and never an
error's message (a message may name one too).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cortex._calls.messages import SessionHistory
from cortex._version import __version__
from cortex.errors import ScopeMissing
from cortex.models import Message, Session, SessionDetail
from cortex.scope import current_scope
from cortex.store import Store

__all__ = ["instrument", "uninstrument"]

T = TypeVar("T")

# Store calls take from a fraction of a millisecond (a routine on a pooled
# connection) to minutes (an erasure, an export): buckets span both.
STORE_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

OK: Final = "ok"


class _PoolCollector(Collector):
    """``cortex_pool_connections_in_use``: connections checked out of the instrumented stores' pools."""

    def __init__(self) -> None:
        # Weak, so a store closed and dropped leaves the registry's collector.
        self.stores: weakref.WeakSet[Store] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        in_use = 0
        for store in list(self.stores):
            checkedout = getattr(store.engine.pool, "checkedout", None)
            if checkedout is not None:  # NullPool and StaticPool keep no count
                in_use += checkedout()
        yield GaugeMetricFamily(
            "cortex_pool_connections_in_use",
            "Connections checked out of the pools of the stores instrumented on this registry.",
            value=in_use,
        )


class _StoreMetrics:
    """The store metrics of one registry, shared by every store instrumented on it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "cortex_store_calls",
            "Store calls, by operation and outcome (ok, or the error class).",
            ("operation", "outcome"),
            registry=registry,
        )
        self.duration = Histogram(
            "cortex_store_call_duration_seconds",
            "Store call duration, by operation (an iterator's: from its first page to its end).",
            ("operation",),
            registry=registry,
            buckets=STORE_BUCKETS,
        )
        self.pool = _PoolCollector()
        registry.register(self.pool)
        # Label children looked up once: labels() takes a lock and builds a key each time.
        self.counted: dict[tuple[str, str], Any] = {}
        self.timed: dict[str, Any] = {}

    def record(self, operation: str, outcome: str, seconds: float) -> None:
        counted = self.counted.get((operation, outcome))
        if counted is None:
            counted = self.counted[operation, outcome] = self.calls.labels(operation, outcome)
        timed = self.timed.get(operation)
        if timed is None:
            timed = self.timed[operation] = self.duration.labels(operation)
        counted.inc()
        timed.observe(seconds)


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _StoreMetrics] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _metrics_of(registry: CollectorRegistry) -> _StoreMetrics:
    with _lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = _StoreMetrics(registry)
        return found


def _rows(result: object) -> int | None:
    """Rows a call returned or wrote, where its result says so."""
    if isinstance(result, list):
        return len(result)
    if isinstance(result, SessionHistory):
        return len(result.messages)
    if isinstance(result, Session | Message | SessionDetail):
        return 1
    return None


def _outcome(exc: BaseException) -> str:
    # A class name, never the message: messages may name a scope or a key.
    return type(exc).__name__


class _Telemetry:
    """The observer :func:`instrument` gives a store."""

    def __init__(self, tracer: trace.Tracer, metrics: _StoreMetrics, record_scope: bool) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.record_scope = record_scope

    def _attributes(self, operation: str, agent_id: str | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {"cortex.operation": operation}
        if agent_id is not None:
            attributes["cortex.agent_id"] = agent_id
        if self.record_scope:
            # Without a scope the call itself refuses, and its span says so.
            with contextlib.suppress(ScopeMissing):
                attributes["cortex.scope"] = str(current_scope())
        return attributes

    def _failed(self, span: Span, exc: BaseException) -> str:
        outcome = _outcome(exc)
        span.set_attribute("cortex.outcome", outcome)
        span.set_attribute("error.type", outcome)
        span.set_status(Status(StatusCode.ERROR, outcome))
        return outcome

    def call(self, operation: str, agent_id: str | None, call: Awaitable[T]) -> Awaitable[T]:
        return self._call(operation, agent_id, call)

    async def _call(self, operation: str, agent_id: str | None, call: Awaitable[T]) -> T:
        began = time.perf_counter()
        outcome = OK
        with self.tracer.start_as_current_span(
            f"cortex.{operation}",
            kind=SpanKind.INTERNAL,
            attributes=self._attributes(operation, agent_id),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await call
            except BaseException as exc:
                outcome = self._failed(span, exc)
                raise
            else:
                rows = _rows(result)
                if rows is not None:
                    span.set_attribute("cortex.rows", rows)
                span.set_attribute("cortex.outcome", OK)
                return result
            finally:
                self.metrics.record(operation, outcome, time.perf_counter() - began)

    def walk(
        self, operation: str, start: Callable[[], AsyncGenerator[T, None]]
    ) -> AsyncGenerator[T, None]:
        # The caller's context now, so the span is the child of the span that made the iterator.
        parent = otel_context.get_current()
        attributes = self._attributes(operation, None)
        try:
            walk = start()
        except BaseException as exc:
            span = self.tracer.start_span(
                f"cortex.{operation}", parent, SpanKind.INTERNAL, attributes
            )
            self.metrics.record(operation, self._failed(span, exc), 0.0)
            span.end()
            raise
        return self._walk(operation, walk, parent, attributes)

    async def _walk(
        self,
        operation: str,
        walk: AsyncGenerator[T, None],
        parent: otel_context.Context,
        attributes: dict[str, Any],
    ) -> AsyncGenerator[T, None]:
        span = self.tracer.start_span(f"cortex.{operation}", parent, SpanKind.INTERNAL, attributes)
        # Current while a page is read (so spans beneath, a driver's, nest here), not while yielded.
        inside = trace.set_span_in_context(span, parent)
        began = time.perf_counter()
        outcome = OK
        rows = 0
        try:
            while True:
                token = otel_context.attach(inside)
                try:
                    item = await anext(walk)
                except StopAsyncIteration:
                    break
                finally:
                    otel_context.detach(token)
                rows += 1
                yield item
        except GeneratorExit:
            span.set_attribute("cortex.outcome", OK)  # the consumer stopped early
            raise
        except BaseException as exc:
            outcome = self._failed(span, exc)
            raise
        else:
            span.set_attribute("cortex.outcome", OK)
        finally:
            await walk.aclose()
            span.set_attribute("cortex.rows", rows)
            self.metrics.record(operation, outcome, time.perf_counter() - began)
            span.end()


def instrument(
    store: Store,
    *,
    tracer_provider: TracerProvider | None = None,
    registry: CollectorRegistry | None = None,
    record_scope: bool = False,
) -> None:
    """Give ``store`` a span per public call and Prometheus metrics; other stores are untouched.

    Each call of a public :class:`cortex.Store` method becomes a span named
    ``cortex.<method>`` (``cortex.get_session``...), a child of the
    caller's current span, with the attributes ``cortex.operation``,
    ``cortex.agent_id`` (calls that name one), ``cortex.rows`` (rows
    returned or written, where the result says: a list's length, 1 for a
    session or message, the rows an iterator yielded) and
    ``cortex.outcome`` (``ok`` or the error's class, also ``error.type``,
    with the span's status ERROR). An error's message is never recorded: it
    may name a scope. ``cortex.scope`` (the scope path the call acts in)
    only with ``record_scope=True``: a scope names a tenant.

    On ``registry`` (default: prometheus_client's global ``REGISTRY``):
    ``cortex_store_calls_total{operation, outcome}``,
    ``cortex_store_call_duration_seconds{operation}`` and
    ``cortex_pool_connections_in_use``. Stores instrumented on one registry
    share these (the gauge adds their pools up).

    Instrumenting a store again replaces its settings; :func:`uninstrument`
    turns it off. A store never instrumented pays a None check per call.

    Args:
        store: the store to watch.
        tracer_provider: where spans go (default: OpenTelemetry's global
            provider, a no-op until the application installs one).
        registry: the Prometheus registry for the metrics.
        record_scope: record the scope path on each span.
    """
    uninstrument(store)
    tracer = trace.get_tracer("cortex", __version__, tracer_provider=tracer_provider)
    metrics = _metrics_of(REGISTRY if registry is None else registry)
    metrics.pool.stores.add(store)
    store._observer = _Telemetry(tracer, metrics, record_scope)


def uninstrument(store: Store) -> None:
    """Stop watching ``store``: its calls pay a None check again. Metrics recorded stay."""
    observer = store._observer
    if isinstance(observer, _Telemetry):
        observer.metrics.pool.stores.discard(store)
    store._observer = None
