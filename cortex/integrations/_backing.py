"""What both adapters share: the store they run on, the scope they act in, scope segments.

An adapter is built on an existing :class:`~cortex.Store` (the caller owns
it) or on a URL. On a URL the store is opened at the adapter's first call
on an event loop, by :func:`cortex.store.open_store` (as ``connect()``
opens one: schema check, routines, Citus detection, the superuser
warning); nothing else runs against the database: no table creation, no
migration. Adapters on one URL with equal pool options share one store per
event loop, reference counted: ``close()`` releases an adapter's share on
the running loop, and the last share closed disposes the engine. An engine
is bound to the loop it was made on, so no store is shared across loops.
An adapter acts in a base scope: the one given at construction, else the
caller's current scope (bound with :func:`cortex.use_scope`, as for every
store call). This module imports no framework.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import threading
from typing import Any, Final

from sqlalchemy.engine import URL

from cortex._db.engine import normalise_url
from cortex.errors import InvalidInput
from cortex.scope import MAX_SEGMENT_LENGTH, Scope, current_scope
from cortex.store import Store, open_store

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


class _Shared:
    """One store on a URL and pool options, shared by the adapters of one event loop."""

    def __init__(self, url: URL, options: dict[str, Any]) -> None:
        self.url, self.options = url, options
        self.refs = 0
        self.store: Store | None = None
        self._opening: asyncio.Task[Store] | None = None

    async def open(self) -> Store:
        if self.store is not None:
            return self.store
        if self._opening is None:
            self._opening = asyncio.ensure_future(open_store(self.url, **self.options))
            self._opening.add_done_callback(self._opened)
        # Shielded: a cancelled first caller must not cancel the open the
        # other callers wait on.
        return await asyncio.shield(self._opening)

    def _opened(self, task: asyncio.Task[Store]) -> None:
        self._opening = None
        # A failed open is retried by the next call (open_store disposed its engine).
        if not task.cancelled() and task.exception() is None:
            self.store = task.result()

    async def dispose(self) -> None:
        if self._opening is not None:
            await asyncio.wait([self._opening])
        store, self.store = self.store, None
        if store is not None:
            await store.engine.dispose()


# Event loop -> the stores opened on it; guarded by _LOCK, as adapters on
# loops in other threads acquire and release at the same time.
_SHARED: dict[asyncio.AbstractEventLoop, list[_Shared]] = {}
_LOCK: Final = threading.Lock()


def _acquire(loop: asyncio.AbstractEventLoop, url: URL, options: dict[str, Any]) -> _Shared:
    with _LOCK:
        # A loop that has ended took its connections with it: nothing to
        # dispose there, and holding its stores would keep it alive.
        for ended in [other for other in _SHARED if other.is_closed()]:
            del _SHARED[ended]
        entries = _SHARED.setdefault(loop, [])
        for shared in entries:
            if shared.url == url and shared.options == options:
                break
        else:
            shared = _Shared(url, options)
            entries.append(shared)
        shared.refs += 1
        return shared


def _release(loop: asyncio.AbstractEventLoop, shared: _Shared) -> bool:
    """Drop one share; True when it was the last (the caller then disposes the store)."""
    with _LOCK:
        shared.refs -= 1
        if shared.refs > 0:
            return False
        entries = _SHARED.get(loop, [])
        if shared in entries:
            entries.remove(shared)
        if not entries:
            _SHARED.pop(loop, None)
        return True


class Backing:
    """A store (borrowed, or shared on a URL) and the base scope an adapter acts in."""

    def __init__(
        self, store_or_url: Store | str | URL, scope: Scope | str | None, **pool_options: Any
    ) -> None:
        self._borrowed: Store | None = None
        if isinstance(store_or_url, Store):
            if pool_options:
                raise InvalidInput("pool options apply only when the adapter opens its own store")
            self._borrowed = store_or_url
        elif not isinstance(store_or_url, str | URL):
            raise InvalidInput(
                f"expected a Store or a database URL, got {type(store_or_url).__name__}"
            )
        else:
            # Parsed now, so a bad URL is refused by the constructor.
            self._url = normalise_url(store_or_url)
            self._options = pool_options
        # The share this adapter holds on each event loop it has used.
        self._held: dict[asyncio.AbstractEventLoop, _Shared] = {}
        if scope is not None and not isinstance(scope, Scope | str):
            raise InvalidInput(f"scope: expected a Scope or a path, got {type(scope).__name__}")
        self._scope = None if scope is None else Scope.parse(str(scope))

    @property
    def store(self) -> Store:
        """The borrowed store, or the one this adapter opened on the running loop.

        Raises:
            InvalidInput: a URL-built adapter that has not opened its store
                on the running loop yet.
        """
        if self._borrowed is not None:
            return self._borrowed
        try:
            shared = self._held.get(asyncio.get_running_loop())
        except RuntimeError:
            shared = None
        if shared is None or shared.store is None:
            raise InvalidInput(
                "store: an adapter built on a URL opens its store at its first call on an "
                "event loop; await its open() first"
            )
        return shared.store

    async def ready(self) -> Store:
        """The store, opened (with :func:`~cortex.store.open_store`) on this loop if need be.

        Raises:
            SchemaMismatch: the database is not at this cortex's revision
                (``cortex db upgrade`` fixes it).
            DatabaseUnavailable: the database cannot be reached.
        """
        if self._borrowed is not None:
            return self._borrowed
        loop = asyncio.get_running_loop()
        shared = self._held.get(loop)
        if shared is None:
            for ended in [other for other in self._held if other.is_closed()]:
                del self._held[ended]
            shared = self._held[loop] = _acquire(loop, self._url, self._options)
        return await shared.open()

    def base(self) -> Scope:
        """The construction scope, else the caller's current scope.

        Raises:
            ScopeMissing: neither was given.
        """
        return self._scope if self._scope is not None else current_scope()

    async def close(self) -> None:
        """Release this adapter's share of the running loop's store; the last share disposes it.

        A borrowed store stays open.
        """
        if self._borrowed is not None:
            return
        loop = asyncio.get_running_loop()
        for ended in [other for other in self._held if other.is_closed()]:
            del self._held[ended]
        shared = self._held.pop(loop, None)
        if shared is not None and _release(loop, shared):
            await shared.dispose()
