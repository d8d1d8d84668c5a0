"""The one table from a violated constraint's name to the cortex error it means.

A statement that can violate a constraint runs inside :func:`refusals`,
which names what the call was writing and which of those constraints the
statement can hit. The error is chosen by the constraint name PostgreSQL
reports (:func:`cortex.errors.constraint_of`), never by the message text.
Names come from cortex._sql.tables; ``tests/unit/test_constraints.py`` fails
when one there is neither in :data:`REFUSALS` nor known to be out of a
call's reach.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

import asyncpg

from cortex._db.transaction import RetryTransaction
from cortex._sql.tables import (
    DATA_SIZE_REPORTED,
    PK_MESSAGES,
    PK_SESSIONS,
    SCOPE_DATA_SIZE,
    UQ_SESSIONS_DEFAULT,
    UQ_SESSIONS_KEY,
)
from cortex.errors import Conflict, CortexError, InvalidInput, constraint_of, sqlstate_of
from cortex.ids import SESSION_PREFIX, format_id
from cortex.models import MAX_DATA_BYTES
from cortex.scope import Scope

__all__ = [
    "CHECK_VIOLATION",
    "REFUSALS",
    "UNIQUE_VIOLATION",
    "Refusal",
    "Writing",
    "refusal",
    "refusals",
]

UNIQUE_VIOLATION: Final = "23505"
CHECK_VIOLATION: Final = "23514"


@dataclass(frozen=True)
class Writing:
    """What the refused statement was writing, for the error to name."""

    scope: Scope
    session_id: uuid.UUID
    agent_id: str = ""
    key: str | None = None


@dataclass(frozen=True)
class Refusal:
    """How a violation of one constraint reaches the caller."""

    # The SQLSTATE its violation carries.
    sqlstate: str
    build: Callable[[Writing, str], CortexError]


def _taken(writing: Writing, _: str) -> CortexError:
    # Names the id only: the session holding it may be in a scope the caller cannot see.
    return Conflict(f"session id {format_id(SESSION_PREFIX, writing.session_id)} is already taken")


def _second_default(writing: Writing, _: str) -> CortexError:
    return Conflict(f"agent {writing.agent_id!r} already has a default session in {writing.scope}")


def _key_taken(writing: Writing, _: str) -> CortexError:
    return Conflict(
        f"agent {writing.agent_id!r} already has a session keyed {writing.key!r} in {writing.scope}"
    )


def _message_id_taken(writing: Writing, _: str) -> CortexError:
    return Conflict("messages: a message id is already stored")


def _too_large(_: Writing, name: str) -> CortexError:
    return InvalidInput(
        f"data: a state document may hold at most {MAX_DATA_BYTES} bytes as stored ({name})"
    )


REFUSALS: Final[dict[str, Refusal]] = {
    PK_SESSIONS: Refusal(UNIQUE_VIOLATION, _taken),
    UQ_SESSIONS_DEFAULT: Refusal(UNIQUE_VIOLATION, _second_default),
    UQ_SESSIONS_KEY: Refusal(UNIQUE_VIOLATION, _key_taken),
    PK_MESSAGES: Refusal(UNIQUE_VIOLATION, _message_id_taken),
    DATA_SIZE_REPORTED: Refusal(CHECK_VIOLATION, _too_large),
    SCOPE_DATA_SIZE: Refusal(CHECK_VIOLATION, _too_large),
}


def refusal(name: str, writing: Writing) -> CortexError:
    """The error a violation of ``name`` (a key of :data:`REFUSALS`) means for ``writing``."""
    return REFUSALS[name].build(writing, name)


@contextmanager
def refusals(
    writing: Writing, could: Sequence[str], *, retry: Collection[str] = ()
) -> Iterator[None]:
    """Raise a violation of one of ``could`` as its error from :data:`REFUSALS`.

    ``could``: the constraints the statement can violate, given what it
    writes. A Citus coordinator may relay a worker's violation without the
    constraint's name; the first of ``could`` with its SQLSTATE is then the
    one, so they are ordered by which one the statement meets first.

    ``retry``: those of ``could`` that a concurrent transaction's commit
    makes the statement violate; then the whole transaction runs again
    (:class:`cortex._db.transaction.RetryTransaction`).

    A violation of a constraint not in ``could`` is raised unchanged (the
    transaction runner reports it as a DatabaseError).
    """
    try:
        yield
    except asyncpg.IntegrityConstraintViolationError as exc:
        state = sqlstate_of(exc)
        reported = constraint_of(exc)
        if reported is None:
            named = [c for c in could if REFUSALS[c].sqlstate == state]
        else:
            named = [c for c in could if c == reported]
        if not named:
            raise
        if named[0] in retry:
            raise RetryTransaction from exc
        raise refusal(named[0], writing) from exc
