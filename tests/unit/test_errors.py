from __future__ import annotations

import re

import pytest
import sqlalchemy.exc

from cortex import CortexError, DatabaseError, DatabaseUnavailable, OperationTimeout
from cortex._sql.tables import metadata
from cortex.errors import constraint_of, translate, translate_errors


class _Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__("driver")
        self.sqlstate = sqlstate


def _dbapi(sqlstate: str | None, *, invalidated: bool = False) -> sqlalchemy.exc.DBAPIError:
    return sqlalchemy.exc.DBAPIError(
        "SELECT 1", None, _Orig(sqlstate), connection_invalidated=invalidated
    )


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (_dbapi("08006"), DatabaseUnavailable),
        (_dbapi("57P01"), DatabaseUnavailable),
        (_dbapi("53300"), DatabaseUnavailable),
        (_dbapi("42P01", invalidated=True), DatabaseUnavailable),
        (_dbapi(None), DatabaseUnavailable),
        (_dbapi("57014"), OperationTimeout),
        (_dbapi("55P03"), OperationTimeout),
        (_dbapi("42P01"), DatabaseError),
        (sqlalchemy.exc.TimeoutError(), DatabaseUnavailable),
        (ConnectionRefusedError(111, "refused"), DatabaseUnavailable),
    ],
)
def test_map(exc: Exception, cls: type[CortexError]) -> None:
    mapped = translate(exc)
    assert type(mapped) is cls


def test_chains_cause_and_passes_others() -> None:
    original = _dbapi("57014")
    with pytest.raises(OperationTimeout) as info, translate_errors():
        raise original
    assert info.value.__cause__ is original
    with pytest.raises(KeyError), translate_errors():
        raise KeyError("not ours")


class _Unique(Exception):
    def __init__(self, constraint: str) -> None:
        super().__init__("duplicate key")
        self.constraint_name = constraint


@pytest.mark.parametrize(
    "reported", ["uq_sessions_default", "uq_sessions_default_102020", "uq_sessions_default_7"]
)
def test_a_shard_constraint_name_maps_to_the_schema_name(reported: str) -> None:
    # A Citus worker reports its shard's index: name + "_<shard id>".
    assert constraint_of(_Unique(reported)) == "uq_sessions_default"


def test_no_cortex_constraint_or_index_name_ends_like_a_shard_suffix() -> None:
    # constraint_of strips "_<digits>" unconditionally: that is only right
    # while no name of cortex's own ends that way.
    names = [c.name for t in metadata.tables.values() for c in t.constraints]
    names += [i.name for t in metadata.tables.values() for i in t.indexes]
    assert names
    assert [n for n in names if isinstance(n, str) and re.search(r"_[0-9]+$", n)] == []
