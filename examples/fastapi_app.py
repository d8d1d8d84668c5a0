"""cortex in a FastAPI app: the scope from the request, one store per process, errors as statuses.

Run it with ``CORTEX_DATABASE_URL=postgresql://app_service:change-me@localhost/app
uvicorn --factory examples.fastapi_app:app_from_environment`` (the README's
roles make that database). tests/integration/test_asgi.py drives it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel

import cortex
from cortex import ListFilter, NewMessage
from cortex.asgi import ScopeMiddleware, header
from cortex.fastapi import install_error_handlers


def tenant_scope(request: Mapping[str, Any]) -> str | None:
    """The request's scope. Here a header set by the gateway; in production often a JWT claim."""
    return header(request, "x-tenant-scope")


class Say(BaseModel):
    """A request body: what the user says."""

    text: str


def create_app(database_url: str) -> FastAPI:
    """The app, on a store opened at startup and closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with cortex.connect(database_url) as store:  # one store, shared by all requests
            app.state.store = store
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(ScopeMiddleware, scope_from=tenant_scope)
    install_error_handlers(app)  # NotFound -> 404, InvalidInput -> 422, Conflict -> 409, ...

    @app.post("/agents/{agent_id}/messages")
    async def say(agent_id: str, body: Say, request: Request) -> dict[str, Any]:
        store: cortex.Store = request.app.state.store
        session = await store.resolve_session(agent_id)  # in the request's scope
        stored = await store.append_message(session.id, NewMessage("user", body.text))
        return {"session_id": session.id, "seq": stored.seq}

    @app.get("/agents/{agent_id}/messages")
    async def history(agent_id: str, request: Request, last: int = 20) -> dict[str, Any]:
        store: cortex.Store = request.app.state.store
        # The conversation's default session if it exists: reading creates nothing.
        flt = ListFilter(agent_id=agent_id, exact=True, default_only=True, limit=1)
        found = await store.list_sessions(flt)
        if not found:
            return {"messages": []}
        messages = await store.recent_messages(found[0].id, limit=last)
        return {"messages": [m.model_dump(mode="json") for m in messages]}

    return app


def app_from_environment() -> FastAPI:
    """The app on ``CORTEX_DATABASE_URL``; there is no default database to fall back to."""
    url = os.environ.get("CORTEX_DATABASE_URL")
    if not url:
        raise SystemExit("set CORTEX_DATABASE_URL to the application role's database URL")
    return create_app(url)
