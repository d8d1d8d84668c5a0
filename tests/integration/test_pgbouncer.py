"""Through PgBouncer in transaction mode: tenants stay isolated, counters stay exact.

Transaction pooling hands each transaction to whichever server connection is
free, so session state must never carry a tenant: cortex binds it with a
transaction-local setting. Needs ``pgbouncer`` on PATH (``.ci/run`` installs
Debian's); skipped where it is missing. It reaches the server as the test's
URL does: on TCP, or on the unix socket of the embedded server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from tests.conftest import Database, on_local_port, server_address

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer_url(database: Database) -> Iterator[str]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        pytest.skip("pgbouncer is not installed")
    host, server_port = server_address(database.app_url)
    folder = Path(tempfile.mkdtemp(prefix="cortex-pgbouncer-"))
    port = _free_port()
    (folder / "users.txt").write_text(f'"{database.app_role}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = 3
max_client_conn = 100
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
    )
    os.chmod(folder, 0o777)
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        # A socket's folder may be private (the embedded server's is its data
        # folder, its service user's alone): then pgbouncer runs as its owner.
        ids = ["--reuid=nobody", "--regid=nogroup"]
        if host.startswith("/"):
            owner = Path(host).stat()
            ids = [f"--reuid={owner.st_uid}", f"--regid={owner.st_gid}"]
        command = ["setpriv", *ids, "--clear-groups", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(50):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"pgbouncer did not start: {proc.stderr.read() if proc.stderr else ''!r}")
        yield on_local_port(database.app_url, port)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(folder, ignore_errors=True)


async def test_transaction_pooling_keeps_tenants_apart(bouncer_url: str) -> None:
    # PgBouncer before 1.21 keeps no prepared statements across transactions.
    async with cortex.connect(
        bouncer_url, pool_size=8, connect_args={"statement_cache_size": 0}
    ) as store:
        tenants = [f"bounce{i}{os.getpid()}" for i in range(6)]
        leaks: list[str] = []

        async def tenant_work(tenant: str) -> None:
            with use_scope(tenant):
                session = await store.create_session("bot", title=tenant)
                for _ in range(15):
                    await store.append_message(session.id, NewMessage("user", tenant))
                    for seen in await store.list_sessions(ListFilter(limit=1000)):
                        if seen.title != tenant:
                            leaks.append(f"{tenant} saw {seen.title}")
                assert (await store.get_session(session.id)).message_count == 15

        async with anyio.create_task_group() as tg:
            for tenant in tenants * 2:
                tg.start_soon(tenant_work, tenant)
        assert leaks == []

    # The server connections PgBouncer reuses carry no tenant afterwards.
    conn = await asyncpg.connect(bouncer_url, statement_cache_size=0)
    try:
        for _ in range(5):
            assert await conn.fetchval("SELECT count(*) FROM sessions") == 0
            assert await conn.fetchval("SELECT current_setting('cortex.tenant', true)") in (
                None,
                "",
            )
    finally:
        await conn.close()
