"""cortex in a web backend: the scope bound from the request, errors mapped to statuses.

Real PostgreSQL, real ASGI apps (FastAPI on Starlette), driven in-process
through httpx's ASGI transport; the README's example app through Starlette's
TestClient, which runs its lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import Depends, FastAPI, Request

import cortex
from cortex import NewMessage, use_scope
from cortex.asgi import ScopeMiddleware, from_header
from cortex.fastapi import install_error_handlers, scope_dependency
from tests.conftest import Database

pytestmark = pytest.mark.sqlalchemy20


def _routes(app: FastAPI, store: cortex.Store) -> None:
    @app.post("/sessions/{agent_id}")
    async def post(agent_id: str, text: str) -> dict[str, object]:
        session = await store.resolve_session(agent_id)
        await store.append_message(session.id, NewMessage("user", text))
        return {"id": session.id, "scope": str(cortex.current_scope())}

    @app.get("/sessions/{session_id}")
    async def get(session_id: str) -> dict[str, object]:
        session, messages = await store.get_session_with_messages(session_id)
        return {"title": session.title, "messages": [m.content for m in messages]}

    @app.get("/sync/scope")
    def sync_scope() -> dict[str, str]:  # a plain def endpoint: runs in the threadpool
        return {"scope": str(cortex.current_scope())}


async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


def _apps(store: cortex.Store) -> list[FastAPI]:
    """The same app with the scope bound by the middleware, and by the FastAPI dependency."""
    with_middleware = FastAPI()
    with_middleware.add_middleware(ScopeMiddleware, scope_from=from_header("x-scope"))

    def scope_of(req: Request) -> str | None:
        return req.headers.get("x-scope")

    with_dependency = FastAPI(dependencies=[Depends(scope_dependency(scope_of))])
    for app in (with_middleware, with_dependency):
        install_error_handlers(app)
        _routes(app, store)
    return [with_middleware, with_dependency]


async def test_scope_from_the_request_and_isolation(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    for i, app in enumerate(_apps(store)):
        async for client in _client(app):
            await _isolation(client, f"{tenant}-{i}", other_tenant)


async def _isolation(client: httpx.AsyncClient, tenant: str, other_tenant: str) -> None:
    mine = {"x-scope": f"{tenant}/support/u1"}
    created = await client.post(
        "/sessions/bot", params={"text": "My invoice is wrong"}, headers=mine
    )
    assert created.status_code == 200, created.text
    assert created.json()["scope"] == f"{tenant}/support/u1"
    sid = created.json()["id"]
    read = await client.get(f"/sessions/{sid}", headers={"x-scope": tenant})
    assert read.json()["messages"] == ["My invoice is wrong"]
    # Another tenant: 404, with no hint the session exists.
    foreign = await client.get(f"/sessions/{sid}", headers={"x-scope": other_tenant})
    assert foreign.status_code == 404
    assert foreign.json()["error"] == "NotFound"
    # A plain def endpoint sees the scope too (the threadpool copies the context).
    sync = await client.get("/sync/scope", headers=mine)
    assert sync.json() == {"scope": f"{tenant}/support/u1"}


async def test_missing_and_malformed_scopes(store: cortex.Store) -> None:
    for app in _apps(store):
        async for client in _client(app):
            await _missing_and_malformed(client)


async def _missing_and_malformed(client: httpx.AsyncClient) -> None:
    missing = await client.get("/sync/scope")
    assert missing.status_code == 401
    assert missing.json()["error"] == "ScopeMissing"
    malformed = await client.get("/sync/scope", headers={"x-scope": "bad scope/../x"})
    assert malformed.status_code == 422
    assert malformed.json()["error"] == "InvalidScope"


async def test_errors_map_to_statuses(store: cortex.Store, tenant: str) -> None:
    for app in _apps(store):
        async for client in _client(app):
            bad_id = await client.get("/sessions/not-an-id", headers={"x-scope": tenant})
            assert bad_id.status_code == 422
            assert bad_id.json()["error"] == "InvalidInput"


async def test_plain_def_dependency_does_not_reach_the_endpoint(store: cortex.Store) -> None:
    """Why cortex ships its own dependency: a sync one runs in a copied context."""

    def bind_in_a_thread(request: Request) -> None:
        use_scope(request.headers["x-scope"]).__enter__()

    app = FastAPI(dependencies=[Depends(bind_in_a_thread)])
    install_error_handlers(app)
    _routes(app, store)
    async for client in _client(app):
        response = await client.post(
            "/sessions/bot", params={"text": "hi"}, headers={"x-scope": "acme"}
        )
        assert response.status_code == 500
        assert response.json()["error"] == "ScopeMissing"


async def test_the_example_app(database: Database, tenant: str) -> None:
    from examples.fastapi_app import create_app

    app = create_app(database.app_url)
    async with app.router.lifespan_context(app):
        async for client in _client(app):
            headers = {"x-tenant-scope": f"{tenant}/support/user-42"}
            url = "/agents/support-bot/messages"
            first = await client.post(url, json={"text": "Hello"}, headers=headers)
            assert first.status_code == 200, first.text
            second = await client.post(url, json={"text": "Still there?"}, headers=headers)
            assert second.json()["session_id"] == first.json()["session_id"]
            history = await client.get(f"{url}?last=1", headers=headers)
            assert [m["content"] for m in history.json()["messages"]] == ["Still there?"]
            assert (await client.get(url)).status_code == 401
            # Reading a conversation that never started creates nothing.
            other = {"x-tenant-scope": f"{tenant}/support/user-43"}
            empty = await client.get(url, headers=other)
            assert empty.json() == {"messages": []}
        async with cortex.connect(database.app_url) as store:
            with use_scope(tenant):
                assert await store.count_sessions() == 1


async def test_every_error_is_a_problem_details_document(store: cortex.Store, tenant: str) -> None:
    """RFC 9457: cortex's errors, the middleware's refusals and FastAPI's validation errors."""
    for app in _apps(store):
        async for client in _client(app):
            answers = {
                "NotFound": await client.get(
                    "/sessions/ses_01m8t6n441eb6r1jsmwk719hhd", headers={"x-scope": tenant}
                ),
                "ScopeMissing": await client.get("/sync/scope"),
                "InvalidInput": await client.post("/sessions/bot", headers={"x-scope": tenant}),
            }
            for name, answer in answers.items():
                assert answer.headers["content-type"] == "application/problem+json", name
                body = answer.json()
                assert body["status"] == answer.status_code, body
                assert body["title"] == body["error"] == name, body
                assert body["type"] == f"urn:cortex:error:{name}", body
                assert isinstance(body["detail"], str), body
                assert body["detail"], body
            # FastAPI's own validation error names the field it refused.
            assert answers["InvalidInput"].status_code == 422
            assert "text" in answers["InvalidInput"].json()["detail"]


async def test_scope_from_a_token_claim_with_an_async_callable(
    store: cortex.Store, tenant: str
) -> None:
    """A host callable may be async (e.g. fetching signing keys) and read a claim."""
    import base64
    import json
    from collections.abc import Mapping
    from typing import Any

    from cortex.asgi import header

    async def claim(request: Mapping[str, Any]) -> str | None:
        auth = header(request, "authorization")
        if auth is None or not auth.startswith("Bearer "):
            return None
        # Stands in for a verified JWT: the host's library checks the signature.
        claims = json.loads(base64.urlsafe_b64decode(auth.removeprefix("Bearer ")))
        scope: str = claims["tenant_scope"]
        return scope

    app = FastAPI()
    app.add_middleware(ScopeMiddleware, scope_from=claim)
    install_error_handlers(app)
    _routes(app, store)
    token = base64.urlsafe_b64encode(json.dumps({"tenant_scope": f"{tenant}/u9"}).encode())
    async for client in _client(app):
        ok = await client.get("/sync/scope", headers={"authorization": f"Bearer {token.decode()}"})
        assert ok.json() == {"scope": f"{tenant}/u9"}
        assert (await client.get("/sync/scope")).status_code == 401


def test_the_example_app_needs_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from examples.fastapi_app import app_from_environment

    monkeypatch.delenv("CORTEX_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit, match="CORTEX_DATABASE_URL"):
        app_from_environment()
