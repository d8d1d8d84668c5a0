"""The lanes of the hottest routes answer every request exactly as FastAPI's own path does.

Two apps on one store: one as served, one with a dependency override, which
sends every request down FastAPI's path (cortex.server.routes.LaneRoute).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import cortex
from cortex.ids import format_id, new_uuid
from cortex.server import SigningKey, create_app, issue_token
from cortex.server.routes import _signer
from tests.conftest import Database

KEY = secrets.token_urlsafe(32)


@pytest.fixture
async def clients(database: Database, tenant: str) -> AsyncIterator[tuple[Any, Any]]:
    token = issue_token(SigningKey.parse(KEY), scope=tenant)
    headers = {"Authorization": f"Bearer {token}"}
    async with cortex.connect(database.app_url) as store:
        lane = create_app(store, signing_key=KEY, cursor_key=b"k" * 32, telemetry=False)
        plain = create_app(store, signing_key=KEY, cursor_key=b"k" * 32, telemetry=False)
        plain.dependency_overrides[_signer] = _signer  # the same signer, through FastAPI
        async with (
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=lane), base_url="http://x", headers=headers
            ) as a,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=plain), base_url="http://x", headers=headers
            ) as b,
        ):
            yield a, b


def answer(response: httpx.Response) -> tuple[int, str, Any]:
    return response.status_code, response.headers["content-type"], response.json()


async def same(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], method: str, url: str, **kw: Any
) -> tuple[int, str, Any]:
    a, b = clients
    first = answer(await a.request(method, url, **kw))
    assert answer(await b.request(method, url, **kw)) == first, (method, url, kw)
    return first


async def test_lanes_answer_as_fastapi_does(clients: tuple[Any, Any]) -> None:
    a, _ = clients
    sid = (await a.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
    for i in range(3):
        await a.post("/v1/sessions", json={"agent_id": "bot", "title": f"s{i}"})

    # Appends: a retry with the same message ids answers the stored messages, on either path.
    messages = [
        {"role": "user", "content": f"m{i}", "id": format_id("msg", new_uuid())} for i in range(5)
    ]
    status, _, stored = await same(
        clients, "POST", f"/v1/sessions/{sid}/messages", json={"messages": messages}
    )
    assert status == 201
    assert [m["seq"] for m in stored["items"]] == [1, 2, 3, 4, 5]
    body = json.dumps({"messages": messages[:1]})
    refused: list[dict[str, Any]] = [
        {"content": "{", "headers": {"Content-Type": "application/json"}},
        {"content": body, "headers": {"Content-Type": "text/plain"}},
        {"content": body},
        {"json": {"messages": []}},
        {"json": {"messages": [{"role": "robot"}]}},
        {"json": {"messages": messages[:1], "extra": 1}},
        {"json": {"messages": [{"role": "user", "content": "x"}], "expected_count": 1}},
    ]
    for kw in refused:
        status, kind, _ = await same(clients, "POST", f"/v1/sessions/{sid}/messages", **kw)
        assert status in (409, 422), kw
        assert kind == "application/problem+json"
    await same(clients, "POST", "/v1/sessions/msg_nothing/messages", json={"messages": messages})
    await same(clients, "POST", f"/v1/sessions/{sid}/messages?x=1", json={"messages": messages})

    # Pages of sessions: plain ones, a cursor, and everything the lane leaves to FastAPI.
    _, _, page = await same(clients, "GET", "/v1/sessions?limit=2")
    assert len(page["items"]) == 2
    await same(clients, "GET", "/v1/sessions", params={"limit": 2, "cursor": page["next_cursor"]})
    for query in [
        "",
        "?limit=0",
        "?limit=1000",
        "?limit=1001",
        "?limit=-1",
        "?limit=abc",
        "?limit=",
        "?limit=%C2%B2",
        "?limit=1&limit=2",
        "?limit=2&agent_id=bot",
        "?cursor=nonsense",
        "?cursor=",
        "?unknown=1",
    ]:
        await same(clients, "GET", f"/v1/sessions{query}")

    # Pages of messages.
    _, _, page = await same(clients, "GET", f"/v1/sessions/{sid}/messages?limit=2")
    assert [m["seq"] for m in page["items"]] == [1, 2]
    url = f"/v1/sessions/{sid}/messages"
    await same(clients, "GET", url, params={"cursor": page["next_cursor"]})
    for query in [
        "",
        "?after_seq=3",
        "?after_seq=2147483647",
        "?after_seq=2147483648",
        "?newest=2",
        "?newest=0",
        "?newest=1001",
        "?newest=2&after_seq=1",
        "?newest=2&cursor=x",
        "?limit=5&after_seq=00001",
        "?limit=1.0",
        "?cursor=nonsense",
        "?after_seq=1&after_seq=2",
    ]:
        await same(clients, "GET", f"{url}{query}")
    await same(clients, "GET", "/v1/sessions/msg_nothing/messages")
    await same(clients, "GET", "/v1/sessions/nonsense/messages?limit=2")
