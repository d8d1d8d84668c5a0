from __future__ import annotations

import json

import pytest

from cortex.cli import EXIT_USAGE, main


def test_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORTEX_DATABASE_URL", raising=False)
    assert main(["db", "bogus"]) == EXIT_USAGE
    assert main(["nothing"]) == EXIT_USAGE
    assert main(["db", "current"]) == EXIT_USAGE  # no database named
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert all(line.startswith("cortex: error: ") for line in err)
    assert "CORTEX_DATABASE_URL" in err[2]


def test_bad_url_driver(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--database-url", "mysql://x/y", "db", "current"]) == EXIT_USAGE
    assert "expected postgresql://" in capsys.readouterr().err


def test_grant_print_only_and_refuses_odd_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "grant", "app_role", "--print-only"]) == 0
    out = capsys.readouterr().out
    for table in ("sessions", "messages", "pending_inputs", "session_markers"):
        assert f'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {table} TO "app_role"' in out
    assert main(["db", "grant", 'x"; DROP TABLE sessions; --', "--print-only"]) == EXIT_USAGE


def test_history_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "history", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["revision"] == "20260801000001"
    assert rows[0]["down_revision"] is None


def test_sql_needs_no_database(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORTEX_DATABASE_URL", raising=False)
    assert main(["db", "sql"]) == 0
    assert "CREATE TABLE sessions" in capsys.readouterr().out
