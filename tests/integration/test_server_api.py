"""Every /v1 route over real HTTP: uvicorn on a loopback port, httpx, the application role."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest

from cortex.server import SigningKey, create_app, issue_token
from tests.conftest import Database
from tests.serving import running

KEY = secrets.token_urlsafe(32)
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def base_url(database: Database) -> Iterator[str]:
    with running(create_app(database.app_url, signing_key=KEY, max_body_bytes=64 * 1024)) as url:
        yield url


def token(scope: str, role: str = "app") -> str:
    return issue_token(SigningKey.parse(KEY), scope=scope, role=role)  # type: ignore[arg-type]


@pytest.fixture
async def client(base_url: str, tenant: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {token(tenant)}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as c:
        yield c


def problem(response: httpx.Response, status: int, title: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"] == title
    assert body["detail"]
    return body


async def test_sessions_lifecycle(client: httpx.AsyncClient, tenant: str) -> None:
    created = await client.post(
        "/v1/sessions",
        json={"agent_id": "bot", "title": "Invoice", "metadata": {"channel": "web"}},
    )
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert created.json()["scope"] == tenant
    assert (await client.get(f"/v1/sessions/{sid}")).json()["title"] == "Invoice"
    patched = await client.patch(f"/v1/sessions/{sid}", json={"title": "Refund"})
    assert patched.json()["title"] == "Refund"
    assert patched.json()["metadata"] == {"channel": "web"}
    detail = await client.get(f"/v1/sessions/{sid}/detail")
    assert detail.json()["state"] == "idle"
    resolved = await client.post("/v1/agents/bot/resolve", json={"session_id": sid})
    assert resolved.json()["id"] == sid
    default = await client.post("/v1/agents/bot/resolve")
    assert default.status_code == 200
    assert default.json()["is_default"] is True
    assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    problem(await client.get(f"/v1/sessions/{sid}"), 404, "NotFound")
    problem(await client.get("/v1/sessions/nonsense"), 422, "InvalidInput")


async def test_listing_filters_count_and_pages(client: httpx.AsyncClient, tenant: str) -> None:
    for i in range(5):
        channel = "web" if i % 2 else "mail"
        await client.post(
            "/v1/sessions", json={"agent_id": "bot", "metadata": {"channel": channel}}
        )
    web = {"metadata": json.dumps({"channel": "web"})}
    count = await client.get("/v1/sessions/count", params=web)
    assert count.json() == {"count": 2}
    assert (await client.get("/v1/sessions/count")).json() == {"count": 5}
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/sessions", params=params)).json()
        assert "items" in page, page
        seen += [s["id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 5
    after = await client.get("/v1/sessions", params={"updated_after": "2000-01-01T00:00:00+00:00"})
    assert len(after.json()["items"]) == 5
    naive = await client.get("/v1/sessions", params={"updated_after": "2000-01-01T00:00:00"})
    problem(naive, 422, "InvalidInput")
    bad = await client.get("/v1/sessions", params={"metadata": "[1]"})
    assert "metadata" in problem(bad, 422, "InvalidInput")["detail"]
    problem(await client.get("/v1/sessions", params={"limit": 5000}), 422, "InvalidInput")


async def test_a_changed_or_foreign_cursor_is_400(client: httpx.AsyncClient) -> None:
    for _ in range(3):
        await client.post("/v1/sessions", json={"agent_id": "bot"})
    cursor = (await client.get("/v1/sessions", params={"limit": 1})).json()["next_cursor"]
    assert cursor
    flipped = cursor[:-3] + ("A" if cursor[-3] != "A" else "B") + cursor[-2:]
    problem(await client.get("/v1/sessions", params={"cursor": flipped}), 400, "InvalidInput")
    problem(await client.get("/v1/sessions", params={"cursor": "garbage"}), 400, "InvalidInput")
    other = await client.get("/v1/sessions", params={"cursor": cursor, "agent_id": "other"})
    problem(other, 400, "InvalidInput")


async def test_paging_under_concurrent_inserts(client: httpx.AsyncClient) -> None:
    for _ in range(30):
        await client.post("/v1/sessions", json={"agent_id": "bot"})
    before = {
        s["id"] for s in (await client.get("/v1/sessions", params={"limit": 100})).json()["items"]
    }
    done = anyio.Event()
    inserted = 0

    async def insert() -> None:
        nonlocal inserted
        while not done.is_set():
            await client.post("/v1/sessions", json={"agent_id": "bot"})
            inserted += 1

    seen: Counter[str] = Counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(insert)
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 4, **({"cursor": cursor} if cursor else {})}
            page = (await client.get("/v1/sessions", params=params)).json()
            seen.update(s["id"] for s in page["items"])
            await anyio.sleep(0.02)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        done.set()
    assert inserted > 0
    assert [i for i, n in seen.items() if n > 1] == []
    assert before - set(seen) == set()


async def test_messages_routes(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
    batch = {
        "messages": [
            {"role": "user", "content": f"m{i}", "id": f"msg_{_uuid7_suffix(i)}"} for i in range(5)
        ]
    }
    appended = await client.post(f"/v1/sessions/{sid}/messages", json=batch)
    assert appended.status_code == 201, appended.text
    assert [m["seq"] for m in appended.json()["items"]] == [1, 2, 3, 4, 5]
    again = await client.post(f"/v1/sessions/{sid}/messages", json=batch)
    assert [m["id"] for m in again.json()["items"]] == [m["id"] for m in appended.json()["items"]]
    page = (await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 2})).json()
    got = [m["content"] for m in page["items"]]
    while page["next_cursor"]:
        params = {"limit": 2, "cursor": page["next_cursor"]}
        page = (await client.get(f"/v1/sessions/{sid}/messages", params=params)).json()
        got += [m["content"] for m in page["items"]]
    assert got == [f"m{i}" for i in range(5)]
    after = await client.get(f"/v1/sessions/{sid}/messages", params={"after_seq": 3})
    assert [m["seq"] for m in after.json()["items"]] == [4, 5]
    newest = await client.get(f"/v1/sessions/{sid}/messages", params={"newest": 2})
    assert [m["content"] for m in newest.json()["items"]] == ["m3", "m4"]
    other = (await client.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
    cursor = (await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1})).json()
    stolen = await client.get(
        f"/v1/sessions/{other}/messages", params={"cursor": cursor["next_cursor"]}
    )
    problem(stolen, 400, "InvalidInput")
    fork = await client.post(f"/v1/sessions/{sid}/fork", json={"through_seq": 2})
    assert fork.status_code == 201
    assert fork.json()["message_count"] == 2
    rewound = await client.post(f"/v1/sessions/{sid}/rewind", json={"to_seq": 4})
    assert rewound.json()["message_count"] == 4
    problem(
        await client.post(f"/v1/sessions/{sid}/messages", json={"messages": []}),
        422,
        "InvalidInput",
    )


def _uuid7_suffix(i: int) -> str:
    from cortex.ids import format_id, new_uuid

    del i
    return format_id("msg", new_uuid()).removeprefix("msg_")


async def test_operator_routes(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
    question = {
        "role": "assistant",
        "content": "Approve?",
        "requested_inputs": [
            {
                "interrupt_id": "approve",
                "response_schema": {
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}},
                    "required": ["approved"],
                },
            }
        ],
    }
    await client.post(f"/v1/sessions/{sid}/messages", json={"messages": [question]})
    detail = (await client.get(f"/v1/sessions/{sid}/detail")).json()
    assert detail["state"] == "paused"
    assert detail["pending"][0]["interrupt_id"] == "approve"
    wrong = await client.post(
        f"/v1/sessions/{sid}/resume", json={"interrupt_id": "approve", "response": {"x": 1}}
    )
    problem(wrong, 422, "InvalidInput")
    answered = await client.post(
        f"/v1/sessions/{sid}/resume",
        json={"interrupt_id": "approve", "response": {"approved": True}, "author": "ops"},
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["function_responses"][0]["response"] == {"approved": True}
    problem(
        await client.post(
            f"/v1/sessions/{sid}/resume",
            json={"interrupt_id": "approve", "response": {"approved": False}},
        ),
        409,
        "Conflict",
    )
    aborted = await client.post(f"/v1/sessions/{sid}/abort", json={"reason": "withdrawn"})
    assert aborted.json()["state"] == "aborted"
    again = await client.post(f"/v1/sessions/{sid}/abort", json={"reason": "again"})
    problem(again, 409, "AlreadyAborted")


async def test_scope_data_routes(client: httpx.AsyncClient, tenant: str) -> None:
    patched = await client.patch(
        "/v1/scope-data",
        content=json.dumps({"plan": "pro", "limits": {"a": 1}}),
        headers={"content-type": "application/merge-patch+json"},
    )
    assert patched.json() == {"scope": tenant, "data": {"plan": "pro", "limits": {"a": 1}}}
    patched = await client.patch("/v1/scope-data", json={"plan": None, "limits": {"b": 2}})
    assert patched.json()["data"] == {"limits": {"a": 1, "b": 2}}
    assert (await client.get("/v1/scope-data")).json()["data"] == {"limits": {"a": 1, "b": 2}}
    put = await client.put("/v1/scope-data", params={"scope": f"{tenant}/u1"}, json={"x": 1})
    assert put.json() == {"scope": f"{tenant}/u1", "data": {"x": 1}}
    problem(await client.patch("/v1/scope-data", json={"__cortex_x": 1}), 422, "InvalidInput")
    problem(await client.patch("/v1/scope-data", json=[1]), 422, "InvalidInput")


async def test_scope_lifecycle_routes(client: httpx.AsyncClient, tenant: str) -> None:
    sid = (await client.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
    await client.post(
        f"/v1/sessions/{sid}/messages", json={"messages": [{"role": "user", "content": "hi"}]}
    )
    exported = await client.get("/v1/scope/export")
    assert exported.status_code == 200
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    records = [json.loads(line) for line in exported.text.splitlines()]
    assert records[0]["type"] == "header"
    assert records[-1]["type"] == "end"
    dry = await client.post("/v1/scope/erase", json={"dry_run": True})
    assert dry.json()["sessions"] == 1
    imported = await client.post(
        "/v1/scope/import",
        params={"into": f"{tenant}/copy"},
        content=exported.content,
        headers={"content-type": "application/x-ndjson"},
    )
    assert imported.status_code in (200, 409), imported.text  # ids are kept: Conflict here
    broken = await client.post("/v1/scope/import", content=b'{"type": "header"\n')
    problem(broken, 422, "InvalidInput")
    erased = await client.post("/v1/scope/erase", json={"path": tenant})
    assert erased.json()["sessions"] >= 1
    receipts = (await client.get("/v1/scope/erasures")).json()["items"]
    assert receipts[0]["scope"] == tenant
    reimported = await client.post("/v1/scope/import", content=exported.content)
    assert reimported.status_code == 200, reimported.text
    assert reimported.json()["sessions"] == 1
    assert (await client.get("/v1/scope/retention-policy")).json() == {
        "path": tenant,
        "policy": None,
    }
    policy = {"delete_idle_after": "P30D", "keep_last_messages": 100}
    put = await client.put("/v1/scope/retention-policy", json=policy)
    assert put.status_code == 200, put.text
    assert put.json()["policy"]["keep_last_messages"] == 100, put.text
    run = await client.post("/v1/scope/retention/run", json={"dry_run": True})
    assert run.status_code == 200
    assert run.json()["dry_run"] is True
    assert (await client.delete("/v1/scope/retention-policy")).status_code == 204
    assert (await client.get("/v1/scope/retention-policy")).json()["policy"] is None


async def test_scope_narrowing_and_widening(base_url: str, tenant: str) -> None:
    headers = {"Authorization": f"Bearer {token(tenant)}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as c:
        deep = await c.post(
            "/v1/sessions", json={"agent_id": "bot"}, headers={"Cortex-Scope": f"{tenant}/u1"}
        )
        assert deep.json()["scope"] == f"{tenant}/u1"
        top = await c.post("/v1/sessions", json={"agent_id": "bot"})
        narrowed = await c.get("/v1/sessions", headers={"Cortex-Scope": f"{tenant}/u1"})
        assert [s["id"] for s in narrowed.json()["items"]] == [deep.json()["id"]]
        problem(
            await c.get(
                f"/v1/sessions/{top.json()['id']}", headers={"Cortex-Scope": f"{tenant}/u1"}
            ),
            404,
            "NotFound",
        )
    narrow = {"Authorization": f"Bearer {token(f'{tenant}/u1')}"}
    async with httpx.AsyncClient(base_url=base_url, headers=narrow) as c:
        problem(
            await c.get("/v1/sessions", headers={"Cortex-Scope": tenant}), 403, "ScopeViolation"
        )
        problem(await c.post("/v1/scope/erase", json={"path": tenant}), 403, "ScopeViolation")
        problem(await c.get("/v1/scope/export", params={"path": tenant}), 403, "ScopeViolation")
        problem(
            await c.get("/v1/scope/erasures", params={"path": f"{tenant}/u10"}),
            403,
            "ScopeViolation",
        )
        problem(
            await c.patch("/v1/scope-data", params={"scope": tenant}, json={"a": 1}),
            403,
            "ScopeViolation",
        )
        problem(
            await c.post("/v1/scope/retention/run", json={"path": tenant}), 403, "ScopeViolation"
        )
        problem(await c.get("/v1/sessions", headers={"Cortex-Scope": "a//b"}), 422, "InvalidScope")


async def test_a_tenant_never_reads_a_lookalike_tenant(base_url: str, tenant: str) -> None:
    lookalike = f"{tenant}-corp"
    async with httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {token(lookalike)}"}
    ) as c:
        secret = (await c.post("/v1/sessions", json={"agent_id": "bot", "title": "secret"})).json()
        await c.patch("/v1/scope-data", json={"secret": 1})
    async with httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {token(tenant)}"}
    ) as c:
        problem(await c.get(f"/v1/sessions/{secret['id']}"), 404, "NotFound")
        problem(await c.get(f"/v1/sessions/{secret['id']}/messages"), 404, "NotFound")
        assert (await c.get("/v1/sessions")).json()["items"] == []
        assert (await c.get("/v1/sessions/count")).json() == {"count": 0}
        problem(await c.get("/v1/scope-data", params={"scope": lookalike}), 422, "InvalidInput")
        problem(
            await c.get("/v1/sessions", headers={"Cortex-Scope": lookalike}), 403, "ScopeViolation"
        )
        problem(await c.get("/v1/scope/export", params={"path": lookalike}), 403, "ScopeViolation")


async def test_body_bound_cors_and_problems(client: httpx.AsyncClient) -> None:
    big = {"agent_id": "bot", "title": "x" * (70 * 1024)}
    problem(await client.post("/v1/sessions", json=big), 413, "InvalidInput")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"agent_id": "bot", "title": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'"}'

    streamed = await client.post(
        "/v1/sessions", content=chunks(), headers={"content-type": "application/json"}
    )
    problem(streamed, 413, "InvalidInput")
    preflight = await client.options(
        "/v1/sessions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    plain = await client.get("/v1/sessions", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in plain.headers
    missing = await client.post("/v1/sessions", json={"title": "no agent"})
    body = problem(missing, 422, "InvalidInput")
    assert "agent_id" in body["detail"]
    problem(await client.get("/v1/nowhere"), 404, "NotFound")


async def test_bodies_holding_nan_or_infinity_are_422(client: httpx.AsyncClient) -> None:
    """Python's JSON reads NaN and Infinity; cortex refuses them, and the refusal itself is JSON."""
    created = await client.post("/v1/sessions", json={"agent_id": "bot"})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    raw = {"content-type": "application/json"}
    bodies = {
        f"/v1/sessions/{sid}/messages": [
            b'{"messages": [{"role": "user", "content": NaN}]}',
            b'{"messages": [{"role": "user", "content": {"x": [Infinity]}}]}',
            b'{"messages": [{"role": "user", "content": "hi", "metadata": {"x": -Infinity}}]}',
            b'{"messages": [{"role": "user", "content": [1e400]}]}',
        ],
        "/v1/sessions": [b'{"agent_id": "bot", "metadata": {"n": NaN}}'],
        f"/v1/sessions/{sid}": [b'{"metadata": {"n": Infinity}}'],
    }
    for path, sent in bodies.items():
        for body in sent:
            method = "PATCH" if path.endswith(sid) else "POST"
            answer = await client.request(method, path, content=body, headers=raw)
            found = problem(answer, 422, "InvalidInput")
            json.loads(answer.text, parse_constant=_refuse)  # strict JSON back
            assert found["errors"]
    listed = await client.get(f"/v1/sessions/{sid}/messages")
    assert listed.json()["items"] == []
    assert (await client.get(f"/v1/sessions/{sid}")).json()["metadata"] == {}


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} in a response")


async def test_health_and_documents(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        ready = await c.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        spec = (await c.get("/v1/openapi.json")).json()
        assert (await c.get("/v1/docs")).status_code == 200
    routes = {(path, method) for path, item in spec["paths"].items() for method in item}
    for expected in [
        ("/v1/sessions", "post"),
        ("/v1/sessions", "get"),
        ("/v1/sessions/count", "get"),
        ("/v1/sessions/{session_id}", "patch"),
        ("/v1/sessions/{session_id}/messages", "post"),
        ("/v1/scope-data", "patch"),
        ("/v1/scope/import", "post"),
        ("/v1/scope/retention/run", "post"),
    ]:
        assert expected in routes
    created = spec["paths"]["/v1/sessions"]["post"]["responses"]
    assert "201" in created
    assert "application/problem+json" in created["401"]["content"]
