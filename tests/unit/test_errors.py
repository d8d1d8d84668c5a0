from __future__ import annotations

import pytest
import sqlalchemy.exc

from cortex import CortexError, DatabaseError, DatabaseUnavailable, OperationTimeout
from cortex.errors import translate, translate_errors


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
