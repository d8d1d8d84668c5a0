"""What the command line prints for a human: every character it could be told to print, escaped or kept."""

from __future__ import annotations

import argparse
import functools
import io
import json
import logging
import sys
import unicodedata

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from cortex import _cli_common, cli
from cortex._cli_common import VisibleFormatter, json_text, literal, say, visible
from cortex.errors import NotFound

EVERY_CHARACTER = "".join(map(chr, range(sys.maxunicode + 1)))


def hidden(char: str) -> bool:
    """A character a terminal acts on or draws nothing for (the list an operator tool escapes)."""
    code = ord(char)
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F
        or 0x202A <= code <= 0x202E
        or 0x2066 <= code <= 0x2069
        or 0x200B <= code <= 0x200F
        or code in (0x2028, 0x2029, 0xFEFF)
        or unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    )


@functools.cache
def every_hidden() -> frozenset[str]:
    return frozenset(filter(hidden, EVERY_CHARACTER))


def test_every_character_is_escaped_or_kept_and_the_escape_decodes_back() -> None:
    text = EVERY_CHARACTER.replace("\\", "")  # a backslash is kept: not an escape to decode
    shown = visible(text)
    assert set(shown) & every_hidden() == set()
    assert shown.encode("latin-1", "backslashreplace").decode("unicode_escape") == text
    kept = "".join(c for c in text if c not in every_hidden())
    assert visible(kept) == kept  # nothing else is touched


def test_the_json_form_stays_json_that_decodes_back() -> None:
    # Lone surrogates aside: side by side, JSON reads two as one pair (none is ever stored).
    text = "".join(c for c in EVERY_CHARACTER if unicodedata.category(c) != "Cs")
    shown = json_text({"k": text, text: [1]}, indent=2)
    assert set(shown) & every_hidden() == {"\n"}  # the JSON's own line breaks
    assert json.loads(shown) == {"k": text, text: [1]}
    assert shown.count("\n") == 5  # the JSON's own lines only
    assert json_text("é\x1b\x9b\u202e\U000e0041") == '"é\\u001b\\u009b\\u202e\\udb40\\udc41"'


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", r"\x1b[2J"),
        ("\x1b]52;c;ZXZpbA==\x07", r"\x1b]52;c;ZXZpbA==\x07"),
        ("\x9b31m", r"\x9b31m"),
        ("a\r\bb\n\tc", r"a\r\x08b\n\tc"),
        ("\u202eevil\u2069", r"\u202eevil\u2069"),
        ("\u200b\u2028\ufeff\x7f\xad", r"\u200b\u2028\ufeff\x7f\xad"),
        ("\U000e0041", r"\U000e0041"),
        ("C:\\temp [bold]x[/] :warning: é 漢字 ❤️", "C:\\temp [bold]x[/] :warning: é 漢字 ❤️"),
    ],
)
def test_visible(raw: str, shown: str) -> None:
    assert visible(raw) == shown
    assert visible(visible(raw)) == shown  # escaping twice changes nothing


def test_say_prints_one_literal_line() -> None:
    buffer = io.StringIO()
    out = Console(file=buffer, width=80, highlight=False, emoji=False)
    say(out, "[bold red]x[/] :warning: \x1b[31mred\nfake line")
    assert buffer.getvalue() == "[bold red]x[/] :warning: \\x1b[31mred\\nfake line\n"


def test_a_table_measures_the_escaped_text() -> None:
    buffer = io.StringIO()
    table = Table()
    table.add_column("title")
    table.add_column("n")
    table.add_row(literal("a\u200b\u200b\u200b\u200b\u200bb\x1b[2J"), "1")
    table.add_row(literal("plain"), "2")
    Console(file=buffer, width=80).print(table)
    lines = buffer.getvalue().splitlines()
    assert len({cell_len(line) for line in lines}) == 1  # every border lines up
    assert r"a\u200b\u200b\u200b\u200b\u200bb\x1b[2J" in buffer.getvalue()


def test_log_lines_are_escaped() -> None:
    record = logging.LogRecord("cortex", logging.INFO, __file__, 1, "at %s", ("\x1b[2J\n",), None)
    assert VisibleFormatter("%(message)s").format(record) == r"at \x1b[2J\n"


@pytest.mark.parametrize(
    "error",
    [
        NotFound("session x\x1b]0;pwned\x07 not found\ncortex: ok"),
        _cli_common.UsageError("bad \x9b31m"),
        RuntimeError("driver said \u202e"),
    ],
)
def test_error_lines_are_escaped(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(cli, "cmd_history", fail)  # build_parser binds it when main runs
    assert cli.main(["db", "history"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert [c for c in err if hidden(c) and c != "\n"] == []
    assert visible(str(error)) in err
