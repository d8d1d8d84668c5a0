"""Attacks from outside on the HTTP API, the operator console and the objects they call.

A real uvicorn serves ``create_app`` (the /v1 API and the console on a
login granted ``cortex_console``) on a real database. Each test is one
attack: most are refused, and stay here so they keep being refused.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import asyncpg
import httpx
import pytest

import cortex
from cortex import NewMessage, RequestedInput, ids, use_scope
from cortex._schemas import check_response_schema
from cortex.console import ActionKind, OperatorView
from cortex.models import session_uuid
from cortex.server.forms import Field, fields_for
from tests.conftest import (
    CITUS_URL,
    Database,
    admin,
    asyncpg_dsn,
    create_database,
    drop_database,
)
from tests.console_web import console_login, csrf_of, served, signed_in, token

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def base_url(database: Database) -> Iterator[str]:
    with served(database) as url:
        yield url


@pytest.fixture
def names() -> dict[str, str]:
    x = uuid.uuid4().hex[:8]
    return {"acme": f"acme{x}", "corp": f"acme{x}-corp", "globex": f"globex{x}"}


def _app(scope: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(scope, role='app')}", **headers}


def _ask(schema: Any, question: str = "Approve?", interrupt_id: str = "approve") -> NewMessage:
    return NewMessage(
        "assistant",
        "needs a human",
        requested_input=RequestedInput(
            interrupt_id=interrupt_id, message=question, response_schema=schema
        ),
    )


async def _paused(
    url: str, scope: str, schema: Any, *, title: str = "t", session_id: str | None = None
) -> str:
    async with cortex.connect(url) as store:
        with use_scope(scope):
            s = await store.create_session("bot", title=title, session_id=session_id)
            await store.append_messages(s.id, [_ask(schema)])
            return s.id


def paused(
    db: Database, scope: str, schema: Any, *, title: str = "t", session_id: str | None = None
) -> str:
    return asyncio.run(_paused(db.app_url, scope, schema, title=title, session_id=session_id))


def _page(tenant: str, session_id: str) -> str:
    return f"/console/tenants/{tenant}/sessions/{session_id}"


# --- /v1: scopes, tenants and segments ---------------------------------------------


def test_a_token_for_acme_never_reaches_acme_corp(base_url: str, names: dict[str, str]) -> None:
    acme, corp = names["acme"], names["corp"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        theirs = c.post("/v1/sessions", headers=_app(corp), json={"agent_id": "bot"})
        assert theirs.status_code == 201
        sid = theirs.json()["id"]
        mine = _app(acme)
        assert (
            c.get("/v1/sessions", headers=_app(acme, **{"Cortex-Scope": corp})).status_code == 403
        )
        assert c.get(f"/v1/sessions/{sid}", headers=mine).status_code == 404
        assert c.get("/v1/sessions", headers=mine).json()["items"] == []
        assert c.get("/v1/scope/export", headers=mine, params={"path": corp}).status_code == 403
        assert c.get("/v1/scope/erasures", headers=mine, params={"path": corp}).status_code == 403
        # Neither above nor beneath: InvalidInput (the store's documented refusal).
        assert c.get("/v1/scope-data", headers=mine, params={"scope": corp}).status_code == 422
        assert (
            c.put("/v1/scope-data", headers=mine, params={"scope": corp}, json={"x": 1}).status_code
            == 403
        )
        for route in ("/v1/scope/erase", "/v1/scope/retention/run"):
            refused = c.post(route, headers=mine, json={"path": corp, "dry_run": False})
            assert refused.status_code == 403, refused.text
            assert refused.headers["content-type"] == PROBLEM
        assert (
            c.put(
                "/v1/scope/retention-policy",
                headers=mine,
                params={"path": corp},
                json={"delete_idle_after": "P1D"},
            ).status_code
            == 403
        )
        assert c.delete(f"/v1/sessions/{sid}", headers=mine).status_code == 404
        # The other tenant's session is still whole.
        assert c.get(f"/v1/sessions/{sid}", headers=_app(corp)).status_code == 200


def test_an_app_token_of_a_subtree_cannot_act_on_a_sibling(
    base_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        y = c.post("/v1/sessions", headers=_app(f"{acme}/y"), json={"agent_id": "bot"})
        sid = y.json()["id"]
        x = _app(f"{acme}/x")
        assert c.get(f"/v1/sessions/{sid}", headers=x).status_code == 404
        assert c.post("/v1/scope/erase", headers=x, json={"path": f"{acme}/y"}).status_code == 403
        assert c.post("/v1/scope/erase", headers=x, json={"path": acme}).status_code == 403
        assert c.get("/v1/scope/export", headers=x, params={"path": acme}).status_code == 403
        assert c.get("/v1/scope/export", headers=x, params={"path": f"{acme}/y"}).status_code == 403
        # Widening by header is refused too.
        wide = c.get("/v1/sessions", headers=_app(f"{acme}/x", **{"Cortex-Scope": acme}))
        assert wide.status_code == 403
        assert c.get(f"/v1/sessions/{sid}", headers=_app(f"{acme}/y")).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        "{t}/../{o}",  # a literal ".." segment: a scope beneath the token's, never the sibling
        "{t}/./x",
    ],
)
def test_dot_segments_are_literal_segments_beneath_the_token(
    base_url: str, names: dict[str, str], header: str
) -> None:
    acme, globex = names["acme"], names["globex"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        theirs = c.post("/v1/sessions", headers=_app(globex), json={"agent_id": "bot"})
        narrowed = header.format(t=acme, o=globex)
        made = c.post(
            "/v1/sessions", headers=_app(acme, **{"Cortex-Scope": narrowed}), json={"agent_id": "b"}
        )
        assert made.status_code == 201
        assert made.json()["scope"] == narrowed
        listed = c.get("/v1/sessions", headers=_app(acme, **{"Cortex-Scope": narrowed})).json()
        assert [s["id"] for s in listed["items"]] == [made.json()["id"]]
        assert theirs.json()["id"] not in json.dumps(listed)


@pytest.mark.parametrize(
    "spoof",
    [
        "\uff41cme",  # fullwidth a: NFKC would make it "acme"
        "ACME",
        "acme\u200b",
        "acme/",
        "/acme",
        "acme//x",
        "acme%2Fx",
        "*",
    ],
)
def test_scope_header_spellings_of_another_tenant_are_refused(
    base_url: str, names: dict[str, str], spoof: str
) -> None:
    tenant = names["acme"]
    value = spoof.replace("acme", tenant).replace("ACME", tenant.upper())
    raw = value.encode("utf-8")
    with httpx.Client(base_url=base_url, timeout=30) as c:
        response = c.get(
            "/v1/sessions",
            headers=[
                (b"Authorization", f"Bearer {token(tenant, role='app')}".encode()),
                (b"Cortex-Scope", raw),
            ],
        )
    assert response.status_code in (403, 422), response.text
    assert response.headers["content-type"] == PROBLEM


def test_an_every_tenant_token_is_refused_on_v1_even_narrowed(
    base_url: str, names: dict[str, str]
) -> None:
    everyone = {"Authorization": f"Bearer {token('*')}"}
    with httpx.Client(base_url=base_url, timeout=30) as c:
        assert c.get("/v1/sessions", headers=everyone).status_code == 401
        narrowed = c.get("/v1/sessions", headers={**everyone, "Cortex-Scope": names["acme"]})
        assert narrowed.status_code == 401
        assert c.post("/v1/scope/erase", headers=everyone, json={}).status_code == 401


def test_a_session_id_taken_by_another_tenant_is_no_oracle(
    base_url: str, names: dict[str, str]
) -> None:
    acme, globex = names["acme"], names["globex"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        theirs = c.post("/v1/sessions", headers=_app(globex), json={"agent_id": "bot"}).json()
        unknown = "ses_" + theirs["id"][4:-4] + "zzzz"
        same = c.post(
            "/v1/sessions", headers=_app(acme), json={"agent_id": "bot", "session_id": theirs["id"]}
        )
        # The id is per tenant: taking it is neither refused nor a view of theirs.
        assert same.status_code == 201, same.text
        assert same.json()["scope"] == acme
        a = c.get(f"/v1/sessions/{theirs['id']}/detail", headers=_app(f"{acme}/other"))
        b = c.get(f"/v1/sessions/{unknown}/detail", headers=_app(f"{acme}/other"))
        assert a.status_code == b.status_code
        assert c.get(f"/v1/sessions/{theirs['id']}", headers=_app(globex)).json() == theirs


# --- /v1: cursors ----------------------------------------------------------------


def _sessions(c: httpx.Client, headers: dict[str, str], n: int) -> None:
    for _ in range(n):
        assert c.post("/v1/sessions", headers=headers, json={"agent_id": "bot"}).status_code == 201


def test_cursors_do_not_cross_tenants_filters_or_routes(
    base_url: str, names: dict[str, str]
) -> None:
    acme, globex = names["acme"], names["globex"]
    a, g = _app(acme), _app(globex)
    with httpx.Client(base_url=base_url, timeout=30) as c:
        _sessions(c, a, 3)
        _sessions(c, g, 3)
        first = c.get("/v1/sessions", headers=a, params={"limit": 1}).json()
        cursor = first["next_cursor"]
        assert cursor
        # Another tenant, another narrowed scope, another filter: refused, 400.
        replays: list[tuple[dict[str, str], dict[str, str | int]]] = [
            (g, {"limit": 1}),
            (_app(acme, **{"Cortex-Scope": f"{acme}/x"}), {"limit": 1}),
            (a, {"limit": 1, "agent_id": "bot"}),
            (a, {"limit": 1, "exact": "true"}),
        ]
        for headers, params in replays:
            replayed = c.get("/v1/sessions", headers=headers, params={**params, "cursor": cursor})
            assert replayed.status_code == 400, (params, replayed.text)
            assert replayed.headers["content-type"] == PROBLEM
        sid = first["items"][0]["id"]
        # A listing's cursor on a message page, and the other way round.
        on_messages = c.get(f"/v1/sessions/{sid}/messages", headers=a, params={"cursor": cursor})
        assert on_messages.status_code == 400
        msgs = [{"role": "user", "content": str(i)} for i in range(3)]
        c.post(f"/v1/sessions/{sid}/messages", headers=a, json={"messages": msgs})
        page = c.get(f"/v1/sessions/{sid}/messages", headers=a, params={"limit": 1}).json()
        mcursor = page["next_cursor"]
        assert c.get("/v1/sessions", headers=a, params={"cursor": mcursor}).status_code == 400
        other = first["items"][0]["id"]
        second = c.get("/v1/sessions", headers=a, params={"limit": 2}).json()["items"][1]["id"]
        assert other != second
        moved = c.get(f"/v1/sessions/{second}/messages", headers=a, params={"cursor": mcursor})
        assert moved.status_code == 400
        # A changed byte, or a cursor signed with another key, is refused.
        flipped = mcursor[:-2] + ("A" if mcursor[-2] != "A" else "B") + mcursor[-1]
        tampered = c.get(f"/v1/sessions/{sid}/messages", headers=a, params={"cursor": flipped})
        assert tampered.status_code == 400


@pytest.mark.parametrize(
    ("route", "params"),
    [
        ("/v1/sessions", {"limit": str(10**30)}),
        ("/v1/sessions", {"limit": "-1"}),
        ("/v1/sessions", {"limit": "1e3"}),
        ("/v1/sessions", {"created_after": "9999999-01-01T00:00:00Z"}),
        ("/v1/sessions", {"created_after": "2020-01-01T00:00:00"}),
        ("/v1/sessions", {"search": "x" * 6000}),
        ("/v1/sessions", {"cursor": "A" * 5000}),
        ("/v1/sessions/{sid}/messages", {"after_seq": str(2**31)}),
        ("/v1/sessions/{sid}/messages", {"after_seq": "-5"}),
        ("/v1/sessions/{sid}/messages", {"newest": "0"}),
        ("/v1/sessions/{sid}/messages", {"newest": str(10**20)}),
        ("/v1/sessions/{sid}/messages", {"limit": str(2**63)}),
    ],
)
def test_out_of_range_query_numbers_are_4xx_problems(
    base_url: str, names: dict[str, str], route: str, params: dict[str, str]
) -> None:
    a = _app(names["acme"])
    with httpx.Client(base_url=base_url, timeout=30) as c:
        sid = c.post("/v1/sessions", headers=a, json={"agent_id": "bot"}).json()["id"]
        response = c.get(route.format(sid=sid), headers=a, params=params)
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == PROBLEM


def test_a_deeply_nested_metadata_filter_is_invalid_input_not_500(
    base_url: str, names: dict[str, str]
) -> None:
    # 3,000 levels fit in a query string: json.loads raises RecursionError, not ValueError.
    nested = '{"k":' + "[" * 3000 + "]" * 3000 + "}"
    with httpx.Client(base_url=base_url, timeout=30) as c:
        response = c.get("/v1/sessions", headers=_app(names["acme"]), params={"metadata": nested})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM


# --- /v1: import writes only beneath the token's scope ------------------------------


def _export(c: httpx.Client, headers: dict[str, str]) -> list[dict[str, Any]]:
    response = c.get("/v1/scope/export", headers=headers)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def _ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_import_cannot_write_outside_the_token_scope(base_url: str, names: dict[str, str]) -> None:
    acme, globex = names["acme"], names["globex"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        made = c.post("/v1/sessions", headers=_app(globex), json={"agent_id": "bot"}).json()
        c.post(
            f"/v1/sessions/{made['id']}/messages",
            headers=_app(globex),
            json={"messages": [{"role": "user", "content": "theirs"}]},
        )
        records = _export(c, _app(globex))
        ndjson = {"Content-Type": "application/x-ndjson"}
        # As exported: its root is globex's, outside acme's token.
        refused = c.post("/v1/scope/import", headers=_app(acme, **ndjson), content=_ndjson(records))
        assert refused.status_code == 403, refused.text
        # The header says acme, the rows still name globex: refused, nothing written.
        lied = [dict(r) for r in records]
        lied[0]["root"] = acme
        refused = c.post("/v1/scope/import", headers=_app(acme, **ndjson), content=_ndjson(lied))
        assert refused.status_code == 422, refused.text
        # into= another tenant: refused.
        into = c.post(
            "/v1/scope/import",
            headers=_app(acme, **ndjson),
            params={"into": globex},
            content=_ndjson(records),
        )
        assert into.status_code == 403
        # A field the format does not have (a tenant of its own) is refused.
        extra = [dict(r) for r in records]
        for r in extra:
            if r["type"] == "session":
                r["tenant_id"] = globex
        refused = c.post(
            "/v1/scope/import",
            headers=_app(acme, **ndjson),
            params={"into": acme},
            content=_ndjson(extra),
        )
        assert refused.status_code == 422
        # Moved into acme: lands in acme, globex's rows untouched.
        moved = c.post(
            "/v1/scope/import",
            headers=_app(acme, **ndjson),
            params={"into": acme},
            content=_ndjson(records),
        )
        assert moved.status_code == 200, moved.text
        assert c.get(f"/v1/sessions/{made['id']}", headers=_app(acme)).json()["scope"] == acme
        assert c.get(f"/v1/sessions/{made['id']}", headers=_app(globex)).json()["scope"] == globex


def _remote_ref_schema(url: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"$ref": url}}, "required": ["a"]}


def test_import_refuses_a_response_schema_an_append_would_refuse(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    """An import stores each pending input's response_schema unchecked."""
    source, target = names["acme"], names["globex"]
    paused(database, source, {"type": "object", "properties": {"a": {"type": "integer"}}})
    with httpx.Client(base_url=base_url, timeout=30) as c:
        records = _export(c, _app(source))
        schema = json.dumps(_remote_ref_schema("http://127.0.0.1:9/x.json"))
        for r in records:
            if r["type"] == "pending_input":
                r["response_schema"] = r["response_schema_json"] = schema
        imported = c.post(
            "/v1/scope/import",
            headers=_app(target, **{"Content-Type": "application/x-ndjson"}),
            params={"into": target},
            content=_ndjson(records),
        )
    # RequestedInput refuses a non-local $ref when a message asks; an import must too.
    assert imported.status_code == 422, imported.text


# --- /v1: what the open endpoints say -----------------------------------------------


def test_metrics_and_readyz_name_no_tenant_scope_or_session(
    base_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    with httpx.Client(base_url=base_url, timeout=30) as c:
        sid = c.post("/v1/sessions", headers=_app(f"{acme}/deep"), json={"agent_id": "bot"}).json()[
            "id"
        ]
        c.get(f"/v1/sessions/{sid}", headers=_app(acme))
        c.get(f"/v1/no/such/{acme}", headers=_app(acme))
        c.get(f"/console/tenants/{acme}/sessions/{sid}")
        metrics = c.get("/metrics")
        ready = c.get("/readyz")
    assert metrics.status_code == 200
    for secret in (acme, sid, sid[4:], "deep", "ops@example"):
        assert secret not in metrics.text
        assert secret not in ready.text


def test_a_chunked_body_past_the_bound_is_413(base_url: str, names: dict[str, str]) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"agent_id": "bot", "title": "'
        for _ in range(40):
            yield b"x" * 32 * 1024
        yield b'"}'

    with httpx.Client(base_url=base_url, timeout=30) as c:
        response = c.post(
            "/v1/sessions",
            headers=_app(names["acme"], **{"Content-Type": "application/json"}),
            content=chunks(),
        )
    assert response.status_code == 413
    assert response.headers["content-type"] == PROBLEM


def test_no_cors_without_configured_origins(base_url: str, names: dict[str, str]) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        pre = c.options(
            "/v1/sessions",
            headers={
                "Origin": "https://evil.example",
                "Access-Control-Request-Method": "DELETE",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        got = c.get("/v1/sessions", headers=_app(names["acme"], Origin="https://evil.example"))
    assert "access-control-allow-origin" not in pre.headers
    assert "access-control-allow-origin" not in got.headers


# --- console: the answer form a response schema makes --------------------------------


def _nested_arrays(depth: int, min_items: int = 18) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "minItems": min_items, "items": schema}
    return schema


def _controls(f: Field) -> int:
    return 1 + sum(_controls(child) for child in f.children)


def test_a_small_response_schema_makes_a_small_form() -> None:
    """Each nested array level multiplies the form by 20 rows: 20 ** depth controls."""
    deepest = _nested_arrays(8)
    # Accepted when a message asks (9 levels, 10 subschemas, under 200 bytes)...
    check_response_schema(deepest)
    assert len(json.dumps(deepest)) < 400
    # ...while its form would hold 20 ** 8 controls; 3 levels already make 8,421.
    started = time.monotonic()
    form = fields_for(_nested_arrays(3))
    spent = time.monotonic() - started
    assert _controls(form) <= 1000, f"{_controls(form)} controls in {spent:.2f}s"


def test_the_session_page_of_a_nested_array_schema_stays_small(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    sid = paused(database, acme, _nested_arrays(3))
    with signed_in(base_url, acme) as ops:
        started = time.monotonic()
        page = ops.get(_page(acme, sid))
        spent = time.monotonic() - started
    assert page.status_code == 200
    # Depth 3 of the 8 allowed: already megabytes of controls.
    assert len(page.content) < 1_000_000, f"{len(page.content):,} bytes in {spent:.2f}s"


_XSS = '"><img src=x onerror=alert(1)><script>alert(1)</script>'


def test_host_text_is_never_markup_on_the_console(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    schema = {
        "type": "object",
        "description": _XSS,
        "properties": {
            _XSS: {"type": "string", "description": _XSS, "pattern": _XSS, "format": _XSS},
            "choice": {"enum": [_XSS, "ok"], "description": _XSS},
            "titled": {"oneOf": [{"const": 1, "title": _XSS}, {"const": 2, "title": "two"}]},
            "n": {"type": "number", "minimum": 0, "default": 1},
        },
    }
    sid = paused(database, acme, schema, title=_XSS)
    with signed_in(base_url, acme) as ops:
        listing = ops.get("/console/", params={"search": _XSS})
        page = ops.get(_page(acme, sid))
    for html in (listing.text, page.text):
        assert "<script>" not in html
        assert "<img" not in html
        assert "onerror=alert" not in html.replace("onerror=alert(1)&gt;", "")
    assert page.headers["content-security-policy"].startswith("default-src 'none'")


def test_console_search_takes_like_wildcards_literally(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    """escape_like escapes with "/", the console's ILIKE says ESCAPE '\\'."""
    acme = names["acme"]
    plain = paused(database, acme, None, title="refund 42")
    percent = paused(database, acme, None, title="100% refund")
    with signed_in(base_url, acme) as ops:
        for term, wanted, unwanted in (
            ("%", percent, plain),
            ("_", None, plain),
            ("\\", None, plain),
            ("0% r", percent, plain),
            ("' OR 1=1 --", None, plain),
            ("refund & !x | y:*", None, plain),
        ):
            page = ops.get("/console/", params={"search": term, "tenant": acme})
            assert page.status_code == 200, term
            if wanted is not None:
                assert wanted in page.text, term
            assert unwanted not in page.text, term


def test_sign_in_and_out_redirect_only_to_the_console(base_url: str, names: dict[str, str]) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        csrf = csrf_of(c.get("/console/sign-in", params={"next": "//evil.example/"}).text)
        signed = c.post(
            "/console/sign-in",
            params={"next": "https://evil.example/"},
            data={"csrf": csrf, "token": token(names["acme"]), "next": "//evil.example"},
        )
        assert signed.status_code == 303
        assert signed.headers["location"] == "/console/"
        csrf = csrf_of(c.get("/console/").text)
        out = c.post(
            "/console/sign-out",
            params={"next": "//evil.example/"},
            data={"csrf": csrf, "next": "//evil.example"},
        )
        assert out.status_code == 303
        assert out.headers["location"] == "/console/sign-in?notice=signed-out"
        notice = c.get("/console/sign-in", params={"notice": "<b>phish</b>"})
        assert "phish" not in notice.text


def test_another_tenants_session_looks_like_no_session(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    acme, globex = names["acme"], names["globex"]
    theirs = paused(database, globex, None)
    nobody = ids.format_id("ses", ids.new_uuid())
    with signed_in(base_url, acme) as ops:
        answers = [
            ops.get(_page(globex, theirs)),
            ops.get(_page(acme, theirs)),
            ops.get(_page(globex, nobody)),
        ]
        nonsense = ops.get(_page(globex, "ses_" + "0" * 26))
        huge = ops.get(_page(acme, theirs), params={"before": str(10**30)})
    assert {a.status_code for a in answers} == {404}
    assert answers[0].text == answers[1].text == answers[2].text
    assert nonsense.status_code < 500
    assert huge.status_code < 500


# --- console: CSRF -------------------------------------------------------------------


def test_a_csrf_pair_from_another_browser_is_refused(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    """The form token is an HMAC of a per-browser nonce only, not of the operator's session.

    Anyone gets a (nonce, token) pair from the sign-in page without a token.
    Whoever can set a cookie for the console's host (a sibling subdomain,
    which is also same-site for SameSite=Strict, or a plain-HTTP hop: the
    cookie has no ``__Host-`` prefix) plants that nonce in an operator's
    browser and posts the pair's token as that operator.
    """
    acme = names["acme"]
    sid = paused(database, acme, None)
    with httpx.Client(base_url=base_url, timeout=30) as attacker:
        pair_token = csrf_of(attacker.get("/console/sign-in").text)
        pair_nonce = attacker.cookies["cortex_console_csrf"]
    with signed_in(base_url, acme, subject="victim") as victim:
        victim.cookies.set("cortex_console_csrf", pair_nonce, path="/console")
        forged = victim.post(
            _page(acme, sid) + "/abort", data={"csrf": pair_token, "reason": "forged"}
        )
    assert forged.status_code == 403, "a planted nonce let another's CSRF token act"


# --- console: the audit trail --------------------------------------------------------


async def _as(url: str, *statements: str) -> list[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    failures = []
    try:
        for statement in statements:
            try:
                await conn.execute(statement)
            except asyncpg.PostgresError as exc:
                failures.append(type(exc).__name__)
    finally:
        await conn.close()
    return failures


def test_the_application_role_cannot_alter_the_audit_trail(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    sid = paused(database, acme, None)
    with signed_in(base_url, acme) as ops:
        csrf = csrf_of(ops.get(_page(acme, sid)).text)
        ops.post(_page(acme, sid) + "/abort", data={"csrf": csrf, "reason": "r"})
    bind = f"SELECT set_config('cortex.tenant', '{acme}', false)"
    failures = asyncio.run(
        _as(
            database.app_url,
            bind,
            "UPDATE console_actions SET subject = 'nobody'",
            "DELETE FROM console_actions",
            "TRUNCATE console_actions",
            "ALTER TABLE console_actions DISABLE ROW LEVEL SECURITY",
            "DROP POLICY tenant_isolation ON console_actions",
        )
    )
    assert failures == ["InsufficientPrivilegeError"] * 3 + ["InsufficientPrivilegeError"] * 2


def test_an_operator_of_acme_never_reads_globex_audit_rows(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    acme, globex = names["acme"], names["globex"]
    theirs = paused(database, globex, None)
    with signed_in(base_url, globex, subject="globex-op") as ops:
        csrf = csrf_of(ops.get(_page(globex, theirs)).text)
        ops.post(_page(globex, theirs) + "/abort", data={"csrf": csrf, "reason": "r"})
    mine = paused(database, acme, None, session_id=theirs)
    with signed_in(base_url, acme) as ops:
        page = ops.get(_page(acme, mine))
    assert page.status_code == 200
    assert "globex-op" not in page.text


def test_the_audit_trail_of_a_session_is_its_tenants_only(
    database: Database, base_url: str, names: dict[str, str]
) -> None:
    """Session ids are per tenant; the session page's trail filters by id alone."""
    acme, globex = names["acme"], names["globex"]
    theirs = paused(database, globex, None)
    # acme's app chooses the same id for a session of its own (ids are per tenant).
    mine = paused(database, acme, None, session_id=theirs)
    assert mine == theirs
    with signed_in(base_url, "*", subject="root-op") as ops:
        csrf = csrf_of(ops.get(_page(globex, theirs)).text)
        done = ops.post(_page(globex, theirs) + "/abort", data={"csrf": csrf, "reason": "r"})
        assert done.status_code == 303
        page = ops.get(_page(acme, mine))
    assert page.status_code == 200
    # globex's abort shows on acme's session page.
    assert "No operator actions yet." in page.text, "another tenant's audit row is shown"


# --- console: schemas that reach the network ----------------------------------------


class _Hits(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b'{"type": "integer"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Handler", (_Hits,), {"hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


async def _plant_schema(db: Database, session_id: str, schema: dict[str, Any]) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        text = json.dumps(schema)
        await conn.execute(
            "UPDATE pending_inputs SET response_schema = $1::jsonb, response_schema_json = $1::json"
            " WHERE session_id = $2",
            text,
            session_uuid(session_id),
        )
    finally:
        await conn.close()


def test_the_console_never_fetches_a_schema_reference(
    database: Database,
    base_url: str,
    names: dict[str, str],
    listener: tuple[str, list[str]],
) -> None:
    """A stored schema with a remote $ref (an import, or a row written before schemas were checked)."""
    acme = names["acme"]
    url, hits = listener
    sid = paused(database, acme, {"type": "object", "properties": {"a": {"type": "integer"}}})
    asyncio.run(_plant_schema(database, sid, _remote_ref_schema(f"{url}/internal/secret.json")))
    with signed_in(base_url, acme) as ops:
        page = ops.get(_page(acme, sid))
        assert page.status_code == 200
        answered = ops.post(
            _page(acme, sid) + "/resume",
            data={"csrf": csrf_of(page.text), "interrupt_id": "approve", "f/a": "1"},
        )
    assert answered.status_code == 422
    assert hits == [], f"the server fetched {hits} for a form error"


# --- objects cortex did not create ----------------------------------------------------


@pytest.fixture
def own_db(server_url: str) -> Iterator[Database]:
    database = create_database(server_url)
    yield database
    asyncio.run(admin(database.owner_url, f'DROP OWNED BY "{database.app_role}"'))
    drop_database(server_url, database)


async def _owner_name(db: Database) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        return str(await conn.fetchval("SELECT current_user"))
    finally:
        await conn.close()


async def _waiting(login: str, scope: str | None) -> Any:
    async with OperatorView(login, operator_scope=scope) as view:
        return await view.list_waiting()


planted = pytest.mark.skipif(
    CITUS_URL is not None, reason="plants objects as a role the Citus lane does not propagate"
)


@planted
async def test_a_console_actions_shadowed_on_the_path_is_refused(own_db: Database) -> None:
    # As for sessions or messages: a relation ahead of public would take the audit rows.
    db = own_db
    await admin(db.owner_url, f'GRANT CREATE ON DATABASE "{db.name}" TO "{db.app_role}"')
    owner = await _owner_name(db)
    await admin(
        db.app_url,
        f'CREATE SCHEMA "{owner}"',
        f'CREATE TABLE "{owner}".console_actions (LIKE public.console_actions)',
        f'GRANT ALL ON "{owner}".console_actions TO PUBLIC',
    )
    try:
        async with cortex.connect(db.owner_url) as store:
            with use_scope("acme"):
                await store.record_console_action(ActionKind.SIGN_IN, subject="ops")
    except cortex.SchemaMismatch:
        return
    conn = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        real = await conn.fetchval("SELECT count(*) FROM public.console_actions")
        taken = await conn.fetchval(f'SELECT count(*) FROM "{owner}".console_actions')
    finally:
        await conn.close()
    pytest.fail(
        f"connected; the audit row went to {owner}.console_actions ({taken}, public {real})"
    )


@planted
def test_a_schema_named_cortex_console_does_not_feed_the_console(own_db: Database) -> None:
    """After SET LOCAL ROLE cortex_console, "$user" on the search path names schema cortex_console."""
    db = own_db
    tenant = f"t{uuid.uuid4().hex[:8]}"
    asyncio.run(_paused(db.app_url, tenant, None, title="real"))
    asyncio.run(admin(db.owner_url, f'GRANT CREATE ON DATABASE "{db.name}" TO "{db.app_role}"'))
    asyncio.run(
        admin(
            db.app_url,
            "CREATE SCHEMA cortex_console",
            "CREATE VIEW cortex_console.sessions AS SELECT tenant_id, id, agent_id, scope,"
            " 'forged'::text AS title, state, updated_at FROM (VALUES ('"
            + tenant
            + "'::text, gen_random_uuid(), 'bot'::text, '"
            + tenant
            + "'::text, 'paused'::text, now())) AS v(tenant_id, id, agent_id, scope, state, updated_at)",
            "GRANT USAGE ON SCHEMA cortex_console TO PUBLIC",
            "GRANT SELECT ON cortex_console.sessions TO PUBLIC",
        )
    )
    with console_login(db) as login:
        try:
            page = asyncio.run(_waiting(login, None))
        except cortex.CortexError:
            return  # refused: fine
    titles = [row.title for row in page.rows]
    assert "forged" not in titles, f"the console read another role's relation: {titles}"
    assert titles == ["real"]


@planted
async def test_pg_temp_objects_never_run_inside_the_definer_function(own_db: Database) -> None:
    """The pairs' trigger function runs as its owner: a session's temp objects never reach it."""
    db = own_db
    tenant = f"t{uuid.uuid4().hex[:8]}"
    async with cortex.connect(db.app_url) as store:
        with use_scope(tenant):
            await store.create_session("bot", metadata={"k": "v"})
    conn = await asyncpg.connect(asyncpg_dsn(db.app_url))
    try:
        await conn.execute(
            "CREATE TEMP TABLE metadata_pairs (tenant_id text, pair bigint, hour bigint,"
            " session_id uuid)"
        )
        await conn.execute(
            "CREATE FUNCTION pg_temp.cortex_metadata_pairs(t text, d json, l jsonb)"
            " RETURNS bigint[] LANGUAGE sql AS 'SELECT ARRAY[(1/0)::bigint]'"
        )
        await conn.execute(
            "CREATE FUNCTION pg_temp.unnest(a bigint[]) RETURNS SETOF bigint LANGUAGE sql"
            " AS 'SELECT (1/0)::bigint'"
        )
        await conn.execute(f"SELECT set_config('cortex.tenant', '{tenant}', false)")
        await conn.execute(
            'UPDATE public.sessions SET metadata_json = \'{"k": "w"}\'::json,'
            " updated_at = now() WHERE tenant_id = $1",
            tenant,
        )
        planted = await conn.fetchval("SELECT count(*) FROM pg_temp.metadata_pairs")
        kept = await conn.fetchval(
            "SELECT count(*) FROM public.metadata_pairs WHERE tenant_id = $1", tenant
        )
    finally:
        await conn.close()
    assert planted == 0
    assert kept == 1


@planted
def test_console_sees_ignores_operators_planted_in_public(own_db: Database) -> None:
    db = own_db
    tenant, other = f"t{uuid.uuid4().hex[:8]}", f"u{uuid.uuid4().hex[:8]}"
    asyncio.run(_paused(db.app_url, tenant, None, title="mine"))
    asyncio.run(_paused(db.app_url, other, None, title="theirs"))
    asyncio.run(admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"'))
    # Overloads that would match a varchar or unknown operand better than pg_catalog's.
    asyncio.run(
        admin(
            db.app_url,
            "CREATE FUNCTION public.yes(a text, b varchar) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
            "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = varchar, FUNCTION = public.yes)",
            "CREATE FUNCTION public.starts_with(a text, b varchar) RETURNS boolean LANGUAGE sql"
            " AS 'SELECT true'",
            "CREATE FUNCTION public.cat(a text, b varchar) RETURNS text LANGUAGE sql AS 'SELECT b::text'",
            "CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = varchar, FUNCTION = public.cat)",
        )
    )
    with console_login(db) as login:
        page = asyncio.run(_waiting(login, tenant))
    assert [r.title for r in page.rows] == ["mine"]


# --- /v1 behind a path prefix ---------------------------------------------------------


async def test_a_root_path_does_not_skip_token_checks(database: Database) -> None:
    """Mounted under a prefix (``--root-path``), scope["path"] carries it: "/api/v1/...".

    The router strips root_path and matches /v1 routes; AuthMiddleware looks
    for a path starting "/v1/" and lets the request through unchecked.
    """
    from cortex.server import create_app

    app = create_app(database.app_url, signing_key="k" * 32, telemetry=False)
    transport = httpx.ASGITransport(app=app, root_path="/api")
    async with httpx.AsyncClient(transport=transport, base_url="http://cortex") as c:
        listed = await c.get("/api/v1/sessions")
        made = await c.post("/api/v1/sessions", json={"agent_id": "bot"})
    assert (listed.status_code, made.status_code) == (401, 401), (listed.text, made.text)
