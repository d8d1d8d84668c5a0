"""`cortex scope erase | export | import` from the command line, as the application role."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import cortex
from cortex import use_scope
from cortex.cli import EXIT_CONFLICT, EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from tests.conftest import Database
from tests.lifecycle import populate

pytestmark = pytest.mark.citus


def _run(database: Database, action: Any) -> Any:
    async def run() -> Any:
        async with cortex.connect(database.app_url) as store:
            return await action(store)

    return anyio.run(run)


def _sessions(database: Database, path: str) -> int:
    async def count(store: cortex.Store) -> int:
        with use_scope(path):
            return await store.count_sessions()

    return int(_run(database, count))


def _cli(database: Database, *argv: str) -> int:
    return main(["--database-url", database.app_url, "scope", *argv])


def test_erase_asks_and_a_no_erases_nothing(
    database: Database,
    tenant: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = f"{tenant}/u1"
    _run(database, lambda store: populate(store, root))
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert _cli(database, "erase", root) == EXIT_ERROR
    captured = capsys.readouterr()
    assert f"erase everything at and beneath {root} (3 sessions, 14 messages" in captured.err
    assert "nothing erased" in captured.err
    assert _sessions(database, root) == 3
    # End of input declines too.
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert _cli(database, "erase", root) == EXIT_ERROR
    assert _sessions(database, root) == 3

    assert _cli(database, "erase", root, "--dry-run", "--json") == EXIT_OK
    planned = json.loads(capsys.readouterr().out)
    assert (planned["sessions"], planned["dry_run"], planned["receipt"]) == (3, True, None)
    assert _sessions(database, root) == 3

    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    assert _cli(database, "erase", root) == EXIT_OK
    out = capsys.readouterr().out
    assert f"erased from {root}: 3 sessions, 14 messages" in out
    assert "receipt era_" in out
    assert _sessions(database, root) == 0

    assert _cli(database, "erase", root, "--yes", "--json") == EXIT_OK
    again = json.loads(capsys.readouterr().out)
    assert again["sessions"] == 0
    assert again["receipt"]["state"] == "done"


def test_erase_refuses_a_malformed_path(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(database, "erase", "acme//u1", "--yes") == EXIT_USAGE
    assert "cortex: error:" in capsys.readouterr().err


def test_export_then_import_into_another_place(
    database: Database,
    tenant: str,
    other_tenant: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = f"{tenant}/u1"
    _run(database, lambda store: populate(store, root))
    file = tmp_path / "u1.jsonl"
    assert _cli(database, "export", root, "-o", str(file)) == EXIT_OK
    lines = file.read_text().splitlines()
    header, end = json.loads(lines[0]), json.loads(lines[-1])
    assert (header["type"], header["root"], end["type"], end["sessions"]) == (
        "header",
        root,
        "end",
        3,
    )
    assert all(line.isascii() for line in lines)
    capsys.readouterr()
    # To stdout without -o: the same records.
    assert _cli(database, "export", root) == EXIT_OK
    assert [json.loads(x)["type"] for x in capsys.readouterr().out.splitlines()] == [
        json.loads(x)["type"] for x in lines
    ]

    target = f"{other_tenant}/restored"
    assert _cli(database, "import", str(file), "--into", target, "--json") == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert (report["scope"], report["sessions"], report["unchanged"]) == (target, 3, 0)
    assert _sessions(database, target) == 3
    assert _cli(database, "import", str(file), "--into", target) == EXIT_OK
    assert "0 sessions" in capsys.readouterr().out
    # Into the tenant it came from, while the source exists: the ids are taken.
    assert _cli(database, "import", str(file), "--into", f"{tenant}/copy") == EXIT_CONFLICT
    assert _sessions(database, f"{tenant}/copy") == 0
    # Without --into, the export's root: there it is all unchanged.
    assert _cli(database, "import", str(file), "--json") == EXIT_OK
    assert json.loads(capsys.readouterr().out)["sessions"] == 0


def test_import_refuses_a_file_cut_short_or_not_json(
    database: Database, tenant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = f"{tenant}/u1"
    _run(database, lambda store: populate(store, root))
    file = tmp_path / "u1.jsonl"
    assert _cli(database, "export", root, "-o", str(file)) == EXIT_OK
    lines = file.read_text().splitlines()
    target = f"{tenant}/elsewhere"
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n")
    assert _cli(database, "import", str(cut), "--into", target) == EXIT_USAGE
    assert "cut short" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[0] + "\n{not json\n")
    assert _cli(database, "import", str(broken), "--into", target) == EXIT_USAGE
    assert "line 2" in capsys.readouterr().err
    assert _cli(database, "import", str(tmp_path / "missing.jsonl")) == EXIT_USAGE
    assert _sessions(database, target) == 0
