"""Start or stop a throwaway Citus cluster for the Citus test lane: a coordinator and two workers.

Usage::

    python -m tests.citus_cluster start [--dir DIR]   # prints the CORTEX_TEST_CITUS URL
    python -m tests.citus_cluster stop  [--dir DIR]
    python -m tests.citus_cluster available           # exit 0 if Citus is installed

It assumes Citus is already *installed* into the PostgreSQL found by
``pg_config`` (``citus.so`` in its package library directory); it never
builds or fetches anything. Each node is an ``initdb`` cluster with
``shared_preload_libraries = 'citus'`` and trust authentication on
127.0.0.1, on ports 9700 (coordinator), 9701 and 9702 (workers), in a
temporary folder. Nothing is registered here: the test configuration
(``tests/conftest.py``) makes each throwaway database on all three nodes,
creates the extension in it and adds the workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

PORTS: Final = (9700, 9701, 9702)
DEFAULT_DIR: Final = Path(tempfile.gettempdir()) / "cortex-citus-cluster"


def _bindir() -> Path:
    """PostgreSQL's bin folder: ``CORTEX_PG_BINDIR``, else ``pg_config --bindir`` (15 preferred)."""
    if env := os.environ.get("CORTEX_PG_BINDIR"):
        return Path(env)
    for pg_config in ("/usr/lib/postgresql/15/bin/pg_config", "pg_config"):
        found = shutil.which(pg_config) or (pg_config if Path(pg_config).is_file() else None)
        if found:
            out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=True)
            return Path(out.stdout.strip())
    raise SystemExit("no pg_config: install PostgreSQL's server package")


def citus_installed() -> bool:
    """Whether citus.so is in the library folder of the PostgreSQL ``_bindir`` belongs to."""
    pg_config = _bindir() / "pg_config"
    if not pg_config.is_file():
        return False
    out = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True)
    return out.returncode == 0 and (Path(out.stdout.strip()) / "citus.so").is_file()


def _as_owner(argv: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root: run them as the postgres user.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _node_dir(base: Path, port: int) -> Path:
    return base / f"node{port}"


def start(base: Path) -> str:
    """Create (first time) and start the three nodes; return the coordinator URL."""
    if not citus_installed():
        raise SystemExit("Citus is not installed into this PostgreSQL")
    bindir = _bindir()
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    for port in PORTS:
        data = _node_dir(base, port)
        if not (data / "PG_VERSION").is_file():
            subprocess.run(
                _as_owner(
                    [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
                ),
                check=True,
                stdout=subprocess.DEVNULL,
            )
            with (data / "postgresql.conf").open("a") as conf:
                conf.write(
                    "shared_preload_libraries = 'citus'\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"port = {port}\n"
                    f"unix_socket_directories = '{base}'\n"
                    "max_connections = 300\n"
                    "shared_buffers = 64MB\n"
                    "fsync = off\n"
                    "synchronous_commit = off\n"
                    "full_page_writes = off\n"
                    # Throwaway databases come and go with each test run.
                    "citus.enable_statistics_collection = off\n"
                )
        if (
            subprocess.run(
                _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "status"]),
                stdout=subprocess.DEVNULL,
            ).returncode
            != 0
        ):
            subprocess.run(
                _as_owner(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(data / "log"),
                        "-w",
                        "start",
                    ]
                ),
                check=True,
                stdout=subprocess.DEVNULL,
            )
    for port in PORTS:
        for _ in range(50):
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"]
            )
            if ready.returncode == 0:
                break
            time.sleep(0.2)
    return f"postgresql://postgres@127.0.0.1:{PORTS[0]}/postgres"


def stop(base: Path, *, remove: bool = True) -> None:
    """Stop the nodes (fast shutdown) and delete the folder."""
    bindir = _bindir()
    for port in PORTS:
        data = _node_dir(base, port)
        if (data / "PG_VERSION").is_file():
            subprocess.run(
                _as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
    if remove:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.citus_cluster", description=__doc__)
    parser.add_argument("command", choices=("start", "stop", "available"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--keep", action="store_true", help="stop without deleting the folder")
    args = parser.parse_args(argv)
    if args.command == "available":
        return 0 if citus_installed() else 1
    if args.command == "start":
        print(start(args.dir))
    else:
        stop(args.dir, remove=not args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
