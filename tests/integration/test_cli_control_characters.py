"""Host- and database-written text never reaches the operator's terminal as control characters.

Every human view (``sessions list``, ``show``, ``messages``, ``db current``,
``db upgrade``, error lines, log lines) must show C0 and C1 controls, DEL,
bidi overrides and invisible format characters escaped (``\\x1b``,
``\\u202e``), while ``--json`` decodes back to exactly what is stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import unicodedata
from typing import Any

import anyio
import pytest

import cortex
from cortex import FunctionResponse, NewMessage, RequestedInput, use_scope
from cortex._db.engine import SCHEMA_REVISION
from cortex.cli import EXIT_SCHEMA, main
from tests.conftest import Database, admin

# What a hostile host writes: each raw sequence and how an operator must see it.
PROBES = {
    "\x1b[2J": r"\x1b[2J",  # clear the screen
    "\x1b]52;c;ZXZpbA==\x07": r"\x1b]52;c;ZXZpbA==\x07",  # write the clipboard
    "\x1b]0;pwned\x07": r"\x1b]0;pwned\x07",  # set the window title
    "\x9b31m": r"\x9b31m",  # 8-bit CSI: red
    "\u202e": r"\u202e",  # right-to-left override
    "\r": r"\r",  # overwrite the line
    "\b": r"\x08",  # backspace
    "\n": r"\n",  # a fake line
    "\x7f": r"\x7f",
    "\x85": r"\x85",  # C1 next line
    "\u2066": r"\u2066",  # left-to-right isolate
    "\u200b": r"\u200b",  # zero-width space
    "\u2028": r"\u2028",  # line separator
    "\ufeff": r"\ufeff",
    "\U000e0041": r"\U000e0041",  # an invisible tag character
}


def hostile(*raw: str) -> str:
    """A short text carrying ``raw`` sequences between visible letters."""
    return "é" + "".join(raw) + "z"


def escaped(*raw: str) -> str:
    return "é" + "".join(PROBES[r] for r in raw) + "z"


EVERY = tuple(PROBES)
# Table cells are kept short so a 200-column table never folds one.
TITLE = ("\x1b[2J", "\u202e", "\r", "\n")
AGENT = ("\x1b]0;pwned\x07", "\x9b31m")
ROLE = ("\x1b[2J", "\b")
AUTHOR = ("\x1b]52;c;ZXZpbA==\x07",)
CONTENT = ("\x9b31m", "\u2066", "\n", "\x85", "\u200b")


def forbidden(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on or hide (a newline ends a line: allowed)."""
    return [
        c
        for c in text
        if (ord(c) < 0x20 and c != "\n")
        or 0x7F <= ord(c) <= 0x9F
        or unicodedata.category(c) in ("Cf", "Zl", "Zp", "Cs")
    ]


def _seed(database: Database, tenant: str) -> tuple[str, str]:
    """A paused, interrupted session with every text field hostile; an aborted one with short rows."""
    evil = hostile(*EVERY)

    async def seed() -> tuple[str, str]:
        async with cortex.connect(database.app_url) as store:
            with use_scope(f"{tenant}/u1"):
                s = await store.create_session(
                    "bot",
                    title=hostile(*TITLE),
                    metadata={evil: evil, "nested": [evil, {"k": evil}]},
                    key=evil,
                    data={evil: evil},
                )
                await store.append_message(
                    s.id,
                    NewMessage(
                        "assistant",
                        evil,
                        author=evil,
                        metadata={"m": evil},
                        requested_input=RequestedInput(
                            interrupt_id="approve",
                            message=evil,
                            response_schema={"type": "object", "description": evil},
                            payload={evil: [evil]},
                        ),
                    ),
                )
                await store.mark_interrupted(s.id, evil)
                gone = await store.create_session("bot", title="aborted")
                await store.append_messages(
                    gone.id,
                    [
                        NewMessage("user", hostile(*CONTENT), author=hostile(*AUTHOR)),
                        NewMessage(
                            "assistant",
                            "asks",
                            requested_input=RequestedInput(
                                interrupt_id="first", message=hostile(*CONTENT)
                            ),
                        ),
                        NewMessage(
                            "tool",
                            "answers",
                            function_response=FunctionResponse(
                                id="first", response={"ok": hostile(*AGENT)}
                            ),
                        ),
                    ],
                )
                await store.abort_session(gone.id, evil)
                return s.id, gone.id

    sid, gone = anyio.run(seed)
    # What no cortex call accepts, but another writer (or a backfill) may have stored.
    asyncio.run(
        admin(
            database.owner_url,
            f"UPDATE sessions SET agent_id = {_sql(hostile(*AGENT))}"
            f" WHERE tenant_id = '{tenant}' AND title <> 'aborted'",
            f"UPDATE messages SET role = {_sql(hostile(*ROLE))}"
            f" WHERE tenant_id = '{tenant}' AND role = 'user'",
            f"UPDATE pending_inputs SET interrupt_id = {_sql(evil)}"
            f" WHERE tenant_id = '{tenant}' AND interrupt_id = 'approve'",
        )
    )
    return sid, gone


def _json_form(value: object) -> str:
    """``value`` as ``show`` prints JSON: hidden characters as JSON escapes, "é" as is."""
    return json.dumps(value).replace("\\u00e9", "é")


def _sql(text: str) -> str:
    """``text`` as a PostgreSQL escape-string literal (control characters as \\uXXXX)."""
    body = "".join(c if c.isalnum() and c.isascii() else f"\\U{ord(c):08x}" for c in text)
    return f"E'{body}'"


def _human(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert forbidden(out) == [], out
    return out


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main([*argv, "--json"]) == 0
    raw = capsys.readouterr().out
    # Non-ASCII text as is ("é"); every hidden character a JSON escape.
    assert forbidden(raw) == [], raw
    return json.loads(raw)


def test_list_escapes_titles_and_agent_ids(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(database, tenant)
    argv = ["--database-url", database.owner_url, "sessions", "list", "--scope", tenant]
    out = _human(capsys, argv)
    assert escaped(*TITLE) in out
    assert escaped(*AGENT) in out
    listed = _json(capsys, argv)["sessions"]
    (live,) = (s for s in listed if s["title"] != "aborted")
    assert live["title"] == hostile(*TITLE)
    assert live["agent_id"] == hostile(*AGENT)
    assert live["key"] == hostile(*EVERY)


def test_show_escapes_every_field(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid, gone = _seed(database, tenant)
    url = ["--database-url", database.owner_url]
    argv = [*url, "sessions", "show", sid, "--scope", tenant]
    out = _human(capsys, argv)
    evil = hostile(*EVERY)
    fields = {
        line.split(":", 1)[0].strip(): line.split(": ", 1)[1]
        for line in out.splitlines()
        if line.startswith("  ") and ": " in line
    }
    assert fields["agent"] == escaped(*AGENT)
    assert fields["title"] == escaped(*TITLE)
    for label in ("key", "last message", "interrupt reason"):
        assert fields[label] == escaped(*EVERY), label
    # A JSON body stays JSON: its escapes are JSON's.
    form = _json_form(evil)
    assert f"{form}: {form}" in out  # metadata and state data
    assert f'"description": {form}' in out  # the response schema
    assert f"by {escaped(*EVERY)}): {escaped(*EVERY)}" in out  # the question and its author
    assert f"pending {escaped(*EVERY)} " in out  # the interrupt id
    assert out.count("\n") == len(out.splitlines())  # no line was split by host text

    detail = _json(capsys, argv)
    session = detail["session"]
    assert session["metadata"] == {evil: evil, "nested": [evil, {"k": evil}]}
    assert session["data"] == {evil: evil}
    assert session["key"] == evil
    assert session["last_message"] == evil
    assert detail["interrupt_reason"] == evil
    (pending,) = detail["pending"]
    assert pending["interrupt_id"] == evil
    assert pending["message"] == evil
    assert pending["author"] == evil
    assert pending["response_schema"] == {"type": "object", "description": evil}
    assert pending["payload"] == {evil: [evil]}

    out = _human(capsys, [*url, "sessions", "show", gone, "--scope", tenant])
    assert f"abort reason: {escaped(*EVERY)}" in out
    assert (
        _json(capsys, [*url, "sessions", "show", gone, "--scope", tenant])["abort_reason"] == evil
    )


def test_messages_escapes_roles_authors_and_content(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid, gone = _seed(database, tenant)
    url = ["--database-url", database.owner_url]
    argv = [*url, "sessions", "messages", gone, "--scope", tenant]
    out = _human(capsys, argv)
    assert f"{escaped(*ROLE)} │ {escaped(*AUTHOR)} │ {escaped(*CONTENT)} " in out
    assert f"[asks first: {escaped(*CONTENT)}]" in out
    assert "[answers first: " + _json_form({"ok": hostile(*AGENT)}) + "]" in out
    messages = _json(capsys, argv)["messages"]
    assert messages[0]["role"] == hostile(*ROLE)
    assert messages[0]["author"] == hostile(*AUTHOR)
    assert messages[0]["content"] == hostile(*CONTENT)
    assert messages[1]["requested_inputs"][0]["message"] == hostile(*CONTENT)
    assert messages[2]["function_responses"][0]["response"] == {"ok": hostile(*AGENT)}

    # Every field hostile: the row folds, and still no control character is printed.
    evil = hostile(*EVERY)
    argv = [*url, "sessions", "messages", sid, "--scope", tenant]
    _human(capsys, argv)
    (message,) = _json(capsys, argv)["messages"]
    assert message["content"] == message["author"] == evil
    assert message["metadata"] == {"m": evil}
    assert message["requested_inputs"][0]["payload"] == {evil: [evil]}
    assert main([*url, "sessions", "export", sid, "--scope", tenant]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["session"]["title"] == hostile(*TITLE)
    assert exported["messages"][0]["author"] == evil


def test_error_lines_escape_what_they_quote(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", blank_db]
    revision = "zz" + hostile("\x1b]0;pwned\x07", "\n", "\x9b31m")
    asyncio.run(
        admin(
            blank_db,
            "CREATE TABLE alembic_version (version_num varchar(64) PRIMARY KEY)",
            f"INSERT INTO alembic_version VALUES ({_sql(revision)})",
        )
    )
    shown = "zz" + escaped("\x1b]0;pwned\x07", "\n", "\x9b31m")
    # The store refuses the schema, naming the revision it found.
    assert main([*url, "sessions", "list", "--scope", "t"]) == EXIT_SCHEMA
    err = capsys.readouterr().err
    assert forbidden(err) == []
    assert err.count("\n") == 1
    assert shown in err
    # `db current` names it on stdout; its --json keeps it exact.
    assert main([*url, "db", "current"]) == 0
    out = capsys.readouterr().out
    assert forbidden(out) == []
    assert shown in out
    assert main([*url, "db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["revision"] == revision
    # Alembic quotes the revision it cannot locate.
    assert main([*url, "db", "upgrade"]) != 0
    err = capsys.readouterr().err
    assert forbidden(err) == []
    assert err.count("\n") == 1


def test_index_names_found_in_the_database_are_escaped(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade"]) == 0
    name = hostile("\x1b[2J", "\u202e", "\r") + "_next"
    asyncio.run(admin(blank_db, f"CREATE INDEX U&{_identifier(name)} ON sessions (title)"))
    capsys.readouterr()
    assert main([*url, "db", "upgrade"]) == 0
    err = capsys.readouterr().err
    assert forbidden(err) == []
    assert escaped("\x1b[2J", "\u202e", "\r") + "_next" in err
    assert main([*url, "db", "current"]) == 0
    out = capsys.readouterr().out
    assert forbidden(out) == []
    assert escaped("\x1b[2J", "\u202e", "\r") + "_next" in out
    assert main([*url, "db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["leftover_indexes"] == [name]


def _identifier(text: str) -> str:
    """``text`` as a PostgreSQL Unicode-escaped quoted identifier (after ``U&``)."""
    return (
        '"' + "".join(c if c.isalnum() and c.isascii() else f"\\+{ord(c):06x}" for c in text) + '"'
    )


def test_log_lines_on_stderr_are_escaped(blank_db: str) -> None:
    """A log line quoting the database (a revision newer than this code) is escaped on stderr."""
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade"]) == 0
    newer = "99999999999999" + hostile("\x1b]0;pwned\x07", "\n", "\x9b31m")
    asyncio.run(
        admin(
            blank_db,
            f"UPDATE alembic_version SET version_num = {_sql(newer)}",
            f"UPDATE cortex_schema_compat SET oldest_code_revision = '{SCHEMA_REVISION}'",
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "cortex", *url, "sessions", "list", "--scope", "t", "--json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert "which serves code from" in done.stderr
    assert forbidden(done.stderr) == []
    assert "99999999999999" + escaped("\x1b]0;pwned\x07", "\n", "\x9b31m") in done.stderr
