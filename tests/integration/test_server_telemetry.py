"""The server's telemetry over real HTTP: spans continuing the caller's trace, /metrics, access logs."""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from cortex.server import SigningKey, create_app, issue_token
from tests.conftest import Database
from tests.serving import running

KEY = secrets.token_urlsafe(32)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _headers(scope: str) -> dict[str, str]:
    token = issue_token(SigningKey.parse(KEY), scope=scope, role="app")
    return {"Authorization": f"Bearer {token}"}


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def test_spans_continue_the_callers_trace_and_metrics_count_requests(
    database: Database, tenant: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    app = create_app(database.app_url, signing_key=KEY, registry=registry, tracer_provider=provider)
    with running(app) as base:
        async with httpx.AsyncClient(base_url=base, headers=_headers(tenant), timeout=30) as c:
            created = await c.post(
                "/v1/sessions", json={"agent_id": "bot"}, headers={"traceparent": TRACEPARENT}
            )
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            assert (await c.get(f"/v1/sessions/{sid}")).status_code == 200
            assert (await c.get("/v1/sessions/ses_01h455vb4pex5vsknk084sn02q")).status_code == 404
            metrics = await c.get("/metrics")
    assert metrics.status_code == 200
    spans = exporter.get_finished_spans()
    server = [s for s in spans if s.kind is SpanKind.SERVER]
    assert {s.attributes["http.route"] for s in server if s.attributes} >= {
        "/v1/sessions",
        "/v1/sessions/{session_id}",
    }
    first = next(s for s in server if s.attributes and s.attributes["http.route"] == "/v1/sessions")
    assert format(first.context.trace_id, "032x") == TRACE_ID
    create = next(s for s in spans if s.name == "cortex.create_session")
    # The store's span is a child of the request's, in the caller's trace.
    assert create.parent is not None
    assert create.parent.span_id == first.context.span_id
    assert format(create.context.trace_id, "032x") == TRACE_ID
    requests = _samples(metrics.text, "cortex_http_requests_total")
    by_route = {(labels["route"], labels["status"]): value for labels, value in requests}
    assert by_route[("/v1/sessions", "201")] == 1
    assert by_route[("/v1/sessions/{session_id}", "200")] == 1
    assert by_route[("/v1/sessions/{session_id}", "404")] == 1
    calls = _samples(metrics.text, "cortex_store_calls_total")
    outcomes = {(labels["operation"], labels["outcome"]): value for labels, value in calls}
    assert outcomes[("create_session", "ok")] == 1
    assert outcomes[("get_session", "ok")] == 1
    assert outcomes[("get_session", "NotFound")] == 1
    assert _samples(metrics.text, "cortex_pool_connections_in_use")


async def test_telemetry_off_serves_no_metrics(database: Database, tenant: str) -> None:
    app = create_app(database.app_url, signing_key=KEY, telemetry=False)
    with running(app) as base:
        async with httpx.AsyncClient(base_url=base, headers=_headers(tenant), timeout=30) as c:
            assert (await c.post("/v1/sessions", json={"agent_id": "bot"})).status_code == 201
            missing = await c.get("/metrics")
    assert missing.status_code == 404


async def test_access_log_lines_are_json_without_the_token(
    database: Database, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(
        database.app_url, signing_key=KEY, registry=CollectorRegistry(), access_log=True
    )
    headers = _headers(tenant)
    with caplog.at_level(logging.INFO, logger="cortex.access"), running(app) as base:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as c:
            assert (await c.get("/v1/sessions/count")).status_code == 200
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "cortex.access"]
    assert any(line["route"] == "/v1/sessions/count" and line["status"] == 200 for line in lines), (
        lines
    )
    token = headers["Authorization"].split()[1]
    assert all(token not in r.getMessage() for r in caplog.records)


_GLOBAL_PROVIDER = """
import json, sys
import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from cortex.server import SigningKey, create_app, issue_token
from tests.serving import running

url, key, scope, telemetry = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "on"
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
token = issue_token(SigningKey.parse(key), scope=scope, role="app")
app = create_app(url, signing_key=key, registry=CollectorRegistry(), telemetry=telemetry)
with running(app) as base:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as c:
        assert c.post("/v1/sessions", json={"agent_id": "bot"}).status_code == 201
        assert c.get("/v1/sessions/count").status_code == 200
        assert c.get("/v1/sessions/ses_01h455vb4pex5vsknk084sn02q").status_code == 404
server = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
print(json.dumps(sorted(s.name for s in server)))
"""


@pytest.mark.parametrize("telemetry", ["on", "off"])
def test_a_global_provider_gets_one_server_span_a_request(
    database: Database, tenant: str, telemetry: str
) -> None:
    """With the host's global provider set, a request is one server span (none with telemetry off).

    FastAPI 0.165 and later trace requests themselves whenever a global
    provider is set; cortex's own span is the one, so FastAPI's is off. The
    global provider can be set once a process: a process of its own.
    """
    done = subprocess.run(
        [sys.executable, "-c", _GLOBAL_PROVIDER, database.app_url, KEY, tenant, telemetry],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names = json.loads(done.stdout.strip().splitlines()[-1])
    if telemetry == "off":
        assert names == []
    else:
        assert len(names) == 3, names
