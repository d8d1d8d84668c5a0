"""The hot statements: the shapes ``cortex db upgrade`` installs as one-round-trip routines.

What one-statement calls run (cortex._db.routines turns each into a routine);
only public names of the other cortex._sql modules are used here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Final

import sqlalchemy as sa

from cortex._sql import messages, sessions
from cortex._sql.messages import Composite
from cortex._sql.predicates import FilterShape

__all__ = ["DEPTHS", "hot_composites", "hot_statements", "listing_shapes"]

DEPTHS: Final = (1, 2, 3, 4)


def listing_shapes(distributed: bool) -> Iterator[FilterShape]:
    """The listings a request path runs: no search (planned per term), no state filter (operators' views)."""
    for depth, exact, agent, default_only in itertools.product(
        DEPTHS, (False, True), (False, True), (False, True)
    ):
        yield FilterShape(depth, exact, agent, default_only, False, None, distributed)


def hot_statements(distributed: bool = False) -> list[sa.ClauseElement]:
    """The statement shapes installed as routines: what one-statement calls run.

    Shapes that compile alike (an exact-scope listing is one shape at every
    depth) appear more than once; cortex._db.routines keeps each SQL text once.
    ``distributed`` (Citus): the shapes the store sends there, and no
    append (two router statements in a transaction there, cortex._calls.messages).
    """
    out: list[sa.ClauseElement] = [
        sessions.insert_statement(False, distributed),
        sessions.resolve_default_insert_statement(True)
        if distributed
        else sessions.resolve_default_statement(),
        sessions.default_statement(),
        sessions.resolve_key_statement(distributed),
        sessions.by_key_statement(),
        # A listing page's scope documents, read after the page (cortex._calls.sessions.select_page).
        sessions.scope_documents_statement(),
    ]
    for depth in DEPTHS:
        out.append(sessions.select_statement(depth, False))
        out.append(messages.history_statement(depth))
        if not distributed:
            for with_data, expected, single in itertools.product((False, True), repeat=3):
                out.append(messages.append_statement(depth, with_data, expected, single))
        for newest_first, since in ((False, False), (False, True), (True, False)):
            out.append(messages.page_statement(depth, newest_first=newest_first, since=since))
    for shape in listing_shapes(distributed):
        out.append(sessions.count_statement(shape))
        for cursor in (False, True):
            out.append(sessions.page_statement(shape, cursor=cursor, offset=False))
    return out


def hot_composites(distributed: bool = False) -> list[Composite]:
    """Two-statement routines: on Citus, the one-message append (cortex._sql.messages.routed_append)."""
    if not distributed:
        return []
    return [
        messages.routed_append(depth, with_data, expected)
        for depth in DEPTHS
        for with_data, expected in itertools.product((False, True), repeat=2)
    ]
