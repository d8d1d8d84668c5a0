"""The console's statements call built-ins by their pg_catalog names."""

from __future__ import annotations

import re

from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ClauseElement

from cortex._sql import console as sql

_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _text(statement: ClauseElement) -> str:
    return str(statement.compile(dialect=_DIALECT))


def test_the_audit_row_takes_pg_catalogs_clock() -> None:
    text = _text(sql.insert_action_statement())
    assert "pg_catalog.statement_timestamp()" in text
    assert not re.search(r"(?<![.\w])statement_timestamp\(", text)


def test_the_bind_pins_the_search_path() -> None:
    text = _text(sql.bind_statement())
    assert "pg_catalog.set_config('search_path', 'pg_catalog, public, pg_temp', true)" in text
