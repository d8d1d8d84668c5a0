"""Helpers for the console's web tests: a served app with a console login, tokens, seeded sessions."""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg
import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

import cortex
from cortex import NewMessage, RequestedInput, use_scope
from cortex.models import session_uuid
from cortex.server import SigningKey, create_app, issue_token
from tests.conftest import Database, admin, asyncpg_dsn, with_user
from tests.serving import running

KEY = secrets.token_urlsafe(32)
T = TypeVar("T")

REFUND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "amount": {"type": "integer", "minimum": 0, "exclusiveMaximum": 500},
        "note": {"type": "string", "maxLength": 200},
    },
    "required": ["approved", "amount"],
}


def token(scope: str, role: str = "operator", subject: str = "ops@example", ttl: int = 600) -> str:
    return issue_token(SigningKey.parse(KEY), scope=scope, role=role, subject=subject, ttl=ttl)  # type: ignore[arg-type]  # a str role, checked by issue_token


@contextmanager
def console_login(database: Database) -> Iterator[str]:
    """A login granted cortex_console, as docs/deployment/roles.md has a DBA make it."""
    role = f"console_web_{uuid.uuid4().hex[:10]}"
    asyncio.run(
        admin(
            database.owner_url, f'CREATE ROLE "{role}" LOGIN', f'GRANT cortex_console TO "{role}"'
        )
    )
    try:
        yield with_user(database.owner_url, role)
    finally:
        asyncio.run(admin(database.owner_url, f'DROP ROLE IF EXISTS "{role}"'))


@contextmanager
def served(database: Database, prefix: str = "") -> Iterator[str]:
    """cortex's app as ``cortex serve`` runs it, the console on its own login; yields the base URL.

    With ``prefix`` ("/ops"), the app is mounted beneath it in a host's app,
    as a host that serves other routes beside cortex's mounts it.
    """
    with console_login(database) as login:
        app = create_app(database.app_url, signing_key=KEY, console_url=login)
        with running(mounted(app, prefix) if prefix else app) as url:
            yield url


def mounted(app: Any, prefix: str) -> Starlette:
    """A host's Starlette app serving ``app`` beneath ``prefix``, running its lifespan too."""

    @asynccontextmanager
    async def lifespan(host: Starlette) -> AsyncIterator[None]:
        async with app.router.lifespan_context(app):
            yield

    return Starlette(routes=[Mount(prefix, app=app)], lifespan=lifespan)


def ask(question: str, *, title_payload: Any = None, schema: Any = None) -> NewMessage:
    return NewMessage(
        "assistant",
        "A refund needs a human.",
        requested_input=RequestedInput(
            interrupt_id="approve-refund",
            message=question,
            response_schema=REFUND_SCHEMA if schema is None else schema,
            payload=title_payload,
        ),
    )


async def paused(url: str, scope: str, title: str, question: str, payload: Any = None) -> str:
    async with cortex.connect(url) as store:
        with use_scope(scope):
            s = await store.create_session("support-bot", title=title)
            await store.append_messages(
                s.id,
                [
                    NewMessage("user", "hello", author="customer"),
                    ask(question, title_payload=payload),
                ],
            )
            return s.id


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


@contextmanager
def signed_in(base_url: str, scope: str, **kwargs: Any) -> Iterator[httpx.Client]:
    """An httpx client holding a console session for an operator token of ``scope``."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        page = client.get("/console/sign-in")
        response = client.post(
            "/console/sign-in", data={"csrf": csrf_of(page.text), "token": token(scope, **kwargs)}
        )
        assert response.status_code == 303, response.text
        yield client


async def _state(database: Database, session_id: str) -> tuple[str, int, int]:
    conn = await asyncpg.connect(asyncpg_dsn(database.owner_url))
    try:
        uid = session_uuid(session_id)
        row = await conn.fetchrow("SELECT state, message_count FROM sessions WHERE id = $1", uid)
        actions = await conn.fetchval(
            "SELECT count(*) FROM console_actions WHERE session_id = $1", uid
        )
    finally:
        await conn.close()
    assert row is not None
    return row["state"], row["message_count"], actions


def session_state(database: Database, session_id: str) -> tuple[str, int, int]:
    """(state, messages, audit rows) of a session, read as the owner."""
    return run_async(_state(database, session_id))


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a loop of its own thread (Playwright's sync API holds this one's)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
