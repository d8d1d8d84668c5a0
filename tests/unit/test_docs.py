"""The README and the documentation pages say what the code does.

- Every Python block in the README and under docs/ either runs in a test
  (``<!-- readme-test: NAME -->`` or ``<!-- docs-test: NAME -->`` on the line
  above it) or is marked as a fragment (``<!-- fragment -->``) and says so.
- A docs block named like a README block is a copy of it (the README's runs
  in tests/integration/test_readme.py); the other named docs blocks run
  there or here.
- The command-line reference (docs/reference/cli.md) has a section for every
  command of the argparse parser, naming each of its arguments.
- The pages speak of versions and dates only: no private module path in the
  README or the guides, no install line that cannot work before the
  distribution is published.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortex.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# The named docs blocks that are not README copies, and the test that runs each.
RUN_ELSEWHERE = {
    "messages-and-state": "tests/integration/test_readme.py::test_guide_messages_and_state",
    "operators": "tests/integration/test_readme.py::test_guide_operators",
    "fork-and-rewind": "tests/integration/test_readme.py::test_guide_fork_and_rewind",
    "retention": "tests/integration/test_readme.py::test_guide_retention",
    "scope-lifecycle": "tests/integration/test_readme.py::test_guide_scope_lifecycle",
}
RUN_HERE = {"scopes"}
SHARED_OPTIONS = {"--database-url", "--scope", "--json"}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
_MARK = re.compile(r"<!-- (readme-test|docs-test): ([\w-]+) -->|<!-- fragment -->")


def _blocks(page: Path) -> Iterator[tuple[str, str, str | None, str]]:
    """(language, code, marker kind, name) of each fenced block of a page."""
    text = page.read_text()
    for found in _FENCE.finditer(text):
        before = text[: found.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.fullmatch(before.strip())
        kind = name = None
        if mark is not None:
            kind = mark.group(1) or "fragment"
            name = mark.group(2)
        yield found.group(1), found.group(2), kind, name or ""


def _named(kind: str, page: Path) -> dict[str, str]:
    return {name: code for _, code, k, name in _blocks(page) if k == kind}


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_python_block_runs_or_says_it_is_a_fragment(page: Path) -> None:
    for language, code, kind, _ in _blocks(page):
        if language != "python":
            continue
        where = f"{_rel(page)}: the block starting {code.splitlines()[0]!r}"
        assert kind is not None, f"{where} is neither tested nor marked <!-- fragment -->"
        if kind == "fragment":
            assert "fragment" in code.lower(), f"{where} does not say it is a fragment"
        elif kind == "readme-test":
            assert page == README, f"{where}: readme-test marks README blocks only"


def test_named_docs_blocks_are_readme_copies_or_run() -> None:
    readme = _named("readme-test", README)
    seen: set[str] = set()
    for page in sorted(DOCS.rglob("*.md")):
        for name, code in _named("docs-test", page).items():
            seen.add(name)
            if name in readme:
                assert code == readme[name], f"{_rel(page)}: block {name!r} differs from README's"
            else:
                assert name in RUN_ELSEWHERE or name in RUN_HERE, (
                    f"{_rel(page)}: {name!r} runs nowhere"
                )
    assert set(RUN_ELSEWHERE) | RUN_HERE <= seen


def test_the_readme_s_links_lead_somewhere() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_the_scopes_block_runs() -> None:
    (code,) = [
        c
        for page in sorted(DOCS.rglob("*.md"))
        for name, c in _named("docs-test", page).items()
        if name == "scopes"
    ]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "acme/support/user-42",
        "scope acme is not within the enclosing scope acme/support",
    ]


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("cortex",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command below ``parser`` that has no subcommands of its own, with its path."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


def _cli_sections() -> dict[str, str]:
    """The CLI page's sections, by the command their heading names (`### \\`cortex db sql\\``)."""
    text = (DOCS / "reference" / "cli.md").read_text()
    parts = re.split(r"^#{2,3} `(cortex[^`]*)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_cli_page_covers_every_command_and_option() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    sections = _cli_sections()
    commands = list(_commands(build_parser()))
    assert len(commands) >= 18  # db: 7, sessions: 10, demo
    for path, parser in commands:
        heading = " ".join(path)
        assert heading in sections, f"docs/reference/cli.md has no section `{heading}`"
        section = sections[heading]
        usage = " ".join(parser.format_usage().split())
        assert usage in " ".join(section.split()), f"`{heading}`: the usage line differs"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = (action.option_strings or [action.dest])[-1]
            # Options every command of a group takes are described once, for the group.
            where = page if name in SHARED_OPTIONS else section
            assert f"- `{name}" in where, f"`{heading}`: {name} is not described"


def test_the_cli_page_lists_the_exit_codes() -> None:
    from cortex._cli_common import EXIT_CODES

    text = (DOCS / "reference" / "cli.md").read_text()
    for code in {0, 1, 2, *(c for _, c in EXIT_CODES)}:
        assert re.search(rf"^\| {code} \|", text, re.M), f"exit code {code} is missing"


@pytest.mark.parametrize(
    "page", [README, *sorted((DOCS / "guides").glob("*.md")), DOCS / "index.md"], ids=_rel
)
def test_no_private_module_paths(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"cortex[./]_[a-z]", text), "a private module is named"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_install_line_that_cannot_work_yet(page: Path) -> None:
    for line in page.read_text().splitlines():
        if re.search(r"pip install ['\"]?cortex-sessions", line):
            assert "once it is published" in line, f"{_rel(page)}: {line.strip()}"
