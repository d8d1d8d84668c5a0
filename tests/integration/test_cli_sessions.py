"""The operator's whole loop from the command line, and `cortex db grant` saying what to do."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import Iterator

import anyio
import pytest

import cortex
from cortex import NewMessage, RequestedInput, SessionDetail, use_scope
from cortex.cli import (
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_SCHEMA,
    EXIT_USAGE,
    main,
)
from cortex.migrate import grant_sql
from tests.conftest import Database, admin, with_database, with_user

pytestmark = pytest.mark.sqlalchemy20

_SCHEMA = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}},
    "required": ["approved"],
}


# What a message is in the CLI's JSON: every field, and not the deprecated
# requested_input and function_response (the first of each list).
_MESSAGE_KEYS = (
    "id",
    "session_id",
    "seq",
    "role",
    "content",
    "author",
    "requested_inputs",
    "function_responses",
    "metadata",
    "payload",
    "created_at",
)


def _seed(database: Database, scope: str, title: str) -> str:
    async def seed() -> str:
        async with cortex.connect(database.app_url) as store:
            with use_scope(scope):
                s = await store.create_session(
                    "billing-bot", title=title, metadata={"ticket": "T-7", "tier": "gold"}
                )
                await store.append_messages(
                    s.id,
                    [
                        NewMessage("user", "Refund [/] please [link=https://evil.example]x[/link]"),
                        NewMessage(
                            "assistant",
                            "A refund over $100 needs a human.",
                            requested_input=RequestedInput(
                                interrupt_id="approve-refund",
                                message="Approve a $140 refund?",
                                response_schema=_SCHEMA,
                            ),
                        ),
                    ],
                )
                return s.id

    return anyio.run(seed)


def test_markup_in_titles_and_messages_is_printed_literally(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    title = "refund [/] please [link=https://evil.example]click[/link] [bold]x"
    sid = _seed(database, f"{tenant}/u1", title)
    url = ["--database-url", database.owner_url]
    assert main([*url, "sessions", "list", "--scope", tenant]) == 0
    assert "refund [/] please" in capsys.readouterr().out
    assert main([*url, "sessions", "show", sid, "--scope", tenant]) == 0
    shown = capsys.readouterr().out
    assert title in shown
    assert "\x1b]8;" not in shown  # no terminal hyperlink
    assert main([*url, "sessions", "messages", sid, "--scope", tenant]) == 0
    assert "Refund [/] please [link=https://evil.example]x[/link]" in capsys.readouterr().out


def test_the_operators_loop(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = _seed(database, f"{tenant}/u1", "Refund 42")
    # Global options work after the subcommand too.
    url = ["--database-url", database.owner_url]
    scope = ["--scope", tenant]

    assert main(["sessions", "list", *scope, "--state", "paused", "--json", *url]) == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)["sessions"]] == [sid]

    assert main([*url, "sessions", "show", sid, *scope]) == 0
    shown = capsys.readouterr().out
    assert '"ticket": "T-7"' in shown  # metadata, indented JSON
    assert '\n        "required": [' in shown  # the schema indented beneath its label
    assert "+00:00" in shown  # timestamps carry their zone

    assert main([*url, "sessions", "messages", sid, *scope, "--last", "1", "--json"]) == 0
    (last,) = json.loads(capsys.readouterr().out)["messages"]
    assert last["seq"] == 2
    # One shape: the lists, without the deprecated first-of-each fields.
    assert [q["interrupt_id"] for q in last["requested_inputs"]] == ["approve-refund"]
    assert last["function_responses"] == []
    assert "requested_input" not in last
    assert "function_response" not in last

    bad = ["--interrupt", "approve-refund", "--response", '{"approved": "yes"}']
    assert main([*url, "sessions", "resume", sid, *scope, *bad]) == EXIT_USAGE
    assert "approved" in capsys.readouterr().err
    good = ["--interrupt", "approve-refund", "--response", '{"approved": true}']
    assert main([*url, "sessions", "resume", sid, *scope, *good, "--author", "ops@acme"]) == 0
    assert "resumed" in capsys.readouterr().out
    assert main([*url, "sessions", "messages", sid, *scope, "--last", "1", "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)["messages"]
    assert sorted(answer) == sorted(_MESSAGE_KEYS)
    assert main([*url, "sessions", "resume", sid, *scope, *good]) == 6  # already answered

    assert main([*url, "sessions", "mark", sid, *scope, "--reason", "draining", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "interrupted"
    assert main([*url, "sessions", "unmark", sid, *scope]) == 0
    assert "idle" in capsys.readouterr().out

    assert main([*url, "sessions", "export", sid, *scope]) == 0
    transcript = json.loads(capsys.readouterr().out)
    assert transcript["session"]["id"] == sid
    assert transcript["session"]["metadata"] == {"ticket": "T-7", "tier": "gold"}
    assert [m["seq"] for m in transcript["messages"]] == [1, 2, 3]
    assert transcript["messages"][2]["function_responses"][0]["response"] == {"approved": True}
    assert transcript["messages"][2]["author"] == "ops@acme"
    assert all(sorted(m) == sorted(_MESSAGE_KEYS) for m in transcript["messages"])

    assert main([*url, "sessions", "messages", sid, "--scope", f"{tenant}-x"]) == EXIT_NOT_FOUND
    assert main([*url, "sessions", "export", sid, "--scope", f"{tenant}-x"]) == EXIT_NOT_FOUND
    assert main([*url, "sessions", "mark", sid, "--scope", tenant, "--reason", ""]) in (0, 2)


def test_what_an_operator_expects(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = _seed(database, f"{tenant}/u1", "Refund 43")
    url = ["--database-url", database.owner_url]
    scope = ["--scope", tenant]
    # An unknown interrupt id names the pending ones.
    wrong = ["--interrupt", "approve", "--response", "true"]
    assert main([*url, "sessions", "resume", sid, *scope, *wrong]) == EXIT_NOT_FOUND
    assert "pending: approve-refund" in capsys.readouterr().err
    # No author, no "by -".
    assert main([*url, "sessions", "show", sid, *scope]) == 0
    assert "by -" not in capsys.readouterr().out
    # An empty listing says so instead of drawing an empty box.
    assert main([*url, "sessions", "list", "--scope", f"{tenant}/nobody"]) == 0
    assert capsys.readouterr().out.strip() == f"no sessions in {tenant}/nobody match"
    # mark, unmark and abort answer --json with the session.
    assert main([*url, "sessions", "mark", sid, *scope, "--reason", "drain", "--json"]) == 0
    marked = json.loads(capsys.readouterr().out)
    assert (marked["id"], marked["state"]) == (sid, "paused")  # its question still waits
    assert main([*url, "sessions", "unmark", sid, *scope, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == sid
    # resume --json prints the answer as messages --json does.
    good = ["--interrupt", "approve-refund", "--response", '{"approved": true}']
    assert main([*url, "sessions", "resume", sid, *scope, *good, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert sorted(answer) == sorted(_MESSAGE_KEYS)
    assert [a["id"] for a in answer["function_responses"]] == ["approve-refund"]
    assert main([*url, "sessions", "abort", sid, *scope, "--reason", "gone", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "aborted"
    # Answering an aborted session is a conflict, as other stored state is.
    assert main([*url, "sessions", "resume", sid, *scope, *good]) == EXIT_CONFLICT


def test_the_listing_says_what_each_session_waits_on_or_why_it_stopped(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    paused = _seed(database, f"{tenant}/u1", "Paused one")
    aborted = _seed(database, f"{tenant}/u2", "Aborted one")
    marked = _seed(database, f"{tenant}/u3", "Marked one")
    long = "a reason far longer than any table cell should show " * 4

    async def stop() -> str:
        async with cortex.connect(database.app_url) as store:
            with use_scope(tenant):
                await store.abort_session(aborted, "customer [bold]withdrew\x1b[2J")
                await store.resume(marked, "approve-refund", {"approved": True})
                await store.mark_interrupted(marked, long)
                # Two questions pending: the first is named, the rest counted.
                twice = await store.create_session("billing-bot", title="Two questions")
                asks = [
                    RequestedInput(interrupt_id=f"q{n}", message=f"Question {n}?") for n in (1, 2)
                ]
                await store.append_message(
                    twice.id, NewMessage("assistant", "two", requested_inputs=asks)
                )
                idle = await store.create_session("billing-bot", title="Idle one")
                return idle.id

    idle = anyio.run(stop)
    url = ["--database-url", database.owner_url]
    assert main([*url, "sessions", "list", "--scope", tenant]) == 0
    out = capsys.readouterr().out
    assert "why" in out.splitlines()[2]  # the header
    rows = {line.split()[1]: line for line in out.splitlines() if "ses_" in line}
    assert "approve-refund: Approve a $140 refund?" in rows[paused]
    assert "customer [bold]withdrew\\x1b[2J" in rows[aborted]  # literal, escaped
    assert "a reason far longer" in rows[marked]
    assert long.strip() not in out
    assert "…" in rows[marked]
    (two,) = (line for line in rows.values() if "Two questions" in line)
    assert "q1: Question 1? (+1 more)" in two
    assert rows[idle].split("│")[-2].strip() == ""  # idle: nothing to say
    # --json carries the same, as show --json names it.
    assert main([*url, "sessions", "list", "--scope", tenant, "--json"]) == 0
    listed = {s["id"]: s for s in json.loads(capsys.readouterr().out)["sessions"]}
    assert [p["interrupt_id"] for p in listed[paused]["pending"]] == ["approve-refund"]
    assert listed[aborted]["abort_reason"] == "customer [bold]withdrew\x1b[2J"
    assert listed[aborted]["pending"] == []
    assert listed[marked]["interrupt_reason"] == long
    assert (listed[idle]["pending"], listed[idle]["abort_reason"]) == ([], None)


def test_schemas_and_answers_are_shown_in_the_order_written(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = _seed(database, f"{tenant}/u1", "Refund 45")
    url = ["--database-url", database.owner_url]
    scope = ["--scope", tenant]
    assert main([*url, "sessions", "show", sid, *scope]) == 0
    shown = capsys.readouterr().out
    # As _SCHEMA has them (jsonb would put "required" first: it is shorter).
    assert shown.index('"properties"') < shown.index('"required"')
    answer = '{"zeta": 1, "approved": true, "a": 2}'
    resume = ["--interrupt", "approve-refund", "--response", answer, "--author", ""]
    assert main([*url, "sessions", "resume", sid, *scope, *resume]) == 0
    assert main([*url, "sessions", "messages", sid, *scope]) == 0
    said = capsys.readouterr().out
    assert f"[answers approve-refund: {answer}]" in said
    assert "by -" not in said
    assert main([*url, "sessions", "export", sid, *scope]) == 0
    (*_, answered) = json.loads(capsys.readouterr().out)["messages"]
    assert list(answered["function_responses"][0]["response"]) == ["zeta", "approved", "a"]
    assert list(answered["function_responses"][0]) == ["id", "name", "response"]


def test_unmark_is_the_name_and_clear_an_old_one(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = _seed(database, f"{tenant}/u1", "Refund 44")
    url = ["--database-url", database.owner_url]
    scope = ["--scope", tenant]
    # The help names unmark, and not clear (which Store.clear_messages means otherwise).
    assert main(["sessions", "--help"]) == 0
    listed = capsys.readouterr().out
    assert "unmark" in listed
    assert "clear" not in listed
    assert main([*url, "sessions", "mark", sid, *scope, "--reason", "drain"]) == 0
    capsys.readouterr()
    assert main([*url, "sessions", "unmark", sid, *scope, "--json"]) == 0
    done = capsys.readouterr()
    assert json.loads(done.out)["state"] == "paused"
    assert done.err == ""
    # The old name still works, and says once, on stderr, what to use instead.
    assert main([*url, "sessions", "mark", sid, *scope, "--reason", "drain"]) == 0
    capsys.readouterr()
    assert main([*url, "sessions", "clear", sid, *scope, "--json"]) == 0
    done = capsys.readouterr()
    assert json.loads(done.out)["id"] == sid
    assert done.err.count("\n") == 1
    assert "deprecated" in done.err
    assert "cortex sessions unmark" in done.err
    inspected = anyio.run(_inspect, database, tenant, sid)
    assert inspected.interrupt_reason is None


async def _inspect(database: Database, scope: str, sid: str) -> SessionDetail:
    async with cortex.connect(database.app_url) as store:
        with use_scope(scope):
            return await store.inspect_session(sid)


@pytest.fixture
def fresh_db(server_url: str) -> Iterator[tuple[str, str]]:
    """A migrated database and a role name nobody created yet; yields (owner URL, role)."""
    name = f"cortex_g_{uuid.uuid4().hex[:8]}"
    role = f"cortex_r_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(server_url, f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(server_url, name), role
    finally:
        asyncio.run(
            admin(
                server_url,
                f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
                f'DROP ROLE IF EXISTS "{role}"',
                f'DROP ROLE IF EXISTS "{role}_Mixed"',
                f"DROP ROLE IF EXISTS {role}_Mixed",
            )
        )


def test_grant_on_unmigrated_database_says_upgrade(
    fresh_db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, role = fresh_db
    asyncio.run(admin(url, f"CREATE ROLE {role} LOGIN"))
    assert main(["--database-url", url, "db", "grant", role]) == EXIT_SCHEMA
    err = capsys.readouterr().err
    assert "cortex db upgrade" in err
    assert "SQLSTATE" not in err


def test_grant_on_missing_role_says_create_it(
    fresh_db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, role = fresh_db
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--database-url", url, "db", "grant", role]) == EXIT_NOT_FOUND
    err = capsys.readouterr().err
    assert f"CREATE ROLE {role} LOGIN" in err
    assert "SQLSTATE" not in err


def test_grant_on_a_mixed_case_name(
    fresh_db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, role = fresh_db
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    mixed = f"{role}_Mixed"
    asyncio.run(admin(url, f"CREATE ROLE {mixed} LOGIN"))  # unquoted: folded to lower case
    assert main(["--database-url", url, "db", "grant", mixed]) == 0
    assert "granted" in capsys.readouterr().out


def test_grant_as_the_wrong_role_fails_loudly(
    fresh_db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, role = fresh_db
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    stranger = f"{role}_Mixed".lower()
    asyncio.run(admin(url, f"CREATE ROLE {role} LOGIN", f"CREATE ROLE {stranger} LOGIN"))
    capsys.readouterr()
    as_stranger = with_user(url, stranger)
    # No rights at all: PostgreSQL refuses. The application role's rights: it only warns.
    for rights in ([], grant_sql(stranger)):
        asyncio.run(admin(url, *rights))
        code = main(["--database-url", as_stranger, "db", "grant", role])
        out, err = capsys.readouterr()
        assert code == EXIT_ERROR
        assert "as the owner" in err
        assert "SQLSTATE" not in err
        assert "granted" not in out
    # The application role granting itself what it holds already grants
    # nothing either: refused all the same, not reported as done.
    assert main(["--database-url", as_stranger, "db", "grant", stranger]) == EXIT_ERROR
    out, err = capsys.readouterr()
    assert "as the owner" in err
    assert "granted" not in out


def test_downgrade_to_an_unknown_revision_is_bad_usage(
    fresh_db: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _role = fresh_db
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    assert main(["--database-url", url, "db", "downgrade", "nonsense"]) == EXIT_USAGE
    assert "nonsense" in capsys.readouterr().err


def test_list_by_metadata_and_time(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gold = _seed(database, f"{tenant}/u1", "gold")  # metadata {"ticket": "T-7", "tier": "gold"}

    async def more() -> tuple[str, str]:
        async with cortex.connect(database.app_url) as store:
            with use_scope(f"{tenant}/u2"):
                one = await store.create_session("bot", metadata={"tier": "silver", "n": 1.0})
                other = await store.create_session("bot", metadata={"tier": "gold", "n": True})
                return one.id, other.id

    silver, gold_true = anyio.run(more)
    url = ["--database-url", database.app_url]

    def listed(*options: str) -> tuple[list[str], int]:
        assert main([*url, "sessions", "list", "--scope", tenant, "--json", *options]) == 0
        out = json.loads(capsys.readouterr().out)
        return [s["id"] for s in out["sessions"]], out["total"]

    assert listed("--metadata", 'tier="gold"') == ([gold_true, gold], 2)
    assert listed("--metadata", 'tier="gold"', "--metadata", 'ticket="T-7"') == ([gold], 1)
    assert listed("--metadata", "n=1") == ([silver], 1)
    assert listed("--metadata", "n=true") == ([gold_true], 1)
    assert listed("--metadata", "ticket=null") == ([], 0)
    assert listed("--metadata", 'tier="gold"', "--agent", "bot") == ([gold_true], 1)
    everyone = [gold_true, silver, gold]
    assert listed("--created-after", "2000-01-01T00:00:00Z") == (everyone, 3)
    assert listed("--updated-before", "2000-01-01T00:00:00+05:00") == ([], 0)
    assert listed("--created-before", "2999-01-01T00:00:00-08:00", "--limit", "1") == (
        [gold_true],
        3,
    )
    # The human view names how many matched.
    assert main([*url, "sessions", "list", "--scope", tenant, "--metadata", "n=1"]) == 0
    assert f"sessions in {tenant} (1 of 1)" in capsys.readouterr().out
    assert main([*url, "sessions", "list", "--scope", tenant, "--metadata", "n=2"]) == 0
    assert capsys.readouterr().out.strip() == f"no sessions in {tenant} match"
    assert main([*url, "sessions", "list", "--scope", tenant, "--metadata", "n"]) == EXIT_USAGE


def _transcript(database: Database, scope: str, sid: str) -> list[str]:
    async def read() -> list[str]:
        async with cortex.connect(database.app_url) as store:
            with use_scope(scope):
                return [m.content for m in await store.list_messages(sid, limit=1000)]

    return anyio.run(read)


def test_fork_and_rewind_from_the_command_line(
    database: Database,
    tenant: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sid = _seed(database, f"{tenant}/u1", "Refund 42")  # a message, then a question
    url = ["--database-url", database.app_url]
    scope = ["--scope", tenant]

    assert main([*url, "sessions", "fork", sid, *scope, "--json", "--title", "what if"]) == 0
    fork = json.loads(capsys.readouterr().out)
    assert fork["forked_from"] == {"session_id": sid, "seq": 2}
    assert (fork["title"], fork["message_count"], fork["pending_count"]) == ("what if", 2, 1)
    assert fork["scope"] == f"{tenant}/u1"
    assert main([*url, "sessions", "fork", sid, *scope, "--through-seq", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"forked {sid} through seq 1 into ses_")
    assert f"({tenant}/u1): 1 messages" in out
    assert main([*url, "sessions", "fork", sid, *scope, "--through-seq", "3"]) == EXIT_USAGE
    assert "through_seq" in capsys.readouterr().err

    # Declined, or no answer at all: nothing is deleted, and the exit code says so.
    for answer in ("n\n", "", "yes please\n"):
        monkeypatch.setattr("sys.stdin", io.StringIO(answer))
        assert main([*url, "sessions", "rewind", fork["id"], *scope, "--to-seq", "1"]) == EXIT_ERROR
        captured = capsys.readouterr()
        assert f"rewind {fork['id']} to seq 1: delete message 2 (1 of 2)? [y/N]" in captured.err
        assert "declined" in captured.err
        assert captured.out == ""
    assert len(_transcript(database, tenant, fork["id"])) == 2

    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main([*url, "sessions", "rewind", fork["id"], *scope, "--to-seq", "1", "--json"]) == 0
    captured = capsys.readouterr()
    rewound = json.loads(captured.out)  # the question went to stderr: stdout is the JSON
    assert (rewound["message_count"], rewound["pending_count"], rewound["state"]) == (1, 0, "idle")
    assert _transcript(database, tenant, fork["id"]) == [_transcript(database, tenant, sid)[0]]

    # --yes asks nothing (stdin is not read); nothing to delete asks nothing either.
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert main([*url, "sessions", "rewind", sid, *scope, "--to-seq", "2"]) == 0
    assert "[y/N]" not in capsys.readouterr().err
    assert main([*url, "sessions", "rewind", sid, *scope, "--to-seq", "0", "--yes"]) == 0
    captured = capsys.readouterr()
    assert "[y/N]" not in captured.err
    assert captured.out.strip() == f"rewound {sid} to seq 0: 0 messages, idle"

    for bad, code in ((["--to-seq", "-1"], EXIT_USAGE), (["--to-seq", "5"], EXIT_USAGE)):
        assert main([*url, "sessions", "rewind", sid, *scope, *bad, "--yes"]) == code
        assert "to_seq" in capsys.readouterr().err
    # Another tenant, or a sibling scope, sees no such session.
    for elsewhere in (f"{tenant}/u2", f"{tenant}x"):
        where = ["--scope", elsewhere]
        assert main([*url, "sessions", "fork", sid, *where]) == EXIT_NOT_FOUND
        assert main([*url, "sessions", "rewind", sid, *where, "--to-seq", "0"]) == EXIT_NOT_FOUND
        assert main([*url, "sessions", "rewind", sid, *where, "--to-seq", "0", "--yes"]) == (
            EXIT_NOT_FOUND
        )
    capsys.readouterr()
    assert main([*url, "sessions", "abort", sid, *scope, "--reason", "done"]) == 0
    assert main([*url, "sessions", "rewind", sid, *scope, "--to-seq", "0", "--yes"]) == (
        EXIT_CONFLICT
    )
    assert "aborted" in capsys.readouterr().err
