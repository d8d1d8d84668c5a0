"""Each revision prints the same offline SQL as when it was pinned (tests/migrations/offline).

No database: ``cortex db sql`` renders the script with literal binds. Every
revision's downgrade runs offline too, so none is skipped.
"""

from __future__ import annotations

import difflib
import functools

import pytest
from alembic.script import ScriptDirectory

from cortex.migrate import alembic_config
from tests.migrations.offline import PINS, Direction, generate, pin_name

REVISIONS = [
    script.revision
    for script in reversed(list(ScriptDirectory.from_config(alembic_config()).walk_revisions()))
]
DIRECTIONS: tuple[Direction, ...] = ("up", "down")
DIFF_LINES = 40
FIX = "python -m tests.migrations.offline --write"


@functools.cache
def generated(direction: Direction) -> dict[str, str]:
    return generate(direction)


def _compare(name: str, what: str, direction: Direction) -> None:
    path = PINS / name
    produced = generated(direction).get(name)
    assert produced is not None, f"{what}: the offline {direction} script has no such part"
    if not path.is_file():
        pytest.fail(f"{what}: {path} is missing; pin it with `{FIX}`")
    pinned = path.read_text(encoding="utf-8")
    if produced == pinned:
        return
    diff = difflib.unified_diff(
        pinned.splitlines(),
        produced.splitlines(),
        fromfile=f"pinned {name}",
        tofile="generated now",
        lineterm="",
    )
    head = "\n".join(list(diff)[:DIFF_LINES])
    pytest.fail(
        f"{what}: its offline {direction} SQL changed; a released revision must do what it "
        f"did (write a new revision instead)\n{head}"
    )


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("revision", REVISIONS)
def test_revision_sql_is_pinned(revision: str, direction: Direction) -> None:
    _compare(pin_name(revision, direction), f"revision {revision}", direction)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_what_env_prints_is_pinned(direction: Direction) -> None:
    # The preamble and anything between two revisions beyond COMMIT/BEGIN.
    for name in generated(direction):
        if name.startswith("_"):
            _compare(name, f"alembic/env.py ({name})", direction)


def test_every_pin_is_generated() -> None:
    expected = set(generated("up")) | set(generated("down"))
    stale = sorted(path.name for path in PINS.glob("*.sql") if path.name not in expected)
    assert not stale, f"pins of SQL the migrations no longer print: {stale}"


def test_every_revision_has_a_section() -> None:
    for direction in DIRECTIONS:
        names = set(generated(direction))
        assert {pin_name(rev, direction) for rev in REVISIONS} <= names, direction
