"""Counts the reliability tests report: what they drove, injected and tried, and what was lost.

Tests call :func:`record`; at the end of the run ``tests/conftest.py`` prints
the table and writes ``reliability-figures.json`` (``make reliability`` runs
the reliability tests with larger budgets and shows it).
"""

from __future__ import annotations

from collections import Counter

FIGURES: Counter[str] = Counter()


def record(key: str, n: int = 1) -> None:
    """Add ``n`` to the figure ``key``."""
    FIGURES[key] += n
