"""What every ``cortex`` command shares: exit codes, usage errors, the URL, output.

Output rule: whatever a host or a model wrote (titles, metadata, messages,
reasons, schemas) is printed literally. Rich interprets ``[...]`` as markup
unless told not to, so text goes through :func:`literal` or :func:`say`,
never into a format string handed to rich.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, TypeVar

import anyio
from rich.console import Console
from rich.text import Text

from cortex.errors import (
    Conflict,
    CortexError,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    SchemaMismatch,
)
from cortex.scope import Scope, use_scope
from cortex.store import Store, connect

_T = TypeVar("_T")

ENV_URL: Final = "CORTEX_DATABASE_URL"

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_UNAVAILABLE: Final = 4
EXIT_SCHEMA: Final = 5
EXIT_CONFLICT: Final = 6

EXIT_CODES: Final[tuple[tuple[type[CortexError], int], ...]] = (
    (InvalidInput, EXIT_USAGE),
    (NotFound, EXIT_NOT_FOUND),
    (DatabaseUnavailable, EXIT_UNAVAILABLE),
    (SchemaMismatch, EXIT_SCHEMA),
    (Conflict, EXIT_CONFLICT),
)


class UsageError(Exception):
    """A command-line mistake; printed as one line, exit code 2."""


def database_url(args: argparse.Namespace) -> str:
    """``--database-url``, else ``$CORTEX_DATABASE_URL``."""
    url: str | None = args.database_url or os.environ.get(ENV_URL)
    if not url:
        raise UsageError(f"no database: pass --database-url or set {ENV_URL}")
    return url


def console() -> Console:
    """Rich console; piped output gets a wide one so table rows stay on one line for grep."""
    return Console(highlight=False) if sys.stdout.isatty() else Console(width=200, highlight=False)


def literal(value: str) -> Text:
    """Host- or model-written text as a rich renderable that is never parsed as markup."""
    return Text(value)


def say(out: Console, *parts: str) -> None:
    """Print plain text: no markup, no highlighting, whatever the text holds."""
    out.print(*parts, markup=False, highlight=False, soft_wrap=True)


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON (timestamps as ISO 8601 with their zone)."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def when(moment: datetime) -> str:
    """A timestamp with its zone, to the second: ``2026-11-30 09:43:16+00:00``."""
    return moment.isoformat(sep=" ", timespec="seconds")


def with_store(args: argparse.Namespace, action: Callable[[Store], Awaitable[_T]]) -> _T:
    """Run ``action`` on a store bound to ``--scope``."""
    url = database_url(args)
    scope = Scope.parse(args.scope)

    async def run() -> _T:
        async with connect(url, pool_size=1, max_overflow=0) as store:
            with use_scope(scope):
                return await action(store)

    return anyio.run(run)
