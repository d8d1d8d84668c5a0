"""`cortex serve` and `cortex token issue` as processes; /readyz against a database that is not ready."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import jwt
import pytest

from cortex.server import create_app
from tests.conftest import Database, admin, asyncpg_dsn, create_database, drop_database
from tests.serving import free_port, running

BIN = Path(sys.executable).parent / "cortex"
KEY = secrets.token_urlsafe(32)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CORTEX_SIGNING_KEY",)}
    env.update(extra)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def test_serve_refuses_without_a_key(database: Database) -> None:
    done = subprocess.run(
        [str(BIN), "serve", "--port", str(free_port())],
        env=_env(CORTEX_DATABASE_URL=database.app_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "CORTEX_SIGNING_KEY" in done.stderr
    assert "secrets.token_urlsafe(32)" in done.stderr
    short = subprocess.run(
        [str(BIN), "serve"],
        env=_env(CORTEX_DATABASE_URL=database.app_url, CORTEX_SIGNING_KEY="short"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert short.returncode == 2
    assert "fewer than 32" in short.stderr


def test_token_issue_verifies() -> None:
    done = subprocess.run(
        [
            str(BIN),
            "token",
            "issue",
            "--scope",
            "acme/support",
            "--role",
            "operator",
            "--ttl",
            "60",
        ],
        env=_env(CORTEX_SIGNING_KEY=KEY),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    claims = jwt.decode(
        done.stdout.strip(), KEY, algorithms=["HS256"], options={"require": ["exp"]}
    )
    assert claims["scope"] == "acme/support"
    assert claims["role"] == "operator"
    assert 0 < claims["exp"] - time.time() <= 60


async def _wait_for_lock(owner_url: str, role: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(owner_url))
    try:
        for _ in range(300):
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'",
                role,
            )
            if waiting:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the request never waited on the lock")
    finally:
        await conn.close()


def _serve(database: Database, port: int, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), *flags],
        env=_env(CORTEX_DATABASE_URL=database.app_url, CORTEX_SIGNING_KEY=KEY),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def test_sigterm_lets_a_request_in_flight_finish(database: Database, tenant: str) -> None:
    port = free_port()
    server = _serve(database, port)
    try:
        base = f"http://127.0.0.1:{port}"
        token = jwt.encode(
            {"sub": "t", "scope": tenant, "role": "app", "exp": int(time.time()) + 600},
            KEY,
            algorithm="HS256",
        )
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as c:
            for _ in range(300):
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            sid = (await c.post("/v1/sessions", json={"agent_id": "bot"})).json()["id"]
            holder = await asyncpg.connect(asyncpg_dsn(database.owner_url))
            try:
                tx = holder.transaction()
                await tx.start()
                await holder.execute(
                    "SELECT 1 FROM sessions WHERE tenant_id = $1 FOR UPDATE", tenant
                )
                in_flight = asyncio.ensure_future(
                    c.patch(f"/v1/sessions/{sid}", json={"title": "finished"})
                )
                await _wait_for_lock(database.owner_url, database.app_role)
                server.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.5)
                assert server.poll() is None, "the server left before its request finished"
                await tx.rollback()
            finally:
                await holder.close()
            response = await in_flight
        assert response.status_code == 200, response.text
        assert response.json()["title"] == "finished"
        # uvicorn re-raises the signal it handled once it has shut down.
        assert server.wait(timeout=30) in (0, -signal.SIGTERM)
        assert server.stdout is not None
        assert b"Waiting for application shutdown" in server.stdout.read()
        server.stdout.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None and not server.stdout.closed:
            server.stdout.close()


@pytest.fixture
def own_database(server_url: str) -> Iterator[Database]:
    db = create_database(server_url)
    yield db
    drop_database(server_url, db)


async def test_readyz_is_503_behind_the_revision_or_unreachable(own_database: Database) -> None:
    with running(create_app(own_database.app_url, signing_key=KEY)) as url:
        async with httpx.AsyncClient(base_url=url) as c:
            assert (await c.get("/readyz")).status_code == 200
            await admin(
                own_database.owner_url, "UPDATE alembic_version SET version_num = '20261101000001'"
            )
            behind = await c.get("/readyz")
            assert behind.status_code == 503
            assert behind.json()["title"] == "SchemaMismatch"
            assert (await c.get("/healthz")).status_code == 200
    with running(create_app("postgresql://nobody@127.0.0.1:1/none", signing_key=KEY)) as url:
        async with httpx.AsyncClient(base_url=url) as c:
            down = await c.get("/readyz")
            assert down.status_code == 503
            assert down.json()["title"] == "DatabaseUnavailable"
            assert (await c.get("/healthz")).status_code == 200


async def _started(c: httpx.AsyncClient) -> None:
    for _ in range(300):
        try:
            if (await c.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            await asyncio.sleep(0.1)
    raise AssertionError("cortex serve did not start")


async def _serve_once(database: Database, *flags: str) -> tuple[httpx.Response, str]:
    """Start `cortex serve` with ``flags``, ask for /healthz and /metrics, stop it: what it printed."""
    port = free_port()
    server = _serve(database, port, *flags)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            await _started(c)
            metrics = await c.get("/metrics")
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        assert server.stdout is not None
        printed = server.stdout.read().decode()
        server.stdout.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return metrics, printed


async def test_serve_has_metrics_and_no_access_log_by_default(database: Database) -> None:
    metrics, printed = await _serve_once(database)
    assert metrics.status_code == 200
    assert "cortex_http_requests_total" in metrics.text
    assert '"route"' not in printed


async def test_serve_no_metrics_and_access_log(database: Database) -> None:
    metrics, printed = await _serve_once(database, "--no-metrics", "--access-log")
    assert metrics.status_code == 404
    lines = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    assert any(line["route"] == "/healthz" and line["status"] == 200 for line in lines)
