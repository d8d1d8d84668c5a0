"""Progress reporting for long work (backfill, seeding): a bar on a terminal, log lines elsewhere.

A deploy pipeline's log is not a terminal: there a redrawn bar would be noise,
so each step becomes one log line instead. Frozen once released (see
:mod:`cortex._revision_helpers`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Protocol

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["LOG_EVERY", "Advance", "progress"]

log = logging.getLogger("cortex")


class Advance(Protocol):
    """Report ``done`` more units of work."""

    def __call__(self, done: int) -> None: ...


# Seconds between two log lines when stderr is not a terminal: a 5-minute
# backfill writes about 30 lines, not one per batch.
LOG_EVERY: Final = 10.0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@contextmanager
def progress(description: str, total: int, *, unit: str = "items") -> Iterator[Advance]:
    """Yield a callable that advances a progress display by ``done`` units.

    On a terminal: a bar with the rate and the time remaining. Elsewhere: a
    log line at most every :data:`LOG_EVERY` seconds (and at the end) with the
    count, the rate (units/s) and the estimated time remaining. Nothing at
    all when there is nothing to do (``total`` 0).
    """
    if total <= 0:
        yield lambda done: None
        return
    if sys.stderr.isatty():
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        ) as bar:
            task = bar.add_task(description, total=total, rate="")
            started = time.monotonic()

            def advance_bar(done: int) -> None:
                bar.advance(task, done)
                elapsed = time.monotonic() - started
                completed = bar.tasks[0].completed
                rate = completed / elapsed if elapsed > 0 else 0.0
                bar.update(task, rate=f"{rate:,.0f} {unit}/s")

            yield advance_bar
        return

    started = time.monotonic()
    state = {"done": 0, "logged": started}

    def line() -> None:
        elapsed = time.monotonic() - started
        done = state["done"]
        rate = done / elapsed if elapsed > 0 else 0.0
        pct = 100.0 * done / total if total else 100.0
        eta = _duration((total - done) / rate) if rate > 0 and done < total else "-"
        log.info(
            "%s: %s/%s %s (%.0f%%), %s %s/s, ETA %s",
            description,
            f"{done:,}",
            f"{total:,}",
            unit,
            pct,
            f"{rate:,.0f}",
            unit,
            eta,
        )

    def advance(done: int) -> None:
        state["done"] += done
        now = time.monotonic()
        if now - state["logged"] >= LOG_EVERY:
            state["logged"] = now
            line()

    log.info("%s: %s %s to do", description, f"{total:,}", unit)
    yield advance
    line()
