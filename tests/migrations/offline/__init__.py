"""Each revision's offline SQL (``cortex db sql``), pinned in a file of its own.

Usage::

    python -m tests.migrations.offline            # list the pins that are missing or differ
    python -m tests.migrations.offline --write    # write the missing pins only
    python -m tests.migrations.offline --write --force   # also rewrite pins that differ

The whole offline upgrade from base to head is split into one section per
revision, from its ``-- Running upgrade X -> REV`` line to its
``alembic_version`` line, stored as ``<rev>.sql``; the offline downgrade from
head to base likewise as ``<rev>.down.sql``. What ``alembic/env.py`` prints
around them is pinned too: ``_preamble[.down].sql`` before the first revision,
and ``_after_<rev>[.down].sql`` where more than a transaction boundary follows
a revision. A released revision's SQL must never change, so a pin is only
rewritten on purpose (``--force``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from alembic.config import Config

from alembic import command
from cortex.migrate import alembic_config

__all__ = [
    "OFFLINE_URL",
    "PINS",
    "Direction",
    "Script",
    "differences",
    "generate",
    "main",
    "offline_script",
    "pin_name",
    "split",
]

Direction = Literal["up", "down"]

PINS: Final = Path(__file__).parent
# `cortex db sql`'s URL when none is given (cortex/cli.py).
OFFLINE_URL: Final = "postgresql://offline@localhost/cortex"

_RUNNING: Final = {
    "up": re.compile(r"-- Running upgrade (?P<old>\S*) -> (?P<rev>\S+)"),
    "down": re.compile(r"-- Running downgrade (?P<rev>\S+) -> (?P<old>\S*)"),
}
# Lines that separate two revisions' transactions and say nothing else.
_BOUNDARY: Final = {"COMMIT;", "BEGIN;"}


def pin_name(stem: str, direction: Direction) -> str:
    """The file that pins ``stem`` (a revision, ``_preamble`` or ``_after_<rev>``)."""
    return f"{stem}.sql" if direction == "up" else f"{stem}.down.sql"


def offline_script(direction: Direction) -> str:
    """The offline SQL from base to head (up) or from head to base (down), as ``cortex db sql`` prints it."""

    def upgrade(config: Config) -> None:
        command.upgrade(config, "head", sql=True)

    def downgrade(config: Config) -> None:
        command.downgrade(config, "head:base", sql=True)

    run: Callable[[Config], None] = upgrade if direction == "up" else downgrade
    config = alembic_config(OFFLINE_URL)
    buffer = io.StringIO()
    config.stdout = buffer
    with contextlib.redirect_stdout(buffer):
        run(config)
    return buffer.getvalue()


@dataclass(frozen=True)
class Script:
    """An offline script cut at its revisions."""

    preamble: str
    # revision -> its section, in the order the script runs them
    sections: dict[str, str]
    # revision -> what env.py printed after it, where that is more than a boundary
    after: dict[str, str]


def _version_line(direction: Direction, rev: str, old: str) -> re.Pattern[str]:
    if direction == "up" and not old:
        return re.compile(rf"INSERT INTO alembic_version \(version_num\) VALUES \('{rev}'\).*")
    if direction == "up":
        return re.compile(rf"UPDATE alembic_version SET version_num='{rev}' WHERE .*")
    if not old:
        return re.compile(rf"DELETE FROM alembic_version WHERE .*version_num = '{rev}';")
    return re.compile(rf"UPDATE alembic_version SET version_num='{old}' WHERE .*= '{rev}';")


def split(script: str, direction: Direction) -> Script:
    """Cut ``script`` into its preamble, one section per revision and env.py's additions."""
    lines = script.split("\n")
    sections: dict[str, str] = {}
    gaps: list[tuple[str | None, list[str]]] = []
    pending: list[str] = []
    previous: str | None = None
    index = 0
    while index < len(lines):
        start = _RUNNING[direction].fullmatch(lines[index])
        if start is None:
            pending.append(lines[index])
            index += 1
            continue
        rev, old = start["rev"], start["old"]
        end_line = _version_line(direction, rev, old)
        end = next((i for i in range(index + 1, len(lines)) if end_line.fullmatch(lines[i])), None)
        if end is None:
            raise ValueError(f"{rev}: no alembic_version line ends its {direction} section")
        gaps.append((previous, pending))
        sections[rev] = "\n".join(lines[index : end + 1]) + "\n"
        pending = []
        previous = rev
        index = end + 1
    gaps.append((previous, pending))
    preamble = ""
    after: dict[str, str] = {}
    for rev, gap in gaps:
        text = "\n".join(gap)
        if rev is None:
            preamble = text
        elif {line for line in gap if line.strip()} - _BOUNDARY:
            after[rev] = text
    return Script(preamble=preamble, sections=sections, after=after)


def generate(direction: Direction) -> dict[str, str]:
    """File name -> pinned text, for every pin of ``direction``."""
    script = split(offline_script(direction), direction)
    pins = {pin_name("_preamble", direction): script.preamble}
    pins.update({pin_name(rev, direction): text for rev, text in script.sections.items()})
    pins.update({pin_name(f"_after_{rev}", direction): t for rev, t in script.after.items()})
    return pins


def differences(generated: dict[str, str]) -> tuple[list[str], list[str]]:
    """The pins of ``generated`` that are missing, and those whose file differs."""
    missing = [name for name in generated if not (PINS / name).is_file()]
    changed = [
        name
        for name, text in generated.items()
        if name not in missing and (PINS / name).read_text(encoding="utf-8") != text
    ]
    return missing, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.migrations.offline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--write", action="store_true", help="write the pins that are missing")
    parser.add_argument(
        "--force", action="store_true", help="with --write: also rewrite pins that differ"
    )
    args = parser.parse_args(argv)
    if args.force and not args.write:
        parser.error("--force only goes with --write")
    generated = {**generate("up"), **generate("down")}
    missing, changed = differences(generated)
    for name in missing:
        print(f"missing  {name}")
    for name in changed:
        print(f"differs  {name}")
    if not args.write:
        return 1 if missing or changed else 0
    for name in missing + (changed if args.force else []):
        # newline="" keeps the script's own line ends exactly.
        with (PINS / name).open("w", encoding="utf-8", newline="") as file:
            file.write(generated[name])
        print(f"wrote    {name}")
    if changed and not args.force:
        print(
            "refused to rewrite pins that differ: a released revision's SQL must not change "
            "(--force rewrites them)",
            file=sys.stderr,
        )
        return 1
    return 0
