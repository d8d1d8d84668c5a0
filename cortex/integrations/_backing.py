"""What both adapters share: the store they run on, the scope they act in, scope segments.

An adapter is built on an existing :class:`~cortex.Store` (the caller owns
it) or on a URL (the adapter owns the engine it makes, checks the schema
revision on first use, and disposes it on ``close()``); nothing else runs
against the database: no table creation, no migration. It acts in a base
scope: the one given at construction, else the caller's current scope
(bound with :func:`cortex.use_scope`, as for every store call). This module
imports no framework.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any, Final

from sqlalchemy.engine import URL

from cortex._engine import check_schema, make_engine
from cortex.errors import InvalidInput
from cortex.scope import MAX_SEGMENT_LENGTH, Scope, current_scope
from cortex.store import Store

__all__ = ["Backing", "segment"]

_PLAIN: Final = re.compile(r"[A-Za-z0-9._:\-]{1,64}")
# Names that are not plain segments are encoded under these prefixes; a plain
# name that starts with one is encoded too, so no two names share a segment.
_B32: Final = "b32."
_SHA: Final = "sha."


def segment(name: str) -> str:
    """The scope segment a framework name (an app name, a user id) maps to, one to one.

    A name that is already a valid segment is itself; any other name is its
    UTF-8 in lower-case base32 under ``b32.``, or, when that would pass 64
    characters, ``sha.`` and 56 hex digits of its SHA-256.

    Raises:
        InvalidInput: an empty name, or one that is not a string.
    """
    if not isinstance(name, str):
        raise InvalidInput(f"an app name or user id must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidInput("an app name or user id must not be empty")
    if _PLAIN.fullmatch(name) and not name.startswith((_B32, _SHA)):
        return name
    encoded = _B32 + base64.b32encode(name.encode("utf-8", "surrogatepass")).decode()
    encoded = encoded.rstrip("=").lower()
    if len(encoded) <= MAX_SEGMENT_LENGTH:
        return encoded
    return _SHA + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:56]


class Backing:
    """A store (owned or borrowed) and the base scope an adapter acts in."""

    def __init__(
        self, store_or_url: Store | str | URL, scope: Scope | str | None, **pool_options: Any
    ) -> None:
        if isinstance(store_or_url, Store):
            if pool_options:
                raise InvalidInput("pool options apply only when the adapter opens its own store")
            self.store, self._owned, self._checked = store_or_url, False, True
        else:
            engine = make_engine(store_or_url, manual_transactions=True, **pool_options)
            self.store, self._owned, self._checked = Store(engine), True, False
        self._scope = None if scope is None else Scope.parse(str(scope))

    async def ready(self) -> Store:
        """The store, after checking (once) that a URL-built store's schema is current.

        Raises:
            SchemaMismatch: the database is not at this cortex's revision
                (``cortex db upgrade`` fixes it).
        """
        if not self._checked:
            # Concurrent first calls may each check: harmless, and cheaper
            # than a lock that would have to work across event loops.
            await check_schema(self.store.engine)
            self._checked = True
        return self.store

    def base(self) -> Scope:
        """The construction scope, else the caller's current scope.

        Raises:
            ScopeMissing: neither was given.
        """
        return self._scope if self._scope is not None else current_scope()

    async def close(self) -> None:
        """Dispose the engine if this adapter made it; a borrowed store stays open."""
        if self._owned:
            await self.store.engine.dispose()
