from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from cortex._db.engine import SCHEMA_REVISION
from cortex._db.routines import wanted_count
from cortex.cli import EXIT_CONFLICT, EXIT_NOT_FOUND, EXIT_SCHEMA, EXIT_UNAVAILABLE, main
from tests.conftest import Database, current_at_head, with_database


def _typo(url: str) -> str:
    name = make_url(url).database
    return with_database(url, f"{name}x")


def test_upgrade_current_downgrade(blank_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--database-url", blank_db, "db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is False
    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    assert SCHEMA_REVISION in capsys.readouterr().out
    assert main(["--database-url", blank_db, "db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == current_at_head()
    assert main(["--database-url", blank_db, "db", "current"]) == 0
    out = capsys.readouterr().out
    assert "not distributed (plain PostgreSQL)" in out
    assert f"routines: {wanted_count()} of" in out
    assert main(["--database-url", blank_db, "db", "downgrade", "20260824000003"]) == 0
    assert "20260824000003" in capsys.readouterr().out
    # Below the head this code's statements may not fit: no routine is left.
    assert main(["--database-url", blank_db, "db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["routines"] == 0


def test_typo_in_database_name_is_an_error(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = _typo(blank_db)
    assert main(["--database-url", typo, "db", "upgrade"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "does not exist" in err
    assert "Traceback" not in err


def test_console_script_runs_without_traceback(blank_db: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cortex.cli", "--database-url", _typo(blank_db), "db", "current"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == EXIT_UNAVAILABLE
    assert done.stderr.strip().startswith("cortex: error:")
    assert "Traceback" not in done.stderr


def test_store_on_old_schema_says_upgrade(blank_db: str) -> None:
    import cortex

    main(["--database-url", blank_db, "db", "upgrade", "20260824000003"])

    async def open_store() -> None:
        async with cortex.connect(blank_db):
            pass

    with pytest.raises(cortex.SchemaMismatch, match="cortex db upgrade"):
        asyncio.run(open_store())
    assert EXIT_SCHEMA == 5


def test_sessions_commands(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import anyio

    import cortex
    from cortex import NewMessage, RequestedInput, use_scope

    async def seed() -> str:
        async with cortex.connect(database.app_url) as store:
            with use_scope(f"{tenant}/support/u1"):
                s = await store.create_session("bot", title="Refund 42")
                await store.append_message(
                    s.id,
                    NewMessage(
                        "assistant",
                        "need approval",
                        requested_input=RequestedInput(
                            interrupt_id="approve-1",
                            message="Approve refund?",
                            response_schema={"type": "object", "required": ["ok"]},
                        ),
                    ),
                )
                await store.create_session("bot", title="Other")
                return s.id

    sid = anyio.run(seed)
    url = ["--database-url", database.owner_url]
    assert main([*url, "sessions", "list", "--scope", tenant, "--state", "paused", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["total"] == 1
    assert listed["sessions"][0]["id"] == sid
    assert listed["sessions"][0]["pending_count"] == 1
    assert main([*url, "sessions", "list", "--scope", tenant]) == 0
    table = capsys.readouterr().out
    assert "paused" in table
    assert "idle" in table
    assert main([*url, "sessions", "show", sid, "--scope", tenant]) == 0
    shown = capsys.readouterr().out
    assert "pending approve-1" in shown
    assert '"required"' in shown
    assert main([*url, "sessions", "show", sid, "--scope", f"{tenant}-x"]) == EXIT_NOT_FOUND
    assert main([*url, "sessions", "abort", sid, "--scope", tenant, "--reason", "withdrawn"]) == 0
    assert (
        main([*url, "sessions", "abort", sid, "--scope", tenant, "--reason", "again"])
        == EXIT_CONFLICT
    )
    assert main([*url, "sessions", "show", sid, "--scope", tenant, "--json"]) == 0
    out = capsys.readouterr().out
    detail = json.loads(out[out.index("{") :])
    assert detail["state"] == "aborted"
    assert detail["pending"] == []
    assert detail["abort_reason"] == "withdrawn"
    assert main([*url, "sessions", "list", "--scope", "bad scope"]) == 2
    assert main([*url, "sessions", "list", "--scope", tenant, "--limit", "5000"]) == 2


def test_upgrade_says_when_whole_tenant_search_will_scan(
    server_url: str, blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.migrations.legacy import plain_owner_database

    # A superuser owner: the search function runs inside the indexes, nothing to say.
    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    assert "note" not in capsys.readouterr().err
    # The README's plain owner: correct, but the user should know it scans.
    with plain_owner_database(server_url) as (owner_url, _):
        assert main(["--database-url", owner_url, "db", "upgrade"]) == 0
        captured = capsys.readouterr()
        assert SCHEMA_REVISION in captured.out
        assert "a whole-tenant search stays correct but scans" in captured.err
        assert "cortex_owner_" in captured.err


def test_an_interrupted_downgrade_is_named_until_it_is_run_again(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.migrations.legacy import execute, fetch

    before = "20261202000017"
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade"]) == 0
    capsys.readouterr()
    # What a downgrade from …18 killed after its build leaves: the full title
    # index beside the partial one, the database still at …18. An upgrade
    # finds nothing to do, and the index would be written on every append.
    execute(
        blank_db,
        "CREATE INDEX ix_sessions_tenant_title_trgm_next ON sessions"
        " USING gin (tenant_id, title gin_trgm_ops)",
    )
    assert main([*url, "db", "upgrade"]) == 0
    err = capsys.readouterr().err
    assert "index ix_sessions_tenant_title_trgm_next is left by an interrupted migration" in err
    assert main([*url, "db", "current", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["leftover_indexes"] == ["ix_sessions_tenant_title_trgm_next"]
    assert main([*url, "db", "current"]) == 0
    assert "left by an interrupted migration: ix_sessions_tenant_title_trgm_next" in (
        capsys.readouterr().out
    )
    # Run again, the downgrade finishes with the index it had built.
    assert main([*url, "db", "downgrade", before]) == 0
    assert "interrupted" not in capsys.readouterr().err
    definition = fetch(
        blank_db, "SELECT pg_get_indexdef('ix_sessions_tenant_title_trgm'::regclass) AS d"
    )[0]["d"]
    assert "WHERE" not in definition


def test_check_gates_a_deploy_on_the_revision(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade", "20261205000025"]) == 0
    capsys.readouterr()
    assert main([*url, "db", "check"]) == 1
    out = capsys.readouterr().out
    assert "1 revision(s) pending (20261205000026)" in out
    assert main([*url, "db", "check", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {
        "revision": "20261205000025",
        "expected": SCHEMA_REVISION,
        "serves_this_code": False,
        "pending": ["20261205000026"],
    }
    assert main([*url, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main([*url, "db", "check"]) == 0
    assert "serves this cortex" in capsys.readouterr().out


def test_every_db_command_answers_in_json(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade", "20261205000020", "--json"]) == 0
    upgraded = json.loads(capsys.readouterr().out)
    assert [step["revision"] for step in upgraded["applied"]][-2:] == [
        "20261204000019",
        "20261205000020",
    ]
    assert all(step["seconds"] >= 0 and step["title"] for step in upgraded["applied"])
    assert upgraded["revision"] == "20261205000020"
    assert main([*url, "db", "upgrade", "--json"]) == 0
    assert [s["revision"] for s in json.loads(capsys.readouterr().out)["applied"]] == [
        "20261205000021",
        "20261205000022",
        "20261205000023",
        "20261205000024",
        "20261205000025",
        SCHEMA_REVISION,
    ]
    assert main([*url, "db", "upgrade", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["applied"] == []
    assert main([*url, "db", "downgrade", "-1", "--json"]) == 0
    undone = json.loads(capsys.readouterr().out)
    assert [(s["revision"], s["to"]) for s in undone["undone"]] == [
        (SCHEMA_REVISION, "20261205000025")
    ]
    assert main([*url, "db", "upgrade"]) == 0
    out = capsys.readouterr().out
    assert f"applied {SCHEMA_REVISION} in " in out
    assert main([*url, "db", "backfill", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["moved"] == 0
    assert main([*url, "db", "grant", "app_json_role", "--print-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["statements"]


def test_an_upgrade_without_work_says_so_and_no_notes(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", blank_db]
    assert main([*url, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main([*url, "db", "upgrade"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"database is at {SCHEMA_REVISION} (nothing to do)"
    assert "0/0" not in captured.err
    assert "note:" not in captured.err


def test_a_closed_pipe_ends_the_command_quietly(blank_db: str) -> None:
    import os
    import subprocess
    import sys

    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    for command in (["db", "history"], ["db", "current"], ["db", "current", "--json"]):
        # The reader is gone before the first write (`| grep -q` that matched early).
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "cortex", "--database-url", blank_db, *command],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        finally:
            os.close(write)
        assert done.stderr == "", done.stderr
        assert done.returncode == 141


def test_an_upgrade_as_the_application_role_names_the_owner(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", database.app_url, "db", "downgrade", "-1"]) != 0
    err = capsys.readouterr().err
    assert "does not own cortex's tables" in err, err
    assert "42501" not in err
