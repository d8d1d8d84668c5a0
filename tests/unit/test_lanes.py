"""The test lanes select their tests by marker, never by a list of files.

A test joins the Citus, SQLAlchemy 2.0 or reliability lane with
``pytest.mark.citus`` / ``sqlalchemy20`` / ``reliability`` (every unit test is
in the SQLAlchemy 2.0 lane: tests/unit/conftest.py). A list of files in
``.ci/run`` or the Makefile would silently leave a new test out of its lane.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LANES = {"citus": ".ci/run", "sqlalchemy20": ".ci/run", "reliability": "Makefile"}
_TEST_FILE = re.compile(r"tests/\S*?\.py")


@pytest.mark.parametrize("name", sorted(set(LANES.values())))
def test_no_list_of_test_files(name: str) -> None:
    named = _TEST_FILE.findall((ROOT / name).read_text())
    assert not named, f"{name} names {named}: mark the tests instead (pytest -m <lane>)"


@pytest.mark.parametrize(("marker", "name"), sorted(LANES.items()))
def test_each_lane_runs_its_marker(marker: str, name: str) -> None:
    run = re.compile(rf"-m pytest\b.* -m {marker}(\s|$)")
    assert any(run.search(line) for line in (ROOT / name).read_text().splitlines()), (
        f"{name} has no pytest run of -m {marker}"
    )


def test_the_lane_markers_are_declared() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    declared = {line.split(":", 1)[0].strip() for line in markers}
    assert set(LANES) <= declared


def test_a_unit_test_is_in_the_sqlalchemy20_lane(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("sqlalchemy20") is not None
