"""The unit tests: no database, and every one of them in the SQLAlchemy 2.0 lane.

CI runs ``pytest -m sqlalchemy20`` on the oldest SQLAlchemy the pins allow
(``.ci/run``). The executor leans on compiler details the unit tests pin down,
so each unit test carries the marker without saying so, a new one included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook is handed every collected item, not only its folder's.
    for item in items:
        if item.path.resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.sqlalchemy20)
