"""Scopes: the tenant path every store call acts for, carried on a ContextVar.

This module owns the :class:`Scope` value, its grammar, and the context
variable. It must not know about the database: the store reads the scope with
:func:`current_scope` and builds SQL from it elsewhere.

The ContextVar holds only the frozen ``Scope``, never a connection or other
mutable object: tasks and threads started inside a scope get a *copy* of the
context, so anything mutable in it would be shared between them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from cortex.errors import InvalidScope, ScopeMissing, ScopeViolation

__all__ = ["MAX_DEPTH", "MAX_SEGMENT_LENGTH", "Scope", "current_scope", "use_scope"]

MAX_DEPTH: Final = 8
MAX_SEGMENT_LENGTH: Final = 64
SEPARATOR: Final = "/"

# "/" never appears inside a segment: the subtree predicate in cortex._sql.predicates
# relies on it to match whole segments only (``acme`` never sees ``acme-corp``).
_SEGMENT: Final = re.compile(r"[A-Za-z0-9._:\-]{1,64}")

_current: ContextVar[Scope | None] = ContextVar("cortex_scope", default=None)


class Scope:
    """An immutable, hashable tenant path such as ``acme/support/user-42``.

    The first segment is the tenant. A segment is 1-64 characters of
    ``A-Z a-z 0-9 . _ : -``; a scope has 1-8 segments.

    Raises:
        InvalidScope: naming the offending segment, for anything else.
    """

    __slots__ = ("_path", "_segments")

    _segments: tuple[str, ...]
    _path: str

    def __init__(self, *segments: str) -> None:
        if not 1 <= len(segments) <= MAX_DEPTH:
            raise InvalidScope(f"a scope has 1 to {MAX_DEPTH} segments, got {len(segments)}")
        for segment in segments:
            if not isinstance(segment, str) or _SEGMENT.fullmatch(segment) is None:
                raise InvalidScope(
                    f"invalid scope segment {segment!r}: use 1 to {MAX_SEGMENT_LENGTH} "
                    "characters of A-Z a-z 0-9 . _ : -"
                )
        object.__setattr__(self, "_segments", tuple(segments))
        object.__setattr__(self, "_path", SEPARATOR.join(segments))

    @classmethod
    def parse(cls, path: str) -> Scope:
        """Build a scope from its path form, ``"acme/support"``.

        Raises:
            InvalidScope: if the path is not a string of valid segments.
        """
        if not isinstance(path, str):
            raise InvalidScope(f"a scope path must be a string, got {type(path).__name__}")
        if cls is Scope:
            # Scopes are immutable, and a listing reads the same few paths over
            # and over: parse each path once.
            return _parse_cached(path)
        return cls(*path.split(SEPARATOR))

    @property
    def segments(self) -> tuple[str, ...]:
        """The path's segments, tenant first."""
        return self._segments

    @property
    def depth(self) -> int:
        """The number of segments (1 for a tenant)."""
        return len(self._segments)

    @property
    def tenant(self) -> str:
        """The first segment."""
        return self._segments[0]

    def contains(self, other: Scope) -> bool:
        """Whether ``other`` is this scope or beneath it, by whole segments."""
        return other._segments[: len(self._segments)] == self._segments

    def child(self, segment: str) -> Scope:
        """The scope one level beneath this one.

        Raises:
            InvalidScope: if the segment is malformed or the depth would exceed 8.
        """
        return Scope(*self._segments, segment)

    def prefix(self, depth: int) -> str:
        """The path of this scope's ancestor at ``depth`` (1-based)."""
        return SEPARATOR.join(self._segments[:depth])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Scope is immutable")

    def __str__(self) -> str:
        return self._path

    def __repr__(self) -> str:
        return f"Scope.parse({self._path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scope) and other._path == self._path

    def __hash__(self) -> int:
        return hash(("cortex.Scope", self._path))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Scope, self._segments)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """Validate from a Scope or a path string; serialise as the path."""
        from_str = core_schema.no_info_plain_validator_function(_coerce_scope)
        return core_schema.json_or_python_schema(
            json_schema=core_schema.chain_schema([core_schema.str_schema(), from_str]),
            python_schema=from_str,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """A scope path as JSON Schema: a string of 1-8 segments (for OpenAPI documents)."""
        segment = r"[A-Za-z0-9._:\-]{1,64}"
        return {
            "type": "string",
            "pattern": f"^{segment}(/{segment}){{0,{MAX_DEPTH - 1}}}$",
            "examples": ["acme/support/user-42"],
        }


@lru_cache(maxsize=4096)
def _parse_cached(path: str) -> Scope:
    return Scope(*path.split(SEPARATOR))


def _coerce_scope(value: object) -> Scope:
    if isinstance(value, Scope):
        return value
    if isinstance(value, str):
        return Scope.parse(value)
    raise InvalidScope(f"expected a scope or a scope path, got {type(value).__name__}")


def current_scope() -> Scope:
    """The scope bound on the current context.

    Raises:
        ScopeMissing: when no ``use_scope`` encloses the caller. There is no
            default or shared scope to fall back to.
    """
    scope = _current.get()
    if scope is None:
        raise ScopeMissing("no scope is bound: wrap the call in `with cortex.use_scope(...)`")
    return scope


@contextmanager
def use_scope(scope: Scope | str) -> Iterator[Scope]:
    """Bind ``scope`` for the enclosed code, restoring the previous one on exit.

    Usable as a plain ``with`` inside async code. Tasks started inside (anyio
    task groups, asyncio tasks) and ``anyio.to_thread.run_sync`` calls inherit
    it; tasks started outside never see it.

    Raises:
        InvalidScope: if ``scope`` is a malformed path.
        ScopeViolation: if a scope is already bound and ``scope`` is not equal
            to it or beneath it: nesting may only narrow.
    """
    new = _coerce_scope(scope)
    outer = _current.get()
    if outer is not None and not outer.contains(new):
        raise ScopeViolation(f"scope {new} is not within the enclosing scope {outer}")
    token = _current.set(new)
    try:
        yield new
    finally:
        _current.reset(token)
