"""What every ``cortex`` command shares: exit codes, usage errors, the URL, output.

Output rule: whatever a host, a model or the database holds (titles,
metadata, messages, reasons, schemas, revisions, object names, error
messages quoting them) is printed literally and visibly. Rich interprets
``[...]`` as markup unless told not to, and a terminal acts on control
characters, so every human-facing line goes through :func:`visible`: by
:func:`literal` (a rich cell or title), :func:`say` (a rich line),
:func:`echo` (a plain line), :func:`json_text` (JSON for a human) or
:class:`VisibleFormatter` (a log line). ``--json`` output is the JSON
encoder's, which escapes every control and non-ASCII character itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import unicodedata
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
    SessionAborted,
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
    # An aborted session refuses an answer as any other stored state would.
    (SessionAborted, EXIT_CONFLICT),
)


class UsageError(Exception):
    """A command-line mistake; printed as one line, exit code 2."""


def database_url(args: argparse.Namespace) -> str:
    """``--database-url``, else ``$CORTEX_DATABASE_URL``."""
    url: str | None = args.database_url or os.environ.get(ENV_URL)
    if not url:
        raise UsageError(f"no database: pass --database-url or set {ENV_URL}")
    return url


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # The command line ends a closed pipe, rich's own handler would exit 1.
        self.quiet = True
        raise BrokenPipeError


def console() -> Console:
    """Rich console; piped output gets a wide one so table rows stay on one line for grep."""
    if sys.stdout.isatty():
        return _Console(highlight=False, emoji=False)
    return _Console(width=200, highlight=False, emoji=False)


# Anything but printable ASCII may need escaping: a run of it is looked at.
_CANDIDATES: Final = re.compile(r"[^\x20-\x7e]+")
# Controls, format characters (bidi overrides and isolates, zero-width
# characters, the byte order mark, tags), line and paragraph separators, and
# lone surrogates: a terminal acts on them or draws nothing for them.
_HIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str, in_json: bool) -> str:
    if unicodedata.category(char) not in _HIDDEN_CATEGORIES:
        return char
    code = ord(char)
    if in_json:
        if code > 0xFFFF:  # JSON spells an astral character as a surrogate pair
            code -= 0x10000
            return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
        return f"\\u{code:04x}"
    if char in _SHORT:
        return _SHORT[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escape_run(run: str, in_json: bool) -> str:
    # str.isprintable() is false for every hidden category: most runs end here.
    if run.isprintable():
        return run
    return "".join(_escape_char(char, in_json) for char in run)


def visible(text: str, *, in_json: bool = False) -> str:
    r"""``text`` with every character a terminal would act on or hide shown as an escape.

    C0 and C1 controls, DEL, newlines and tabs, Unicode format characters
    (bidi overrides and isolates, zero-width characters, tags), line and
    paragraph separators and lone surrogates become ``\x1b``, ``\n``,
    ``\u202e``, ``\U000e0041``, so host text cannot move the cursor, start
    a line, or reorder or hide what is drawn. Every other character is kept,
    backslashes too: text that only looks like an escape is still visible
    text, and paths and regular expressions read as written. ``in_json``
    spells them as JSON escapes (``\u001b``), for text that is JSON: it
    stays JSON and decodes to what is stored.
    """
    return _CANDIDATES.sub(lambda m: _escape_run(m.group(), in_json), text)


def json_text(value: Any, indent: int | None = None) -> str:
    r"""``value`` as JSON for a human: non-ASCII text as is, hidden characters as JSON escapes.

    With ``indent``, its lines are split by ``\n`` alone: the encoder escapes
    every newline inside a string, so those are the JSON's own.
    """
    lines = json.dumps(value, indent=indent, ensure_ascii=False, default=str).split("\n")
    return "\n".join(visible(line, in_json=True) for line in lines)


def literal(value: str) -> Text:
    """Host-, model- or database-written text as a rich renderable: escaped, never markup.

    Escaped before rich sees it, so a table measures the width it will draw.
    """
    return Text(visible(value))


def say(out: Console, *parts: str) -> None:
    """Print one line: no markup, no emoji codes, no highlighting, control characters escaped."""
    out.print(*(literal(part) for part in parts), soft_wrap=True)


def echo(text: str, *, err: bool = False) -> None:
    """Print one line without rich (to stderr if ``err``), control characters escaped."""
    print(visible(text), file=sys.stderr if err else sys.stdout)


class VisibleFormatter(logging.Formatter):
    """Log lines for a terminal: what a record quotes (a revision, an error) is escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON: non-ASCII as is, hidden characters escaped (json_text)."""
    sys.stdout.write(json_text(value, indent=2) + "\n")


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
