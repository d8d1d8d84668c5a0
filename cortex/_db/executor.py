"""The statement executor: cortex's compiled Core statements, run straight on asyncpg.

SQLAlchemy builds and compiles each statement shape once; :class:`Tx` binds
named parameters and executes the SQL on the driver connection. This module
owns nothing else: no transactions, no engine, no error translation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.sql import sqltypes

from cortex._sql.params import SCOPE_PARAMS
from cortex.errors import DatabaseError

if TYPE_CHECKING:
    from cortex._sql.messages import Composite

__all__ = [
    "SHARED_PARAMS",
    "NeedsTransaction",
    "Result",
    "Routines",
    "Row",
    "StatementError",
    "Tx",
    "compile_composite",
    "compile_statement",
    "routine_key",
]


class Row(asyncpg.Record):
    """asyncpg's record with attribute access (``row.id``), as cortex reads columns."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Result:
    """The rows of one statement, read the way cortex reads them."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def all(self) -> list[Row]:
        return self._rows

    def first(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Row:
        """The only row.

        Raises:
            DatabaseError: the statement returned none or several: the
                transaction rolls back, and the connection (healthy) stays pooled.
        """
        if len(self._rows) != 1:
            raise DatabaseError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.first()
        return None if row is None else row[0]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    # Bind names in $n order (asyncpg's placeholders are positional).
    order: tuple[str, ...]
    # Values embedded in the shape (e.g. kind = 'interrupted'); never a placeholder's None.
    fixed: dict[str, Any]
    # Names the caller must supply.
    required: frozenset[str]
    # Which installed routine runs this SQL (cortex._db.routines): a digest of the text.
    key: str


def routine_key(sql: str) -> str:
    """The digest a routine's comment carries for the SQL it runs (cortex._db.routines)."""
    return hashlib.sha256(sql.encode()).hexdigest()[:32]


# Statement key to the SQL that calls its routine; shared by a store's calls,
# and a routine found missing is removed from it.
Routines = dict[str, str]


class NeedsTransaction(Exception):
    """Raised by a call in autocommit whose two statements have no routine: run it in a transaction."""


class _TextBind(sqltypes.Text):
    """A text bind sent as ``$n::TEXT``, where the asyncpg dialect sends every string as varchar.

    cortex's columns are text: with varchar binds an operator or function
    planted with a (text, varchar) signature would be an exact match and
    win over the built-in one.
    """

    render_bind_cast = True


class _Dialect(pg_asyncpg.PGDialect_asyncpg):
    colspecs = {  # noqa: RUF012  # SQLAlchemy's class attribute, read-only here
        **pg_asyncpg.PGDialect_asyncpg.colspecs,
        sqltypes.Text: _TextBind,
    }


_DIALECT: Final = _Dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated

# Scope bind values (cortex._sql.predicates.scope_params) travel together: a shape
# that needs only the tenant still receives the path and range bounds. Any
# other key the statement does not bind is a caller's mistake.
SHARED_PARAMS: Final = SCOPE_PARAMS

# Statement shapes are finite (cortex._sql.predicates builds them from enums and
# flags); the bound is a guard against a caller building one per call.
_CACHE_SIZE: Final = 1024


class StatementError(DatabaseError):
    """cortex built or bound a statement wrongly (a bug in cortex, never the caller's input)."""


@lru_cache(maxsize=_CACHE_SIZE)
def _compile(stmt: sa.ClauseElement) -> _Compiled:
    """Compile a statement shape once, refusing what this executor cannot run as SQLAlchemy would.

    Raises:
        StatementError: an expanding (``IN``/POSTCOMPILE) parameter, which
            SQLAlchemy renders per call and this executor would send verbatim.
    """
    compiled = stmt.compile(dialect=_DIALECT)
    binds = compiled.binds  # type: ignore[attr-defined]  # SQLCompiler's, untyped on Compiled
    expanding = sorted(name for name, bind in binds.items() if bind.expanding)
    if expanding:
        raise StatementError(f"expanding parameters are not supported: {', '.join(expanding)}")
    order = tuple(getattr(compiled, "positiontup", None) or ())
    # A bind built without a value (sa.bindparam(name)) is required; SQLAlchemy
    # would raise "a value is required for bind parameter" rather than send NULL.
    required = frozenset(name for name in order if binds[name].required)
    fixed = {name: binds[name].value for name in order if name not in required}
    sql = str(compiled)
    return _Compiled(sql, order, fixed, required, routine_key(sql))


def compile_statement(stmt: sa.ClauseElement) -> _Compiled:
    """A statement shape compiled as :class:`Tx` runs it (cached)."""
    return _compile(stmt)


@dataclass(frozen=True)
class _CompiledComposite:
    # The routine's parameters by name, in order: ``first``'s, then the rest of ``then``'s.
    order: tuple[str, ...]
    # Which installed routine runs the two statements (cortex._db.routines).
    key: str


@lru_cache(maxsize=_CACHE_SIZE)
def compile_composite(composite: Composite) -> _CompiledComposite:
    """A two-statement shape compiled as :meth:`Tx.call` runs it (cached)."""
    first = _compile(composite.first).order
    fed = dict(composite.fed)
    rest = [n for n in _compile(composite.then).order if n not in first and n not in fed]
    order = (*first, *dict.fromkeys(rest))
    key = routine_key(f"{_compile(composite.first).sql}\n;\n{_compile(composite.then).sql}")
    return _CompiledComposite(order, key)


class Tx:
    """One call's statements, executed straight on the asyncpg connection.

    SQLAlchemy builds and compiles each statement shape once; asyncpg prepares
    and caches it per connection. Executing on the driver skips SQLAlchemy's
    per-call execution machinery (greenlet hops, result processing), which
    cost more CPU than PostgreSQL spent running the hot statements.

    Inside a transaction (``routines`` None) each statement is sent as it
    is. In autocommit (``routines`` given, see cortex._db.transaction.run_transaction)
    each statement is a transaction of its own: its routine when one is
    installed (one round trip), else ``own_transaction`` (BEGIN with the
    binding, the statement, COMMIT).
    """

    __slots__ = ("completed", "driver", "own_transaction", "routines")

    def __init__(
        self,
        driver: asyncpg.Connection,
        routines: Routines | None = None,
        own_transaction: Callable[[str, list[Any]], Awaitable[list[Row]]] | None = None,
    ) -> None:
        self.driver = driver
        self.routines = routines
        self.own_transaction = own_transaction
        # Statements that returned: before the first, nothing reached the server.
        self.completed = 0

    async def execute(
        self, stmt: sa.ClauseElement, params: Mapping[str, Any] | None = None
    ) -> Result:
        """Run a statement with named parameters; its rows (possibly none).

        Raises:
            StatementError: a required parameter is missing or an unknown one is given.
        """
        compiled = _compile(stmt)
        given = params or {}
        if not compiled.required <= given.keys():
            missing = ", ".join(sorted(compiled.required - given.keys()))
            raise StatementError(f"a value is required for bind parameter(s) {missing}")
        unknown = given.keys() - compiled.required - SHARED_PARAMS
        if unknown:
            raise StatementError(f"unknown bind parameter(s) {', '.join(sorted(unknown))}")
        args = [given[name] if name in given else compiled.fixed[name] for name in compiled.order]
        if self.routines is None:
            rows: list[Row] = await self.driver.fetch(compiled.sql, *args, record_class=Row)
            self.completed += 1
            return Result(rows)
        found = await self._routine(compiled.key, args)
        if found is not None:
            return found
        if self.own_transaction is None:
            raise StatementError("autocommit without a transaction to fall back on")
        rows = await self.own_transaction(compiled.sql, args)
        self.completed += 1
        return Result(rows)

    async def _routine(self, key: str, args: list[Any]) -> Result | None:
        """The rows of the routine installed for ``key``; None if there is none (any more).

        A routine dropped by an upgrade since the store looked
        (cortex._db.routines.install) did nothing: it is forgotten, and the
        caller falls back on a transaction.
        """
        call = None if self.routines is None else self.routines.get(key)
        if call is None or self.routines is None:
            return None
        try:
            rows: list[Row] = await self.driver.fetch(call, *args, record_class=Row)
        except asyncpg.UndefinedFunctionError:
            # The error does not say which function is missing: the catalog does.
            name = call.split("(", 1)[0].removeprefix("SELECT * FROM ")
            if await self.driver.fetchval("SELECT pg_catalog.to_regproc($1) IS NOT NULL", name):
                raise
            self.routines.pop(key, None)
            return None
        self.completed += 1
        return Result(rows)

    async def call(self, composite: Composite, params: Mapping[str, Any]) -> Result:
        """Run a two-statement routine (autocommit only); its rows.

        Raises:
            NeedsTransaction: no such routine (any more): nothing ran; the
                caller runs the two statements in a transaction instead.
        """
        compiled = compile_composite(composite)
        found = await self._routine(compiled.key, [params[name] for name in compiled.order])
        if found is None:
            raise NeedsTransaction
        return found
