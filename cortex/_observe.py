"""The observer hook: where every public :class:`cortex.Store` call can be watched.

:func:`observed` wraps each public method once, outside the validation
boundary, so refused arguments are seen too. A store without an observer
(the default) pays one attribute read and a None check per call; the
observer itself (:mod:`cortex.telemetry`) is only imported by a host that
asks for it. This module must not import OpenTelemetry, prometheus_client
or the database layer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

__all__ = ["Observed", "Observer", "observed"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# The agent id an operation names is recorded as given, cut to the longest valid one.
_AGENT_ID_CHARS = 128


class Observer(Protocol):
    """Watches a store's calls (implemented by :mod:`cortex.telemetry`)."""

    def call(self, operation: str, agent_id: str | None, call: Awaitable[T]) -> Awaitable[T]:
        """An awaitable that runs ``call`` (the method's coroutine) and observes it."""

    def walk(
        self, operation: str, start: Callable[[], AsyncGenerator[T, None]]
    ) -> AsyncGenerator[T, None]:
        """``start()`` (the method's iterator), observed from its creation to its end."""


class Observed(Protocol):
    """An object whose public calls :func:`observed` may report (a Store)."""

    _observer: Observer | None


def _agent_position(func: Callable[..., Any]) -> int | None:
    """Where ``agent_id`` sits among the positional arguments after ``self``, if it is one."""
    names = list(inspect.signature(func).parameters)[1:]
    return names.index("agent_id") if "agent_id" in names else None


def observed(func: F) -> F:
    """Report each call of the method ``func`` to its instance's observer, when one is set."""
    operation = func.__name__
    at = _agent_position(func)

    def agent(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        if at is None:
            return None
        value = args[at] if len(args) > at else kwargs.get("agent_id")
        return value[:_AGENT_ID_CHARS] if isinstance(value, str) else None

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def call(self: Observed, *args: Any, **kwargs: Any) -> Any:
            observer = self._observer
            if observer is None:
                return await func(self, *args, **kwargs)
            return await observer.call(operation, agent(args, kwargs), func(self, *args, **kwargs))

        return cast(F, call)

    @functools.wraps(func)
    def start(self: Observed, *args: Any, **kwargs: Any) -> Any:
        observer = self._observer
        if observer is None:
            return func(self, *args, **kwargs)
        return observer.walk(operation, lambda: func(self, *args, **kwargs))

    return cast(F, start)
