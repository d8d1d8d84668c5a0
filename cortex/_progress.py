"""Progress reporting for long work (backfill, seeding): a bar on a terminal, log lines elsewhere.

A deploy pipeline's log is not a terminal: there a redrawn bar would be noise,
so each step becomes one log line instead.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Advance", "progress"]

log = logging.getLogger("cortex")


class Advance(Protocol):
    """Report ``done`` more units of work."""

    def __call__(self, done: int) -> None: ...


@contextmanager
def progress(description: str, total: int, *, unit: str = "items") -> Iterator[Advance]:
    """Yield a callable that advances a progress display by ``done`` units."""
    if sys.stderr.isatty():
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        ) as bar:
            task = bar.add_task(description, total=total)
            yield lambda done: bar.advance(task, done)
        return

    state = {"done": 0}

    def advance(done: int) -> None:
        state["done"] += done
        pct = 100.0 * state["done"] / total if total else 100.0
        log.info("%s: %d/%d %s (%.0f%%)", description, state["done"], total, unit, pct)

    log.info("%s: %d %s to do", description, total, unit)
    yield advance
