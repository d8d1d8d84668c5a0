"""Opaque, signed cursors: what a client passes back to continue a listing.

A cursor is the store's own position (a :class:`cortex.SessionCursor`, or a
session and a ``seq``) as JSON, with an HMAC-SHA256 of it: a client can hand
it back but not change it. Anything that does not verify is InvalidCursor
(400), before the store is called.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any, Final

from cortex.errors import InvalidInput

__all__ = ["CursorSigner", "InvalidCursor"]

_TAG_BYTES: Final = 32


class InvalidCursor(InvalidInput):
    """A cursor that was changed, is malformed, or belongs to another listing (HTTP 400)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CursorSigner:
    """Sign and open cursors with one key (derived from the signing key, or given)."""

    def __init__(self, key: bytes) -> None:
        # Its own key, so a cursor's tag is never a token's signature.
        self._key = hashlib.sha256(b"cortex cursor\x00" + key).digest()

    def sign(self, kind: str, position: dict[str, Any]) -> str:
        """An opaque cursor of ``kind`` holding ``position`` (JSON values)."""
        body = json.dumps({"kind": kind, **position}, separators=(",", ":"), sort_keys=True)
        raw = body.encode()
        tag = hmac.new(self._key, raw, hashlib.sha256).digest()
        return _b64(raw + tag)

    def open(self, kind: str, cursor: str) -> dict[str, Any]:
        """The position a cursor of ``kind`` holds.

        Raises:
            InvalidCursor: it does not verify, or is of another kind.
        """
        try:
            data = _unb64(cursor)
        except (ValueError, TypeError):
            raise InvalidCursor("cursor: not a cursor this server issued") from None
        raw, tag = data[:-_TAG_BYTES], data[-_TAG_BYTES:]
        good = hmac.new(self._key, raw, hashlib.sha256).digest()
        if len(data) <= _TAG_BYTES or not hmac.compare_digest(tag, good):
            raise InvalidCursor("cursor: not a cursor this server issued")
        position = json.loads(raw)
        if not isinstance(position, dict) or position.pop("kind", None) != kind:
            raise InvalidCursor(f"cursor: not a cursor of a {kind} listing")
        return position
