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


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import cortex

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cortex {cortex.__version__}"


def test_python_dash_m_cortex() -> None:
    import subprocess
    import sys

    import cortex

    done = subprocess.run(
        [sys.executable, "-m", "cortex", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cortex {cortex.__version__}"


def test_global_options_before_or_after_the_subcommand() -> None:
    from cortex.cli import build_parser

    parser = build_parser()
    before = parser.parse_args(["--database-url", "postgresql://a/b", "db", "current"])
    after = parser.parse_args(["db", "current", "--database-url", "postgresql://a/b"])
    deep = parser.parse_args(
        ["sessions", "list", "--scope", "t", "--database-url", "postgresql://a/b"]
    )
    neither = parser.parse_args(["db", "current"])
    assert before.database_url == after.database_url == deep.database_url == "postgresql://a/b"
    assert neither.database_url is None


def test_grant_folds_role_names_as_sql_does(capsys: pytest.CaptureFixture[str]) -> None:
    # Unquoted, a name means what it means in SQL (CREATE ROLE Adv_App makes adv_app);
    # quoted, its case is kept.
    assert main(["db", "grant", "Adv_App", "--print-only"]) == 0
    out = capsys.readouterr().out
    assert 'TO "adv_app"' in out
    assert '"Adv_App"' not in out
    assert main(["db", "grant", '"Adv_App"', "--print-only"]) == 0
    assert 'TO "Adv_App"' in capsys.readouterr().out


def test_unknown_revision_is_bad_usage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORTEX_DATABASE_URL", raising=False)
    assert main(["db", "sql", "nosuchrev"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "nosuchrev" in err
    assert err.count("\n") == 1


def test_bad_response_json_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--database-url",
            "postgresql://nobody@127.0.0.1:1/none",
            "sessions",
            "resume",
            "ses_01h455vb4pex5vsknk084sn02q",
            "--scope",
            "t",
            "--interrupt",
            "i1",
            "--response",
            "{not json",
        ]
    )
    assert code == EXIT_USAGE
    assert "--response" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--metadata", "channel"], "is not KEY=JSON"),
        (["--metadata", "channel=web"], "'channel': not JSON"),
        (["--metadata", "a=1", "--metadata", "a=2"], "key 'a' given twice"),
        (["--metadata", "a=NaN"], "metadata"),
        (
            ["--created-after", "2026-12-01T00:00:00"],
            "--created-after: '2026-12-01T00:00:00' has no",
        ),
        (["--updated-before", "2026-12-01"], "--updated-before: '2026-12-01' has no UTC offset"),
        (["--updated-after", "yesterday"], "--updated-after: 'yesterday' is not an ISO 8601"),
        (["--created-before", "2026-13-01T00:00Z"], "--created-before"),
    ],
)
def test_bad_listing_filters_are_bad_usage_before_connecting(
    options: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", "postgresql://nobody@127.0.0.1:1/none"]
    assert main([*url, "sessions", "list", "--scope", "t", *options]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err
    assert err.count("\n") == 1


def test_listing_filters_parse_into_the_list_filter() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from cortex._cli_sessions import _list_filter
    from cortex.cli import build_parser

    args = build_parser().parse_args(
        [
            "sessions",
            "list",
            "--scope",
            "t",
            "--metadata",
            'channel="web"',
            "--metadata",
            'customer={"tier": "gold", "n": [1, 2.0]}',
            "--metadata",
            "=null",
            "--metadata",
            'eq="a=b"',
            "--created-after",
            "2026-12-01T09:30:00+01:00",
            "--updated-before",
            "2026-12-02T00:00:00Z",
        ]
    )
    flt = _list_filter(args)
    assert flt.metadata == {
        "channel": "web",
        "customer": {"tier": "gold", "n": [1, 2.0]},
        "": None,
        "eq": "a=b",
    }
    assert flt.created_after == datetime(2026, 12, 1, 9, 30, tzinfo=timezone(timedelta(hours=1)))
    assert flt.updated_before == datetime(2026, 12, 2, tzinfo=UTC)
    assert flt.created_before is None
    assert flt.updated_after is None
    assert (
        _list_filter(build_parser().parse_args(["sessions", "list", "--scope", "t"])).metadata
        is None
    )
