"""The statement executor: cortex's compiled Core statements, run straight on asyncpg.

SQLAlchemy builds and compiles each statement shape once; :class:`Tx` binds
named parameters and executes the SQL on the driver connection. This module
owns nothing else: no transactions, no engine, no error translation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg

__all__ = ["Result", "Row", "Tx"]


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
        if len(self._rows) != 1:
            raise AssertionError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.first()
        return None if row is None else row[0]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[str, ...]
    defaults: dict[str, Any]


_DIALECT: Final = pg_asyncpg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated


@cache
def _compile(stmt: sa.ClauseElement) -> _Compiled:
    # Statement shapes are built once (cortex._filters) and compiled once here;
    # values embedded in a shape (e.g. kind = 'interrupted') are its defaults.
    compiled = stmt.compile(dialect=_DIALECT)
    order = getattr(compiled, "positiontup", None) or ()  # asyncpg's $n style is positional
    return _Compiled(str(compiled), tuple(order), dict(compiled.params))


class Tx:
    """One transaction's statements, executed straight on the asyncpg connection.

    SQLAlchemy builds and compiles each statement shape once; asyncpg prepares
    and caches it per connection. Executing on the driver skips SQLAlchemy's
    per-call execution machinery (greenlet hops, result processing), which
    cost more CPU than PostgreSQL spent running the hot statements.
    """

    __slots__ = ("driver",)

    def __init__(self, driver: asyncpg.Connection) -> None:
        self.driver = driver

    async def execute(
        self, stmt: sa.ClauseElement, params: Mapping[str, Any] | None = None
    ) -> Result:
        """Run a statement with named parameters; its rows (possibly none)."""
        compiled = _compile(stmt)
        given = params or {}
        args = [
            given[name] if name in given else compiled.defaults[name] for name in compiled.order
        ]
        rows: list[Row] = await self.driver.fetch(compiled.sql, *args, record_class=Row)
        return Result(rows)
