"""200 concurrent clients of 20 tenants against one real server: no 5xx, no leak, exact counters.

Each client holds its tenant's token and its own connection, and for a
bounded time (``CORTEX_LOAD_SECONDS``, default 20) creates sessions,
appends messages and reads pages, sessions and counts. Everything a tenant
writes carries its marker; every response is searched for the other
tenants' markers. At the end each session's ``message_count`` must equal
the messages its clients appended, as the API and the rows in the database
both say.
"""

from __future__ import annotations

import os
import random
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from cortex.ids import parse_id
from cortex.server import SigningKey, create_app, issue_token
from tests.conftest import Database, asyncpg_dsn
from tests.figures import record
from tests.serving import running

pytestmark = pytest.mark.slow

KEY = secrets.token_urlsafe(32)
TENANTS = 20
CLIENTS = 200
SECONDS = float(os.environ.get("CORTEX_LOAD_SECONDS", "20"))


@pytest.fixture(scope="module")
def base_url(database: Database) -> Iterator[str]:
    with running(create_app(database.app_url, signing_key=KEY)) as url:
        yield url


@dataclass
class Tally:
    """What the clients saw: statuses, leaks, and the messages each session was given."""

    statuses: Counter[int] = field(default_factory=Counter)
    leaks: list[str] = field(default_factory=list)
    appended: Counter[str] = field(default_factory=Counter)  # session id -> messages
    owner: dict[str, str] = field(default_factory=dict)  # session id -> tenant
    failures: list[str] = field(default_factory=list)


class Client:
    """One client of one tenant: every response it gets is checked for the other tenants."""

    def __init__(self, http: httpx.AsyncClient, tenant: str, others: list[str], tally: Tally):
        self.http = http
        self.tenant = tenant
        self.others = others
        self.tally = tally
        self.sessions: list[str] = []

    async def call(self, method: str, url: str, **kwargs: Any) -> Any:
        response = await self.http.request(method, url, **kwargs)
        self.tally.statuses[response.status_code] += 1
        text = response.text
        for other in self.others:
            if other in text:
                self.tally.leaks.append(f"{self.tenant} {method} {url}: {other} in {text[:300]}")
        if response.status_code >= 300:
            self.tally.failures.append(f"{method} {url}: {response.status_code} {text[:300]}")
            return None
        return response.json() if text else None

    async def create(self) -> None:
        body = {
            "agent_id": "bot",
            "title": f"{self.tenant} session",
            "metadata": {"tenant": self.tenant},
        }
        session = await self.call("POST", "/v1/sessions", json=body)
        if session is not None:
            self._mine(session)
            self.sessions.append(session["id"])
            self.tally.owner[session["id"]] = self.tenant

    async def append(self) -> None:
        sid = random.choice(self.sessions)
        k = random.randint(1, 3)
        messages = [{"role": "user", "content": f"{self.tenant} says {i}"} for i in range(k)]
        stored = await self.call(
            "POST", f"/v1/sessions/{sid}/messages", json={"messages": messages}
        )
        if stored is not None:
            assert len(stored["items"]) == k
            self.tally.appended[sid] += k

    async def read(self) -> None:
        sid = random.choice(self.sessions)
        kind = random.randrange(4)
        if kind == 0:
            page = await self.call("GET", "/v1/sessions", params={"limit": 20})
            for session in page["items"] if page else ():
                self._mine(session)
        elif kind == 1:
            self._mine(await self.call("GET", f"/v1/sessions/{sid}"))
        elif kind == 2:
            page = await self.call("GET", f"/v1/sessions/{sid}/messages", params={"newest": 10})
            for message in page["items"] if page else ():
                assert message["content"].startswith(f"{self.tenant} says"), message
        else:
            await self.call("GET", "/v1/sessions/count")

    def _mine(self, session: dict[str, Any] | None) -> None:
        if session is not None and (
            session["scope"] != self.tenant or session["metadata"] != {"tenant": self.tenant}
        ):
            self.tally.leaks.append(f"{self.tenant} got {session}")

    async def run(self, deadline: float) -> None:
        await self.create()
        while time.monotonic() < deadline:
            roll = random.random()
            if roll < 0.05 or not self.sessions:
                await self.create()
            elif roll < 0.5:
                await self.append()
            else:
                await self.read()


async def test_two_hundred_clients_of_twenty_tenants(base_url: str, database: Database) -> None:
    run = uuid.uuid4().hex[:8]
    # Fixed width, so no tenant's name is inside another's.
    tenants = [f"ld{run}x{i:02d}" for i in range(TENANTS)]
    key = SigningKey.parse(KEY)
    tally = Tally()
    deadline = time.monotonic() + SECONDS
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(CLIENTS):
            tenant = tenants[i % TENANTS]
            token = issue_token(key, scope=tenant)
            http = httpx.AsyncClient(
                base_url=base_url,
                headers={"Authorization": f"Bearer {token}"},
                timeout=120,
                limits=httpx.Limits(max_connections=1),
            )
            client = Client(http, tenant, [t for t in tenants if t != tenant], tally)

            async def drive(client: Client = client, http: httpx.AsyncClient = http) -> None:
                async with http:
                    await client.run(deadline)

            tg.start_soon(drive)
    elapsed = time.monotonic() - started
    requests = sum(tally.statuses.values())
    record("server load: requests", requests)
    record("server load: 5xx", sum(n for s, n in tally.statuses.items() if s >= 500))
    print(
        f"\n{requests} requests in {elapsed:.1f} s ({requests / elapsed:.0f}/s)"
        f" from {CLIENTS} clients of {TENANTS} tenants; statuses {dict(tally.statuses)};"
        f" {sum(tally.appended.values())} messages appended to {len(tally.owner)} sessions"
    )
    assert [s for s in tally.statuses if s >= 500] == [], tally.failures[:5]
    assert tally.failures == []
    assert tally.leaks == []
    assert requests > CLIENTS

    # Counters: what the rows say and what the API says, against what was appended.
    conn = await asyncpg.connect(asyncpg_dsn(database.owner_url))
    try:
        rows = await conn.fetch(
            """
            SELECT s.tenant_id, s.id, s.message_count,
                   (SELECT count(*) FROM messages m
                    WHERE m.tenant_id = s.tenant_id AND m.session_id = s.id) AS n
            FROM sessions s WHERE s.tenant_id = ANY($1::text[])
            """,
            tenants,
        )
    finally:
        await conn.close()
    stored = {row["id"]: row for row in rows}
    assert set(stored) == {parse_id("ses", sid) for sid in tally.owner}
    for sid, tenant in tally.owner.items():
        row = stored[parse_id("ses", sid)]
        assert row["tenant_id"] == tenant
        assert row["message_count"] == row["n"] == tally.appended[sid], (sid, dict(row))
    for tenant in tenants:
        token = issue_token(key, scope=tenant)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as http:
            listed = (await http.get("/v1/sessions", params={"limit": 1000})).json()["items"]
        assert {s["id"] for s in listed} == {s for s, t in tally.owner.items() if t == tenant}
        for session in listed:
            assert session["message_count"] == tally.appended[session["id"]], session
