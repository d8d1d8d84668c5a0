"""Migrations never admit what the API refuses, and never destroy state without being told."""

from __future__ import annotations

import uuid

import pytest

from cortex.cli import EXIT_USAGE, main
from tests.migrations.legacy import (
    current,
    execute,
    fetch,
    insert_legacy,
    plain_owner_database,
)

# Agent ids the legacy release accepted and the API refuses (check_identifier):
# a no-break space, a zero-width space, a control character, a tab.
REFUSED_AGENTS = ["bot\u00a0x", "bot\u200b", "bot\x7f", "bot\tx"]


def test_backfill_leaves_agent_ids_the_api_refuses_alone(blank_db: str) -> None:
    main(["--database-url", blank_db, "db", "upgrade", "20260801000001"])
    rows = [(agent, "acme/u1", "user", f"from {agent!r}") for agent in REFUSED_AGENTS]
    rows += [("bot", "acme/u1", "user", "fine"), ("bot", "acme/bad scope", "user", "no")]
    insert_legacy(blank_db, rows)
    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    sessions = fetch(blank_db, "SELECT agent_id, scope FROM sessions")
    assert [(r["agent_id"], r["scope"]) for r in sessions] == [("bot", "acme/u1")]
    left = fetch(
        blank_db, "SELECT agent_id FROM messages WHERE session_id IS NULL ORDER BY agent_id"
    )
    assert sorted(r["agent_id"] for r in left) == sorted([*REFUSED_AGENTS, "bot"])


def _at_head_with_markers(url: str) -> None:
    assert main(["--database-url", url, "db", "upgrade"]) == 0
    sid = str(uuid.uuid4())
    execute(
        url,
        f"""
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, is_aborted)
        VALUES ('acme', '{sid}', 'bot', 'acme', 1, true);
        INSERT INTO session_markers (tenant_id, session_id, kind, scope, reason, marked_at)
        VALUES ('acme', '{sid}', 'aborted', 'acme', 'customer withdrew', now()),
               ('acme', '{sid}', 'interrupted', 'acme', 'draining', now());
        """,
    )


def test_downgrade_that_drops_markers_refuses_and_says_what(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _at_head_with_markers(blank_db)
    head = current(blank_db)
    capsys.readouterr()
    code = main(["--database-url", blank_db, "db", "downgrade", "20260901000005"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "1 aborted markers" in err
    assert "1 interrupted markers" in err
    assert "--allow-data-loss" in err
    assert err.count("\n") == 1
    # Nothing ran.
    assert current(blank_db) == head
    assert fetch(blank_db, "SELECT count(*) AS n FROM session_markers")[0]["n"] == 2

    assert main(["--database-url", blank_db, "db", "downgrade", "-1"]) == 0  # loses nothing
    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    assert (
        main(
            [
                "--database-url",
                blank_db,
                "db",
                "downgrade",
                "20260901000005",
                "--allow-data-loss",
            ]
        )
        == 0
    )
    assert current(blank_db) == ["20260901000005"]


def test_downgrade_to_base_names_sessions_and_messages(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _at_head_with_markers(blank_db)
    capsys.readouterr()
    assert main(["--database-url", blank_db, "db", "downgrade", "base"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "1 sessions" in err
    assert "markers" in err


def test_downgrade_to_an_unknown_revision_is_a_usage_error(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", blank_db, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--database-url", blank_db, "db", "downgrade", "nonsense"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("cortex: error: revision:")
    assert err.count("\n") == 1


def test_plain_owner_upgrades_and_the_guard_sees_through_row_level_security(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A database owner that is neither superuser nor BYPASSRLS: FORCE ROW LEVEL
    # SECURITY holds it too, so the downgrade guard must not count through the
    # policies (it would see no tenant's rows and let the markers go).
    with plain_owner_database(server_url) as (as_owner, as_super):
        assert main(["--database-url", as_owner, "db", "upgrade", "20260801000001"]) == 0
        insert_legacy(
            as_owner, [("bot", "acme/u1", "user", "hello"), ("bot", "acme/u1", "user", "x")]
        )
        assert main(["--database-url", as_owner, "db", "upgrade"]) == 0
        rows = fetch(as_super, "SELECT message_count, backfilled_by FROM sessions")
        assert [tuple(r) for r in rows] == [(2, "20260824000004")]
        sid = fetch(as_super, "SELECT id FROM sessions")[0]["id"]
        execute(
            as_super,
            "INSERT INTO session_markers (tenant_id, session_id, kind, scope, reason, marked_at) "
            f"VALUES ('acme', '{sid}', 'aborted', 'acme/u1', 'no', now())",
        )
        capsys.readouterr()
        code = main(["--database-url", as_owner, "db", "downgrade", "20260901000005"])
        assert code == EXIT_USAGE
        assert "1 aborted markers" in capsys.readouterr().err
        # The count lifted FORCE only inside a transaction it rolled back.
        forced = fetch(
            as_super,
            "SELECT count(*) AS n FROM pg_class WHERE relforcerowsecurity AND relname IN "
            "('sessions', 'messages', 'pending_inputs', 'session_markers')",
        )
        assert forced[0]["n"] == 4
        # The catch-up backfill refuses a role held to row-level security.
        assert main(["--database-url", as_owner, "db", "backfill"]) == EXIT_USAGE
