"""Who may call ``cortex serve``: the signing key, the bearer token and the scope it grants.

A token is a JWT whose claims name the scope (``scope``), the subject
(``sub``), the expiry (``exp``, required) and the role (``role``: ``app`` or
``operator``). The key is a secret of at least 32 bytes (HS256: cortex, or
the host, signs) or a PEM public key (RS256, ES256 or EdDSA: the host's
identity provider signs, cortex only verifies). Exactly one algorithm is
accepted per key, so no token can choose how it is checked (``alg: none``,
or an HS256 token "signed" with the public key's text, are refused).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final, Literal

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from cortex.asgi import (
    PROBLEM_JSON,
    Receive,
    Send,
    error_body,
    header,
    problem,
    route_path,
    status_for,
)
from cortex.asgi import ASGIApp as _App
from cortex.asgi import ASGIScope as _Request
from cortex.errors import CortexError, InvalidInput, InvalidScope, ScopeViolation
from cortex.scope import Scope, use_scope

__all__ = [
    "ALL_TENANTS",
    "KEY_ENV",
    "MIN_SECRET_BYTES",
    "ROLES",
    "AuthMiddleware",
    "Principal",
    "SigningKey",
    "decode_token",
    "issue_token",
]

KEY_ENV: Final = "CORTEX_SIGNING_KEY"
MIN_SECRET_BYTES: Final = 32
ROLES: Final = ("app", "operator")
SCOPE_HEADER: Final = "cortex-scope"
# The scope claim of an operator token for every tenant: the console reads it, /v1 refuses it.
ALL_TENANTS: Final = "*"
# How a key is made, for the error that asks for one.
MAKE_KEY: Final = (
    f"set {KEY_ENV} to a secret of at least {MIN_SECRET_BYTES} bytes, e.g."
    f" export {KEY_ENV}=\"$(python -c 'import secrets; print(secrets.token_urlsafe(32))')\","
    " or to a PEM public key (RS256, ES256 or EdDSA) of your identity provider"
)

Role = Literal["app", "operator"]


@dataclass(frozen=True)
class SigningKey:
    """The key tokens are verified with, and the one algorithm it accepts."""

    algorithm: str
    key: Any
    # The secret as bytes (HS256 only): what `cortex token issue` signs with.
    secret: bytes | None = None

    @classmethod
    def parse(cls, text: str | bytes | None) -> SigningKey:
        """A secret (HS256) or a PEM public key (RS256 for RSA, ES256 for P-256, EdDSA for Ed25519).

        Raises:
            InvalidInput: no key, a secret shorter than 32 bytes, or a PEM
                key of another kind; the message says how to make one.
        """
        if not text:
            raise InvalidInput(f"no signing key: {MAKE_KEY}")
        raw = text.encode() if isinstance(text, str) else text
        if raw.lstrip().startswith(b"-----BEGIN"):
            return cls._public(raw)
        if len(raw) < MIN_SECRET_BYTES:
            raise InvalidInput(
                f"the signing key is {len(raw)} bytes, fewer than {MIN_SECRET_BYTES}: {MAKE_KEY}"
            )
        return cls("HS256", raw, raw)

    @classmethod
    def _public(cls, pem: bytes) -> SigningKey:
        try:
            key = load_pem_public_key(pem)
        except ValueError:
            raise InvalidInput(
                f"the signing key is not a PEM public key (a private key stays with the issuer): {MAKE_KEY}"
            ) from None
        if isinstance(key, rsa.RSAPublicKey):
            return cls("RS256", key)
        if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
            return cls("ES256", key)
        if isinstance(key, ed25519.Ed25519PublicKey):
            return cls("EdDSA", key)
        raise InvalidInput(f"the PEM key is of a kind cortex does not verify: {MAKE_KEY}")


@dataclass(frozen=True)
class Principal:
    """Who the request acts as: the token's subject, role and scope (narrowed by the header)."""

    subject: str
    role: Role
    scope: Scope
    granted: Scope


class Unauthorized(CortexError):
    """No token, or one that does not verify: answered 401."""


def issue_token(
    key: SigningKey, *, scope: str, role: Role = "app", ttl: int = 3600, subject: str = "cortex"
) -> str:
    """A token for ``scope``, signed with the HS256 secret ``key``.

    Raises:
        InvalidInput: the key is a public key (tokens then come from the
            identity provider), or a claim is malformed.
    """
    if key.secret is None:
        raise InvalidInput("a public key verifies tokens only: its identity provider issues them")
    if role not in ROLES:
        raise InvalidInput(f"role: one of {', '.join(ROLES)}, got {role!r}")
    if not isinstance(ttl, int) or ttl <= 0:
        raise InvalidInput(f"ttl: a positive number of seconds, got {ttl!r}")
    if not subject:
        raise InvalidInput("subject: a name, not empty")
    if scope == ALL_TENANTS and role != "operator":
        raise InvalidInput("scope: every tenant is for operator tokens only")
    now = int(time.time())
    claims = {
        "sub": subject,
        "scope": ALL_TENANTS if scope == ALL_TENANTS else str(Scope.parse(scope)),
        "role": role,
        "iat": now,
        "exp": now + ttl,
    }
    return jwt.encode(claims, key.secret, algorithm="HS256")


def decode_token(key: SigningKey, token: str) -> dict[str, Any]:
    """The claims of a token that verifies (signature, ``exp``; sub, scope and role present).

    Raises:
        Unauthorized: it does not verify, or has expired.
    """
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=[key.algorithm],
            options={"require": ["exp", "sub", "scope", "role"]},
        )
    except jwt.ExpiredSignatureError:
        raise Unauthorized("the token has expired") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(f"the token does not verify: {exc}") from None
    return claims


def verify(key: SigningKey, authorization: str | None, narrowed: str | None) -> Principal:
    """The principal of a request's ``Authorization`` and ``Cortex-Scope`` headers.

    Raises:
        Unauthorized: no bearer token, or one that does not verify.
        InvalidScope: the header names a malformed scope.
        ScopeViolation: the header names a scope outside the token's.
    """
    return _verify(key, authorization, narrowed)[0]


def _verify(
    key: SigningKey, authorization: str | None, narrowed: str | None
) -> tuple[Principal, float]:
    """:func:`verify`, with the moment the token expires."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("a bearer token is required: Authorization: Bearer <JWT>")
    claims = decode_token(key, authorization[7:].strip())
    role, subject, path = claims.get("role"), claims.get("sub"), claims["scope"]
    if path == ALL_TENANTS:
        raise Unauthorized("an every-tenant operator token is for the console; /v1 needs a scope")
    if role not in ROLES:
        raise Unauthorized(f"the token's role must be one of {', '.join(ROLES)}")
    if not isinstance(subject, str) or not subject:
        raise Unauthorized("the token's sub must be a non-empty string")
    try:
        granted = Scope.parse(path)  # InvalidScope for a non-string too
    except InvalidScope:
        raise Unauthorized("the token's scope is not a scope path") from None
    scope = granted
    if narrowed is not None:
        scope = Scope.parse(narrowed)
        if not granted.contains(scope):
            raise ScopeViolation(f"Cortex-Scope: {scope} is not within the token's scope {granted}")
    return Principal(subject, role, scope, granted), float(claims["exp"])


class VerifiedTokens:
    """The principals of tokens that verified, each until its token expires.

    A client sends one token on many requests; checking its signature once
    saves a third of a small request's server time. Only a token that
    verified is kept, so a flood of forged ones cannot fill it; a kept one
    is used only while the clock is before its ``exp``, as PyJWT checks it
    (``iat`` and ``nbf``, once passed, stay passed).
    """

    def __init__(self, key: SigningKey, *, size: int = 4096) -> None:
        self.key = key
        self.size = size
        self._kept: OrderedDict[tuple[str, str | None], tuple[Principal, float]] = OrderedDict()

    def principal(self, authorization: str | None, narrowed: str | None) -> Principal:
        """:func:`verify`'s answer, from the kept ones while the token has not expired."""
        if authorization is None:
            return verify(self.key, authorization, narrowed)
        kept = self._kept.get((authorization, narrowed))
        if kept is not None:
            if time.time() < kept[1]:
                self._kept.move_to_end((authorization, narrowed))
                return kept[0]
            del self._kept[(authorization, narrowed)]
        principal, expires = _verify(self.key, authorization, narrowed)
        self._kept[(authorization, narrowed)] = (principal, expires)
        if len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return principal


class AuthMiddleware:
    """Pure ASGI: verify each ``/v1/`` request's token and run it inside ``use_scope``.

    A pure middleware because the scope lives on a ContextVar (cortex.asgi
    says why a ``def`` dependency cannot bind it). ``open_paths`` pass
    unchecked (health, the OpenAPI document and its docs page).
    """

    def __init__(self, app: _App, *, key: SigningKey, open_paths: frozenset[str]) -> None:
        self.app = app
        self.key = key
        self.open_paths = open_paths
        self.tokens = VerifiedTokens(key)

    async def __call__(self, scope: _Request, receive: Receive, send: Send) -> None:
        """Answer 401/403/422 without calling the app, or call it with the scope bound."""
        # The path the router matches, not scope["path"]: under a root_path that
        # carries the prefix, and "/api/v1/…" would reach /v1 routes unchecked.
        path = route_path(scope)
        if scope["type"] != "http" or not path.startswith("/v1/") or path in self.open_paths:
            await self.app(scope, receive, send)
            return
        try:
            principal = self.tokens.principal(
                header(scope, "authorization"), header(scope, SCOPE_HEADER)
            )
        except Unauthorized as exc:
            await _refuse(send, 401, problem("Unauthorized", 401, str(exc)), bearer=True)
            return
        except CortexError as exc:
            await _refuse(send, status_for(exc), error_body(exc))
            return
        scope.setdefault("state", {})["cortex_principal"] = principal
        with use_scope(principal.scope):
            await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, body: dict[str, Any], *, bearer: bool = False) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    if bearer:
        headers.append((b"www-authenticate", b'Bearer realm="cortex"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
