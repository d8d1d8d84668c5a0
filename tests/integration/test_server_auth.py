"""Tokens the server must refuse (401), and the one it accepts, over real HTTP."""

from __future__ import annotations

import secrets
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cortex.server import SigningKey, create_app
from cortex.server.auth import Unauthorized, VerifiedTokens
from tests.conftest import Database
from tests.serving import running

pytestmark = pytest.mark.anyio  # with the parametrized test, anyio must mark at collection

SECRET = secrets.token_urlsafe(32)
PRIVATE = ec.generate_private_key(ec.SECP256R1())
PUBLIC_PEM = (
    PRIVATE.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


@pytest.fixture(scope="module")
def hs_url(database: Database) -> Iterator[str]:
    with running(create_app(database.app_url, signing_key=SECRET)) as url:
        yield url


@pytest.fixture(scope="module")
def es_url(database: Database) -> Iterator[str]:
    with running(create_app(database.app_url, signing_key=PUBLIC_PEM)) as url:
        yield url


def claims(**changes: Any) -> dict[str, Any]:
    base = {"sub": "ada", "scope": "acme", "role": "app", "exp": int(time.time()) + 600}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


async def status(url: str, token: str | None) -> httpx.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url) as c:
        return await c.get("/v1/sessions/count", headers=headers)


def _unsigned(payload: dict[str, Any]) -> str:
    import base64
    import json

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(payload)}."


def hs(**changes: Any) -> str:
    return jwt.encode(claims(**changes), SECRET, algorithm="HS256")


def _hs512(payload: dict[str, Any]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyJWT advises a longer key for HS512: beside the point
        return jwt.encode(payload, SECRET, algorithm="HS512")


def _refused(case: str) -> str | None:
    tokens: dict[str, Any] = {
        "missing": lambda: None,
        "malformed": lambda: "not-a-jwt",
        "wrong key": lambda: jwt.encode(claims(), "x" * 40, algorithm="HS256"),
        "expired": lambda: hs(exp=int(time.time()) - 5),
        "no exp": lambda: hs(exp=None),
        "bad role": lambda: hs(role="root"),
        "bad scope": lambda: hs(scope="a//b"),
        "no sub": lambda: hs(sub=None),
        "alg none": lambda: _unsigned(claims()),
        "another HMAC algorithm": lambda: _hs512(claims()),
    }
    token: str | None = tokens[case]()
    return token


REFUSED = [
    "missing",
    "malformed",
    "wrong key",
    "expired",
    "no exp",
    "bad role",
    "bad scope",
    "no sub",
    "alg none",
    "another HMAC algorithm",
]


@pytest.mark.parametrize("case", REFUSED)
async def test_hs256_server_refuses(hs_url: str, case: str) -> None:
    response = await status(hs_url, _refused(case))
    assert response.status_code == 401, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["title"] == "Unauthorized"


async def test_hs256_server_accepts_both_roles(hs_url: str) -> None:
    for role in ("app", "operator"):
        token = jwt.encode(claims(role=role), SECRET, algorithm="HS256")
        assert (await status(hs_url, token)).status_code == 200


async def test_public_key_server(es_url: str) -> None:
    good = jwt.encode(claims(), PRIVATE, algorithm="ES256")
    assert (await status(es_url, good)).status_code == 200
    other = ec.generate_private_key(ec.SECP256R1())
    assert (await status(es_url, jwt.encode(claims(), other, algorithm="ES256"))).status_code == 401
    # Algorithm confusion: an HS256 token whose "secret" is the public key's PEM text.
    import base64
    import hashlib
    import hmac
    import json

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims())}"
    tag = hmac.new(PUBLIC_PEM.encode(), signing_input.encode(), hashlib.sha256).digest()
    forged = f"{signing_input}.{base64.urlsafe_b64encode(tag).rstrip(b'=').decode()}"
    assert (await status(es_url, forged)).status_code == 401
    assert (await status(es_url, _unsigned(claims()))).status_code == 401


async def test_health_needs_no_token(hs_url: str) -> None:
    async with httpx.AsyncClient(base_url=hs_url) as c:
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.get("/v1/openapi.json")).status_code == 200


async def test_a_token_that_verified_is_refused_once_it_expires(hs_url: str) -> None:
    expires = int(time.time()) + 2
    token = hs(exp=expires)
    assert (await status(hs_url, token)).status_code == 200
    assert (await status(hs_url, token)).status_code == 200  # the kept principal
    await anyio.sleep(expires - time.time() + 0.1)
    response = await status(hs_url, token)
    assert response.status_code == 401, response.text
    assert "expired" in response.json()["detail"]


async def test_one_token_narrowed_two_ways_acts_in_each(hs_url: str) -> None:
    token = hs(scope="acme")
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=hs_url, headers=headers) as c:
        for narrowed in ("acme/a", "acme/b", "acme/a"):
            got = await c.get("/v1/scope-data", headers={"Cortex-Scope": narrowed})
            assert got.status_code == 200, got.text
            assert got.json()["scope"] == narrowed
        assert (
            await c.get("/v1/scope-data", headers={"Cortex-Scope": "globex"})
        ).status_code == 403


def test_only_tokens_that_verify_are_kept_and_the_oldest_go_first() -> None:
    tokens = VerifiedTokens(SigningKey.parse(SECRET), size=2)
    good = [f"Bearer {hs(sub=name)}" for name in ("a", "b", "c")]
    first = tokens.principal(good[0], None)
    assert tokens.principal(good[0], None) is first
    for forged in ("Bearer not-a-jwt", f"Bearer {jwt.encode(claims(), 'x' * 40)}"):
        with pytest.raises(Unauthorized):
            tokens.principal(forged, None)
    tokens.principal(good[1], None)
    tokens.principal(good[2], None)
    # Room for two: the first token is verified again, a new principal.
    assert tokens.principal(good[0], None) is not first
