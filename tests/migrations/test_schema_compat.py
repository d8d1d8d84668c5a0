"""A rolling deploy migrates first: code of an earlier revision still connects when it is safe.

Revision 20261201000010 records the oldest code every applied revision
serves; ``check_schema`` accepts a later database only within that record.
"""

from __future__ import annotations

import asyncio

import pytest

from cortex import SchemaMismatch
from cortex._db.engine import SCHEMA_REVISION, check_schema, make_engine
from cortex.migrate import downgrade, upgrade

# Code one revision behind: every revision since declares itself safe with it.
PREVIOUS_RELEASE = "20261201000009"


def _check(url: str, expected: str) -> None:
    async def check() -> None:
        engine = make_engine(url)
        try:
            await check_schema(engine, expected)
        finally:
            await engine.dispose()

    asyncio.run(check())


def test_earlier_code_connects_to_a_later_safe_schema(blank_db: str) -> None:
    upgrade(blank_db)
    _check(blank_db, SCHEMA_REVISION)
    _check(blank_db, PREVIOUS_RELEASE)  # migrated first, old processes keep starting
    with pytest.raises(SchemaMismatch, match="newer than this cortex"):
        _check(blank_db, "20261015000007")  # the release before: not safe with 0009


def test_a_database_behind_the_code_still_needs_an_upgrade(blank_db: str) -> None:
    upgrade(blank_db, PREVIOUS_RELEASE)
    with pytest.raises(SchemaMismatch, match="run `cortex db upgrade`"):
        _check(blank_db, SCHEMA_REVISION)


def test_the_record_follows_a_rollback(blank_db: str) -> None:
    upgrade(blank_db)
    downgrade(blank_db, "20261201000009")  # the record's table goes with its revision
    _check(blank_db, "20261201000009")
    with pytest.raises(SchemaMismatch, match="newer than this cortex"):
        _check(blank_db, "20261201000008")  # no record: only the exact revision connects
    upgrade(blank_db)
    _check(blank_db, PREVIOUS_RELEASE)
