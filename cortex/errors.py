"""The cortex error tree, and the one place that translates database errors.

Every exception a caller can see from cortex is a :class:`CortexError`::

    CortexError
    ├── NotFound            (also LookupError)  missing, or not visible from this scope
    ├── InvalidInput        (also ValueError)   refused before anything was written
    │   └── InvalidScope                        a scope path or segment is malformed
    ├── ScopeMissing                            no scope is bound on the context
    ├── ScopeViolation                          a nested scope, or a path named, outside the bound one
    ├── Conflict                                the request contradicts stored state
    │   └── AlreadyAborted
    ├── SessionAborted                          the session carries an abort marker
    ├── SchemaMismatch                          the database is not at this code's revision
    └── DatabaseError                           the database failed; the cause is chained
        ├── DatabaseUnavailable                 cannot connect, connection lost, pool exhausted
        └── OperationTimeout                    statement or lock timeout, server-side cancel

Driver exceptions never reach callers: :func:`translate_errors` maps them by
SQLSTATE (``exc.orig.sqlstate``), never by message text, and chains the
original with ``from``. This module must not import the rest of cortex.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import asyncpg
import sqlalchemy.exc

__all__ = [
    "AlreadyAborted",
    "Conflict",
    "CortexError",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "InvalidScope",
    "NotFound",
    "OperationTimeout",
    "SchemaMismatch",
    "ScopeMissing",
    "ScopeViolation",
    "SessionAborted",
]


class CortexError(Exception):
    """Base class of every error cortex raises."""


class NotFound(CortexError, LookupError):
    """The object does not exist, or is not visible from the current scope.

    The two cases are deliberately indistinguishable: an error must never hint
    that an object exists under another tenant or scope.
    """


class InvalidInput(CortexError, ValueError):
    """The input breaks a documented limit; nothing was written."""


class InvalidScope(InvalidInput):
    """A scope path or one of its segments is malformed."""


class ScopeMissing(CortexError):
    """A store call was made with no scope bound on the context."""


class ScopeViolation(CortexError):
    """A scope outside the bound one: a nested ``use_scope``, or a path a call acts on.

    The calls on a whole scope (``erase_scope``, ``list_erasures``,
    ``export_scope``, ``import_scope``, ``set_retention_policy``,
    ``get_retention_policy``) take a path that must be the current scope or
    beneath it.
    """


class Conflict(CortexError):
    """The request contradicts stored state (a taken id, a second default, ...)."""


class AlreadyAborted(Conflict):
    """The session already carries an abort marker."""


class SessionAborted(CortexError):
    """The operation is refused because the session was aborted."""


class SchemaMismatch(CortexError):
    """The database schema is not at the revision this code expects."""


class DatabaseError(CortexError):
    """The database failed the operation; ``__cause__`` holds the driver error."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached, the connection was lost, or the pool is exhausted."""


class OperationTimeout(DatabaseError):
    """A statement or lock timeout fired, or the server cancelled the statement."""


# SQLSTATEs that mean "run the whole transaction again": nothing was written,
# and a retry sees a newer snapshot (PostgreSQL docs, "Serialization Failure
# Handling"). Retried by cortex._db.transaction.run_transaction, never surfaced raw.
RETRYABLE_SQLSTATES: Final = frozenset({"40001", "40P01"})

_UNAVAILABLE_SQLSTATES: Final = frozenset({"57P01", "57P02", "57P03", "53300"})
_TIMEOUT_SQLSTATES: Final = frozenset({"57014", "55P03"})


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, raw or wrapped by SQLAlchemy, or None."""
    state = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "orig", None), "sqlstate", None)
    return state if isinstance(state, str) else None


# A Citus worker reports the shard's copy of a constraint or index: the name
# with ``_<shard id>`` appended (uq_sessions_default_102020). No cortex
# constraint or index name ends in ``_<digits>`` (tests/unit/test_errors.py
# keeps it so), so the suffix is removed unconditionally.
_SHARD_SUFFIX: Final = re.compile(r"_[0-9]+\Z")


def constraint_of(exc: BaseException) -> str | None:
    """The name of the constraint or index a driver error reports (raw or wrapped), or None.

    The schema's name, also when a Citus worker reports its shard's copy.
    """
    name = getattr(exc, "constraint_name", None)
    if name is None:
        driver = getattr(getattr(exc, "orig", None), "__cause__", None)
        name = getattr(driver, "constraint_name", None)
    return _SHARD_SUFFIX.sub("", name) if isinstance(name, str) else None


def _by_sqlstate(state: str | None) -> CortexError:
    if state is None:
        return DatabaseError("the database refused the operation")
    if state.startswith("08"):
        return DatabaseUnavailable("the database connection was lost")
    if state == "3D000":
        return DatabaseUnavailable("the database does not exist")
    if state.startswith("28"):
        return DatabaseUnavailable(f"the database refused the login (SQLSTATE {state})")
    if state in _UNAVAILABLE_SQLSTATES:
        return DatabaseUnavailable(f"the database is unavailable (SQLSTATE {state})")
    if state in _TIMEOUT_SQLSTATES:
        return OperationTimeout(f"the database cancelled the operation (SQLSTATE {state})")
    return DatabaseError(f"the database refused the operation (SQLSTATE {state})")


def translate(exc: BaseException) -> CortexError | None:
    """Map one database-layer exception to its cortex class, or None if it is not one."""
    if isinstance(exc, CortexError):
        return exc
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return DatabaseUnavailable("timed out waiting for a pooled database connection")
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        if exc.connection_invalidated:
            return DatabaseUnavailable("the database connection was lost")
        if sqlstate_of(exc) is None:
            # No SQLSTATE: the driver itself failed (a closed or broken connection).
            return DatabaseUnavailable(f"the database connection failed: {type(exc.orig).__name__}")
        return _by_sqlstate(sqlstate_of(exc))
    if isinstance(exc, asyncpg.PostgresError):
        # Raw driver errors reach here from the statements cortex sends
        # directly (BEGIN with the tenant binding, COMMIT, ROLLBACK).
        return _by_sqlstate(sqlstate_of(exc))
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        # Client-side: a closed connection, or a protocol left mid-operation by a
        # connection the server dropped.
        return DatabaseUnavailable(f"the database connection failed: {type(exc).__name__}")
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return DatabaseError(f"database layer error: {type(exc).__name__}")
    if isinstance(exc, OSError):
        # asyncpg raises OSError subclasses (refused, reset, unreachable) on connect.
        return DatabaseUnavailable(f"cannot reach the database: {exc.strerror or exc}")
    cause = exc.__cause__
    if type(exc).__module__.startswith("sqlalchemy.") and cause is not None:
        # SQLAlchemy's DB-API adapter wraps the driver's error (a connect made
        # through the pool itself, cortex._db.pool): the driver's error decides.
        return translate(cause)
    return None


@contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise database-layer exceptions as :class:`CortexError`, cause chained."""
    try:
        yield
    except CortexError:
        raise
    except Exception as exc:
        mapped = translate(exc)
        if mapped is None:
            raise
        raise mapped from exc
