"""Who is signed in to the console: the operator token in a cookie, and the CSRF token of each form.

The session cookie holds the operator's token itself, verified on every
request with the server's signing key: nothing is kept on the server, every
replica accepts it, and the token's ``exp`` ends the session (the cookie's
Max-Age is the same instant). It is HttpOnly (no script reads it),
SameSite=Strict (no other site's page sends it) and Secure behind TLS,
where both cookies' names take the ``__Secure-`` prefix, so a plain-HTTP
response cannot plant them. Each form carries an HMAC of a random
per-browser nonce kept in a second cookie and of the session cookie's
token, so a nonce and token obtained elsewhere (another browser, a page
before sign-in) act for nobody signed in here; a POST whose token does not
match is refused before anything runs. The nonce is replaced at sign-in and
sign-out. docs/console.md says why, and why not ``__Host-``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response

from cortex.errors import CortexError, InvalidScope
from cortex.scope import Scope
from cortex.server.auth import ALL_TENANTS, SigningKey, Unauthorized, decode_token

__all__ = [
    "COOKIE",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "PATH",
    "NotAnOperator",
    "Operator",
    "SessionCookies",
    "console_root",
]

COOKIE: Final = "cortex_console"
CSRF_COOKIE: Final = "cortex_console_csrf"
CSRF_FIELD: Final = "csrf"
PATH: Final = "/console"


def console_root(request: Request) -> str:
    """Where the console's pages are: ``/console`` beneath the prefix the app is served under.

    The prefix percent-encoded: a host's ``Mount("/{org}", ...)`` puts a
    decoded segment of the request's path there, and a ``;`` in a cookie's
    path would add attributes of the client's choosing.
    """
    prefix = str(request.scope.get("root_path", "")).rstrip("/")
    return quote(prefix, safe="/") + PATH


# The prefix of both cookies' names when they are Secure: browsers accept such
# a cookie only with the Secure flag, from a page served over TLS. Not
# "__Host-": it requires Path=/, which would send the operator token with
# every request to the host, not only the console's.
SECURE_PREFIX: Final = "__Secure-"


class NotAnOperator(CortexError):
    """A token that verifies but is not an operator's (an application token): refused, 403."""


@dataclass(frozen=True)
class Operator:
    """The signed-in operator: the token's subject, its scope (None: every tenant), its expiry."""

    subject: str
    scope: Scope | None
    expires: int
    token: str

    @property
    def where(self) -> str:
        """The operator scope, for people: a path, or "every tenant"."""
        return "every tenant" if self.scope is None else str(self.scope)


def operator_of(key: SigningKey, token: str) -> Operator:
    """The operator a token names.

    Raises:
        Unauthorized: it does not verify, has expired, or its claims are malformed.
        NotAnOperator: it verifies, but its role is not ``operator``.
    """
    claims = decode_token(key, token.strip())
    subject, path = claims.get("sub"), claims.get("scope")
    if not isinstance(subject, str) or not subject:
        raise Unauthorized("the token's sub must be a non-empty string")
    if claims.get("role") != "operator":
        raise NotAnOperator(
            "this is not an operator token: the console takes tokens with role operator"
            " (cortex token issue --role operator --scope TENANT, or --all-tenants)"
        )
    if path == ALL_TENANTS:
        scope = None
    elif not isinstance(path, str):
        raise Unauthorized("the token's scope is not a scope path")
    else:
        try:
            scope = Scope.parse(path)  # InvalidScope for a non-string too
        except InvalidScope:
            raise Unauthorized("the token's scope is not a scope path") from None
    return Operator(subject, scope, int(claims["exp"]), token.strip())


class SessionCookies:
    """Sets, reads and clears the console's two cookies; makes and checks CSRF tokens."""

    def __init__(self, key: SigningKey, csrf_key: bytes, *, secure: bool) -> None:
        self.key = key
        self._csrf_key = hmac.new(csrf_key, b"cortex console csrf", hashlib.sha256).digest()
        self._secure = secure

    def secure(self, request: Request) -> bool:
        """Whether cookies get the Secure flag: configured, or the request came over TLS."""
        return self._secure or request.url.scheme == "https"

    def path(self, request: Request) -> str:
        """The cookies' path: the console's, beneath the prefix the app is served under."""
        return console_root(request)

    def _name(self, request: Request, name: str) -> str:
        return SECURE_PREFIX + name if self.secure(request) else name

    def session_token(self, request: Request) -> str | None:
        """The session cookie's text (verified or not), if the browser sent one."""
        return request.cookies.get(self._name(request, COOKIE)) or None

    def operator(self, request: Request) -> Operator | None:
        """The operator whose token the cookie holds, if it still verifies; None otherwise."""
        token = self.session_token(request)
        if not token:
            return None
        try:
            return operator_of(self.key, token)
        except CortexError:
            return None

    def sign_in(self, request: Request, response: Response, operator: Operator) -> None:
        """Put the token in the session cookie, until it expires; a fresh CSRF nonce."""
        response.set_cookie(
            self._name(request, COOKIE),
            operator.token,
            max_age=max(operator.expires - int(time.time()), 0),
            path=self.path(request),
            secure=self.secure(request),
            httponly=True,
            samesite="strict",
        )
        self.new_nonce(request, response)

    def sign_out(self, request: Request, response: Response) -> None:
        """Clear the session cookie; a fresh CSRF nonce."""
        response.delete_cookie(
            self._name(request, COOKIE),
            path=self.path(request),
            secure=self.secure(request),
            httponly=True,
            samesite="strict",
        )
        self.new_nonce(request, response)

    def nonce(self, request: Request) -> str | None:
        """The browser's CSRF nonce, if it has one."""
        return request.cookies.get(self._name(request, CSRF_COOKIE)) or None

    def new_nonce(self, request: Request, response: Response, nonce: str | None = None) -> str:
        """Give the browser a new CSRF nonce (``nonce``, else a random one); return it."""
        nonce = nonce or secrets.token_urlsafe(32)
        response.set_cookie(
            self._name(request, CSRF_COOKIE),
            nonce,
            path=self.path(request),
            secure=self.secure(request),
            httponly=True,
            samesite="strict",
        )
        return nonce

    def csrf_token(self, request: Request, nonce: str) -> str:
        """The token a form carries for this nonce, in the browser's session (or none)."""
        session = self.session_token(request) or ""
        # Each part hashed first: the message cannot be read as another split of the two.
        message = (
            hashlib.sha256(nonce.encode()).digest() + hashlib.sha256(session.encode()).digest()
        )
        return hmac.new(self._csrf_key, message, hashlib.sha256).hexdigest()

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        """Whether a POST's CSRF token is that of the browser's nonce and session (a nonce needed)."""
        nonce = self.nonce(request)
        if not nonce or not submitted:
            return False
        return hmac.compare_digest(self.csrf_token(request, nonce), submitted)
