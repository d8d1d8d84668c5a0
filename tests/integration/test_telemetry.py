"""Telemetry: spans and metrics for store calls and for HTTP requests, off unless asked for.

A real PostgreSQL; spans caught by OpenTelemetry's in-memory exporter on a
tracer provider of each test's own (never the global one), metrics on a
fresh Prometheus registry per test. The HTTP half runs a Starlette app in a
real uvicorn server on a loopback port, driven by httpx.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

import cortex
from cortex import NewMessage, use_scope
from cortex.ids import format_id, new_uuid
from cortex.telemetry import UNMATCHED, TelemetryMiddleware, instrument, metrics_app, uninstrument
from tests.conftest import Database, store_url

pytestmark = pytest.mark.sqlalchemy20


@dataclass
class Traced:
    provider: TracerProvider
    exporter: InMemorySpanExporter
    registry: CollectorRegistry

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span

    def value(self, metric: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(metric, labels)


@pytest.fixture
def traced() -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Traced(provider, exporter, CollectorRegistry())
    provider.shutdown()


@pytest.fixture
async def watched(store: cortex.Store, traced: Traced) -> cortex.Store:
    instrument(store, tracer_provider=traced.provider, registry=traced.registry)
    return store


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# --- the library ----------------------------------------------------------------


async def test_each_store_call_is_a_span_with_its_attributes(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    with use_scope(tenant):
        session = await watched.create_session("bot")
        await watched.append_messages(
            session.id, [NewMessage("user", "a"), NewMessage("user", "b")]
        )
        await watched.list_sessions()
    created = attributes(traced.one("cortex.create_session"))
    assert created == {
        "cortex.operation": "create_session",
        "cortex.agent_id": "bot",
        "cortex.rows": 1,
        "cortex.outcome": "ok",
    }
    assert attributes(traced.one("cortex.append_messages"))["cortex.rows"] == 2
    listed = traced.one("cortex.list_sessions")
    assert attributes(listed)["cortex.rows"] == 1
    assert "cortex.agent_id" not in attributes(listed)
    assert listed.kind is SpanKind.INTERNAL
    assert listed.status.status_code is StatusCode.UNSET
    # A scope names a tenant: it is on no span unless asked for.
    assert all(tenant not in repr(attributes(s)) for s in traced.spans())


async def test_a_store_span_is_the_child_of_the_callers_span(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    tracer = traced.provider.get_tracer("host")
    with use_scope(tenant), tracer.start_as_current_span("handler") as handler:
        session = await watched.create_session("bot")
        await watched.get_session(session.id)
    got = traced.one("cortex.get_session")
    assert got.parent is not None
    assert got.parent.span_id == handler.get_span_context().span_id
    assert got.context is not None
    assert got.context.trace_id == handler.get_span_context().trace_id


async def test_the_scope_is_recorded_only_when_configured(
    store: cortex.Store, traced: Traced, tenant: str
) -> None:
    instrument(store, tracer_provider=traced.provider, registry=traced.registry, record_scope=True)
    with use_scope(f"{tenant}/u1"):
        await store.list_sessions()
    assert attributes(traced.one("cortex.list_sessions"))["cortex.scope"] == f"{tenant}/u1"


async def test_errors_are_recorded_by_their_cortex_class_never_their_message(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    missing = format_id("ses", new_uuid())
    with use_scope(tenant):
        with pytest.raises(cortex.NotFound):
            await watched.get_session(missing)
        with pytest.raises(cortex.InvalidInput):  # refused by the validation boundary
            await watched.get_session("not an id")
    with pytest.raises(cortex.ScopeMissing):
        await watched.list_sessions()
    spans = traced.spans("cortex.get_session")
    assert [attributes(s)["error.type"] for s in spans] == ["NotFound", "InvalidInput"]
    for span in [*spans, traced.one("cortex.list_sessions")]:
        assert span.status.status_code is StatusCode.ERROR
        assert attributes(span)["cortex.outcome"] == attributes(span)["error.type"]
        assert not span.events  # no exception event: its message may name the scope
        assert tenant not in repr(attributes(span)) + str(span.status.description)
    assert (
        traced.value("cortex_store_calls_total", operation="get_session", outcome="NotFound") == 1
    )
    assert (
        traced.value("cortex_store_calls_total", operation="list_sessions", outcome="ScopeMissing")
        == 1
    )


async def test_the_call_metrics_count_every_call(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    with use_scope(tenant):
        session = await watched.create_session("bot")
        for _ in range(7):
            await watched.get_session(session.id)
    assert traced.value("cortex_store_calls_total", operation="get_session", outcome="ok") == 7
    assert traced.value("cortex_store_calls_total", operation="create_session", outcome="ok") == 1
    assert traced.value("cortex_store_call_duration_seconds_count", operation="get_session") == 7
    duration = traced.value("cortex_store_call_duration_seconds_sum", operation="get_session")
    assert duration is not None
    assert duration > 0


async def test_an_iterator_is_one_span_from_its_first_page_to_its_end_and_the_pool_gauge_sees_it(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    in_use = "cortex_pool_connections_in_use"
    with use_scope(tenant):
        for _ in range(3):
            await watched.create_session("bot")
        assert traced.value(in_use) == 0
        walk = watched.iter_sessions()
        assert await anext(walk)
        # The walk holds its snapshot's connection until it ends.
        assert traced.value(in_use) == 1
        assert [s async for s in walk]
        records = [r async for r in watched.export_scope()]
        early = watched.export_scope()
        await anext(early)
        await early.aclose()
    assert traced.value(in_use) == 0
    walked = traced.one("cortex.iter_sessions")
    assert attributes(walked)["cortex.rows"] == 3
    assert attributes(walked)["cortex.outcome"] == "ok"
    exported, closed = traced.spans("cortex.export_scope")
    assert attributes(exported)["cortex.rows"] == len(records)
    assert attributes(closed)["cortex.rows"] == 1
    assert attributes(closed)["cortex.outcome"] == "ok"
    assert traced.value("cortex_store_calls_total", operation="export_scope", outcome="ok") == 2


async def test_a_refused_iterator_is_an_errored_span(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    with use_scope(tenant), pytest.raises(cortex.InvalidInput):
        watched.iter_sessions(cortex.ListFilter(offset=5))
    assert attributes(traced.one("cortex.iter_sessions"))["error.type"] == "InvalidInput"


async def test_instrumenting_one_store_leaves_another_alone(
    database: Database, watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    async with cortex.connect(store_url(database)) as other:
        with use_scope(tenant):
            await other.list_sessions()
            await watched.list_sessions()
            assert len(traced.spans("cortex.list_sessions")) == 1
            uninstrument(watched)
            await watched.list_sessions()
    assert len(traced.spans("cortex.list_sessions")) == 1
    assert traced.value("cortex_store_calls_total", operation="list_sessions", outcome="ok") == 1


def test_importing_cortex_imports_no_telemetry_library() -> None:
    code = (
        "import sys, cortex, cortex.asgi, cortex.store;"
        "found = sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('opentelemetry', 'prometheus_client') or m == 'cortex.telemetry');"
        "assert not found, found"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- HTTP -------------------------------------------------------------------------


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` in a uvicorn server on a loopback port of its own, and a client for it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        with anyio.fail_after(10):
            # uvicorn's Server says it is listening by a flag only, no event.
            while not server.started:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


def web_app(store: cortex.Store, tenant: str, traced: Traced, chunks: asyncio.Event) -> Any:
    async def get(request: Request) -> JSONResponse:
        with use_scope(tenant):
            session = await store.get_session(request.path_params["session_id"])
        return JSONResponse({"id": session.id})

    async def boom(request: Request) -> JSONResponse:
        raise RuntimeError("boom")

    async def stream(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            await chunks.wait()  # set by the client once it holds the first chunk
            yield b"second\n"

        return StreamingResponse(body())

    app = Starlette(
        routes=[
            Route("/sessions/{session_id}", get),
            Route("/boom", boom),
            Route("/stream", stream),
            Route("/metrics", metrics_app(traced.registry)),
        ]
    )
    return TelemetryMiddleware(
        app,
        registry=traced.registry,
        tracer_provider=traced.provider,
        access_log=True,
        exclude_paths={"/metrics"},
    )


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def test_a_request_continues_the_callers_trace_under_its_route_template(
    watched: cortex.Store, traced: Traced, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    with use_scope(tenant):
        session = await watched.create_session("bot")
    caplog.set_level(logging.INFO, logger="cortex.access")
    app = web_app(watched, tenant, traced, asyncio.Event())
    async with serving(app) as client:
        reply = await client.get(
            f"/sessions/{session.id}",
            headers={
                "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
                "authorization": "Bearer secret-token",
            },
        )
        assert reply.json() == {"id": session.id}
        assert (await client.get(f"/nowhere/{session.id}")).status_code == 404
        assert (await client.delete(f"/sessions/{session.id}")).status_code == 405
        assert (await client.get("/boom")).status_code == 500

    server = traced.one("GET /sessions/{session_id}")
    assert server.kind is SpanKind.SERVER
    assert server.context is not None
    assert server.parent is not None
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    assert attributes(server) == {
        "http.request.method": "GET",
        "url.scheme": "http",
        "http.route": "/sessions/{session_id}",
        "http.response.status_code": 200,
    }
    store_span = traced.one("cortex.get_session")
    assert store_span.parent is not None
    assert store_span.parent.span_id == server.context.span_id

    unmatched = traced.one("GET")
    assert attributes(unmatched)["http.response.status_code"] == 404
    assert "http.route" not in attributes(unmatched)
    failed = traced.one("GET /boom")
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"] == "RuntimeError"

    requests = "cortex_http_requests_total"
    route = "/sessions/{session_id}"
    assert traced.value(requests, method="GET", route=route, status="200") == 1
    assert traced.value(requests, method="DELETE", route=route, status="405") == 1
    assert traced.value(requests, method="GET", route=UNMATCHED, status="404") == 1
    assert traced.value(requests, method="GET", route="/boom", status="500") == 1
    seconds = "cortex_http_request_duration_seconds_count"
    assert traced.value(seconds, method="GET", route=route) == 1

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "cortex.access"]
    assert [(x["method"], x["route"], x["status"]) for x in lines] == [
        ("GET", route, 200),
        ("GET", UNMATCHED, 404),
        ("DELETE", route, 405),
        ("GET", "/boom", 500),
    ]
    assert set(lines[0]) == {"method", "route", "status", "duration_ms", "trace_id"}
    assert lines[0]["trace_id"] == TRACE_ID
    assert lines[0]["duration_ms"] > 0
    assert "secret-token" not in caplog.text
    assert session.id not in "".join(r.getMessage() for r in caplog.records)


async def test_metrics_are_served_parseable_and_scrapes_are_not_traffic(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    with use_scope(tenant):
        session = await watched.create_session("bot")
    async with serving(web_app(watched, tenant, traced, asyncio.Event())) as client:
        await client.get(f"/sessions/{session.id}")
        text = (await client.get("/metrics")).text
        await client.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    calls = {
        (s.labels["operation"], s.labels["outcome"]): s.value
        for s in families["cortex_store_calls"].samples
        if s.name == "cortex_store_calls_total"
    }
    assert calls == {("create_session", "ok"): 1, ("get_session", "ok"): 1}
    routes = {s.labels["route"] for s in families["cortex_http_requests"].samples}
    assert routes == {"/sessions/{session_id}"}
    assert "cortex_http_request_duration_seconds" in families
    assert "cortex_pool_connections_in_use" in families
    assert not traced.spans("GET /metrics")


async def test_a_streamed_response_stays_streamed(
    watched: cortex.Store, traced: Traced, tenant: str
) -> None:
    chunks = asyncio.Event()
    async with (
        serving(web_app(watched, tenant, traced, chunks)) as client,
        client.stream("GET", "/stream") as reply,
    ):
        lines = reply.aiter_lines()
        with anyio.fail_after(10):  # a buffering middleware would never give the first line
            assert await anext(lines) == "first"
        chunks.set()
        assert [line async for line in lines] == ["second"]
    span = traced.one("GET /stream")
    assert attributes(span)["http.response.status_code"] == 200
