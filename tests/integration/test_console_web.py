"""The operator console over real HTTP: sign-in, CSRF, scopes, answers, aborts and the audit trail.

A real uvicorn serves ``create_app`` on a real database; the console reads
as a login granted ``cortex_console`` and acts as the application role.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from cortex.cli import main
from cortex.server import create_app
from tests.conftest import Database
from tests.console_web import (
    KEY,
    console_login,
    csrf_of,
    mounted,
    paused,
    served,
    signed_in,
    token,
)
from tests.console_web import session_state as state
from tests.serving import running

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def base_url(database: Database) -> Iterator[str]:
    with served(database) as url:
        yield url


@pytest.fixture
def tenants() -> dict[str, str]:
    x = uuid.uuid4().hex[:8]
    return {"acme": f"acme{x}", "globex": f"globex{x}"}


@pytest.fixture
def seeded(database: Database, tenants: dict[str, str]) -> dict[str, str]:
    return {
        name: asyncio.run(
            paused(database.app_url, f"{tenant}/support/u1", f"{tenant} refund", f"Approve {name}?")
        )
        for name, tenant in tenants.items()
    }


def _url(tenant: str, session_id: str) -> str:
    return f"/console/tenants/{tenant}/sessions/{session_id}"


def test_sign_in_refuses_app_tokens_and_bad_ones(base_url: str, tenants: dict[str, str]) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        page = client.get("/console/sign-in")
        assert page.status_code == 200
        assert "script-src" not in page.headers["content-security-policy"]
        assert "default-src 'none'" in page.headers["content-security-policy"]
        csrf = csrf_of(page.text)
        app = client.post(
            "/console/sign-in", data={"csrf": csrf, "token": token(tenants["acme"], role="app")}
        )
        assert app.status_code == 403
        assert "not an operator token" in app.text
        assert "cortex_console=" not in app.headers.get("set-cookie", "")
        bad = client.post("/console/sign-in", data={"csrf": csrf, "token": "not-a-jwt"})
        assert bad.status_code == 401
        # No CSRF token: refused before the token is even read.
        bare = client.post("/console/sign-in", data={"token": token(tenants["acme"])})
        assert bare.status_code == 403
        assert client.get("/console/").status_code == 303


def test_the_session_cookie_is_httponly_strict_and_ends_with_the_token(
    base_url: str, tenants: dict[str, str]
) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        csrf = csrf_of(client.get("/console/sign-in").text)
        response = client.post(
            "/console/sign-in", data={"csrf": csrf, "token": token(tenants["acme"], ttl=2)}
        )
        assert response.status_code == 303
        cookie = next(
            c for c in response.headers.get_list("set-cookie") if c.startswith("cortex_console=")
        )
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert "Path=/console" in cookie
        assert client.get("/console/").status_code == 200
        kept = client.cookies["cortex_console"]
        time.sleep(3)  # past the token's exp
        # A client that keeps the cookie past its Max-Age: the server checks exp itself.
        client.cookies.set("cortex_console", kept, path="/console")
        expired = client.get("/console/")
        assert expired.status_code == 303
        assert expired.headers["location"] == "/console/sign-in?notice=expired"


def test_listing_follows_the_operator_scope(
    base_url: str, tenants: dict[str, str], seeded: dict[str, str]
) -> None:
    acme, globex = tenants["acme"], tenants["globex"]
    with signed_in(base_url, "*") as everyone:
        page = everyone.get("/console/", params={"search": acme[4:]})
        assert page.status_code == 200
        assert "<caption>Paused sessions</caption>" in page.text
        assert seeded["acme"] in page.text
        assert seeded["globex"] in page.text
    with signed_in(base_url, acme) as ops:
        page = ops.get("/console/")
        assert seeded["acme"] in page.text
        assert seeded["globex"] not in page.text
        # A tenant filter outside the operator scope shows nothing, not the other tenant.
        other = ops.get("/console/", params={"tenant": globex})
        assert other.status_code == 200
        assert seeded["globex"] not in other.text


def test_an_operator_of_acme_gets_404_for_a_globex_session(
    database: Database, base_url: str, tenants: dict[str, str], seeded: dict[str, str]
) -> None:
    acme, globex = tenants["acme"], tenants["globex"]
    theirs = seeded["globex"]
    before = state(database, theirs)
    with signed_in(base_url, acme) as ops:
        assert ops.get(_url(globex, theirs)).status_code == 404
        # Naming acme as the tenant does not help either.
        assert ops.get(_url(acme, theirs)).status_code == 404
        csrf = csrf_of(ops.get("/console/").text)
        resumed = ops.post(
            _url(globex, theirs) + "/resume",
            data={
                "csrf": csrf,
                "interrupt_id": "approve-refund",
                "f/approved": "true",
                "f/amount": "5",
            },
        )
        assert resumed.status_code == 404
        aborted = ops.post(_url(globex, theirs) + "/abort", data={"csrf": csrf, "reason": "x"})
        assert aborted.status_code == 404
    assert state(database, theirs) == before


def test_csrf_missing_or_wrong_is_403_and_writes_nothing(
    database: Database, base_url: str, tenants: dict[str, str], seeded: dict[str, str]
) -> None:
    acme, mine = tenants["acme"], seeded["acme"]
    before = state(database, mine)
    answer = {"interrupt_id": "approve-refund", "f/approved": "true", "f/amount": "5"}
    with signed_in(base_url, acme) as ops, signed_in(base_url, acme, subject="other") as other:
        theirs = csrf_of(other.get("/console/").text)
        for data in ({}, {"csrf": "0" * 64}, {"csrf": theirs}):
            resumed = ops.post(_url(acme, mine) + "/resume", data={**answer, **data})
            assert resumed.status_code == 403, resumed.text
            aborted = ops.post(_url(acme, mine) + "/abort", data={"reason": "r", **data})
            assert aborted.status_code == 403
            signed_out = ops.post("/console/sign-out", data=data)
            assert signed_out.status_code == 403
        assert ops.get("/console/").status_code == 200  # still signed in
    assert state(database, mine) == before


def test_a_forged_cookie_is_no_session(
    base_url: str, tenants: dict[str, str], seeded: dict[str, str]
) -> None:
    acme, globex = tenants["acme"], tenants["globex"]
    with signed_in(base_url, acme) as ops:
        real = ops.cookies["cortex_console"]
        head, body, signature = real.split(".")
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        claims["scope"] = globex
        forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
        ops.cookies.set("cortex_console", f"{head}.{forged}.{signature}", path="/console")
        page = ops.get(_url(globex, seeded["globex"]))
        assert page.status_code == 303
        assert page.headers["location"].startswith("/console/sign-in")


def test_answer_refused_then_accepted_abort_and_audit(
    database: Database,
    base_url: str,
    tenants: dict[str, str],
    seeded: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    acme, mine = tenants["acme"], seeded["acme"]
    with signed_in(base_url, acme, subject="ada@acme") as ops:
        page = ops.get(_url(acme, mine))
        assert page.status_code == 200
        assert 'for="q1-f-approved"' in page.text
        csrf = csrf_of(page.text)
        wrong = ops.post(
            _url(acme, mine) + "/resume",
            data={
                "csrf": csrf,
                "interrupt_id": "approve-refund",
                "f/approved": "true",
                "f/amount": "500",
            },
        )
        assert wrong.status_code == 422
        error = re.search(r'<p class="error" id="q1-f-amount-error">([^<]*)</p>', wrong.text)
        assert error is not None, wrong.text
        assert "500" in error.group(1)
        assert state(database, mine)[:2] == ("paused", 2)
        right = ops.post(
            _url(acme, mine) + "/resume",
            data={
                "csrf": csrf,
                "interrupt_id": "approve-refund",
                "f/approved": "true",
                "f/amount": "40",
            },
        )
        assert right.status_code == 303
        assert state(database, mine)[:2] == ("idle", 3)
        shown = ops.get(right.headers["location"])
        assert "The answer was recorded" in shown.text
        aborted = ops.post(_url(acme, mine) + "/abort", data={"csrf": csrf, "reason": "done"})
        assert aborted.status_code == 303
        again = ops.post(_url(acme, mine) + "/abort", data={"csrf": csrf, "reason": "twice"})
        assert again.status_code == 409
        assert state(database, mine)[0] == "aborted"
        trail = ops.get(_url(acme, mine)).text
        for action, outcome in (
            ("resume", "InvalidInput"),
            ("resume", "ok"),
            ("abort", "ok"),
            ("abort", "AlreadyAborted"),
        ):
            assert re.search(rf"<td>ada@acme</td><td>{action}</td><td>{outcome}</td>", trail), (
                action
            )
    with signed_in(base_url, acme, subject="ada@acme") as ops:
        ops.post("/console/sign-out", data={"csrf": csrf_of(ops.get("/console/").text)})
        assert ops.get("/console/").status_code == 303
    # The same trail on the command line, through the console's own login.
    from tests.console_web import console_login

    with console_login(database) as login:
        code = main(["--database-url", login, "audit", "list", "--scope", acme, "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    kinds = [(r["action"], r["outcome"]) for r in rows if r["subject"] == "ada@acme"]
    assert ("sign_in", "ok") in kinds
    assert ("sign_out", "ok") in kinds
    assert kinds.count(("resume", "ok")) == 1


def test_an_every_tenant_token_is_for_the_console_only(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        response = client.get("/v1/sessions", headers={"Authorization": f"Bearer {token('*')}"})
    assert response.status_code == 401
    assert "console" in response.json()["detail"]


async def test_over_tls_the_cookies_are_secure_prefixed(database: Database) -> None:
    """Behind TLS a plain-HTTP response cannot plant the console's cookies: their names say Secure."""
    from cortex.server import create_app
    from tests.console_web import KEY

    app = create_app(database.app_url, signing_key=KEY, telemetry=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://cortex") as c:
        page = await c.get("/console/sign-in")
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("__Secure-cortex_console_csrf=")
        assert "Secure" in cookie
        nonce = c.cookies["__Secure-cortex_console_csrf"]
        # The same nonce under the plain name (as an http:// page could set it) is no nonce.
        c.cookies.clear()
        c.cookies.set("cortex_console_csrf", nonce, domain="cortex", path="/console")
        refused = await c.post(
            "/console/sign-in", data={"csrf": csrf_of(page.text), "token": token("acme")}
        )
    assert refused.status_code == 403


def test_a_prefix_from_the_request_path_adds_no_cookie_attribute(database: Database) -> None:
    """A host mounting cortex at ``/{org}``: the segment is quoted in links and the cookies' path."""
    with console_login(database) as login:
        app = create_app(database.app_url, signing_key=KEY, console_url=login)
        with running(mounted(app, "/{org}")) as base, httpx.Client(base_url=base) as client:
            page = client.get("/acme;Max-Age=1;Domain=example.com/console/sign-in")
    assert page.status_code == 200, page.text
    cookies = page.headers.get_list("set-cookie")
    assert cookies
    for cookie in cookies:
        attributes = [part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]]
        assert "max-age" not in attributes, cookie
        assert "domain" not in attributes, cookie
        assert "Path=/acme%3BMax-Age%3D1%3BDomain%3Dexample.com/console" in cookie, cookie
    assert 'action="/acme%3BMax-Age%3D1%3BDomain%3Dexample.com/console/sign-in"' in page.text
