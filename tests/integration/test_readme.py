"""The README's newcomer path runs as written, block by block, on a database it creates itself.

Each block the README marks with ``<!-- readme-test: NAME -->`` is executed:
the SQL that creates the owner role, the database and the application role;
the shell lines that migrate and grant (as the owner, who is not a
superuser); the Python quick start (write, read the newest N, search, as the
application role); the operator's loop on the command line; and the FastAPI
app. Only names and URLs are substituted.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import cortex
from cortex import NewMessage, RequestedInput, use_scope
from cortex._db.engine import driver_dsn
from tests.conftest import admin

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def block(name: str) -> str:
    found = re.search(rf"<!-- readme-test: {name} -->\n```\w*\n(.*?)```", README, re.S)
    assert found is not None, f"README block {name!r} is missing"
    return found.group(1)


def test_install_line_names_the_real_distribution() -> None:
    import tomllib

    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    # Not published yet: the command to run installs from the checkout, and
    # the published form names the real distribution.
    assert "pip install '.[embedded]'" in block("install")
    assert f"# once it is published: pip install '{name}[embedded]'" in block("install")


def test_the_routine_counts_are_this_release_s() -> None:
    from cortex._db.routines import wanted_count

    plain, citus = wanted_count(False), wanted_count(True)
    assert f"routines: {citus} of this cortex's {citus} hot statements" in README
    assert f"{plain} shapes, {citus} on Citus" in README


@pytest.fixture(scope="module")
def newcomer(server_url: str) -> Iterator[dict[str, str]]:
    """The README's roles and database, under unique names; yields the two URLs."""
    suffix = uuid.uuid4().hex[:8]
    owner, app, db = f"cortex_owner_{suffix}", f"app_service_{suffix}", f"app_{suffix}"
    sql = (
        block("roles")
        .replace("app_service", app)
        .replace("cortex_owner", owner)
        .replace("DATABASE app ", f"DATABASE {db} ")
    )
    statements = [s.strip() for s in sql.split(";") if s.strip()]
    assert len(statements) == 3
    asyncio.run(admin(server_url, *statements))  # as a superuser, as the README says
    try:
        yield {
            "owner": driver_dsn(server_url, database=db, user=owner),
            "app": driver_dsn(server_url, database=db, user=app),
            "app_role": app,
            "owner_role": owner,
        }
    finally:
        asyncio.run(
            admin(
                server_url,
                f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)',
                f'DROP ROLE IF EXISTS "{app}"',
                f'DROP ROLE IF EXISTS "{owner}"',
            )
        )


def _sh(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        check=False,
    )


def _migrate(newcomer: dict[str, str]) -> None:
    script = block("migrate").replace("cortex_owner", newcomer["owner_role"])
    script = script.replace("app_service", newcomer["app_role"])
    script = re.sub(r"(export CORTEX_DATABASE_URL=)\S+", r"\1" + newcomer["owner"], script)
    done = _sh(script, {})
    assert done.returncode == 0, done.stderr
    assert f"granted {newcomer['app_role']}" in done.stdout


def _run_python(code: str, tmp_path: Path, name: str) -> list[str]:
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_newcomer_path(newcomer: dict[str, str], tmp_path: Path) -> None:
    _migrate(newcomer)

    # The quick start, as the application role (row-level security applies).
    code = block("quick-start").replace(
        "postgresql://app_service:change-me@db.example/app", newcomer["app"]
    )
    # The last line demonstrates the error: make it assert that instead of dying.
    code, replaced = re.subn(
        r"( +)await store\.get_session\(session\.id\) +# raises cortex\.NotFound.*",
        r"\1try:\n\1    await store.get_session(session.id)\n"
        r"\1except cortex.NotFound:\n\1    print('isolated')",
        code,
    )
    assert replaced == 1
    assert _run_python(code, tmp_path, "quick_start") == [
        "2 Let me check.",
        "['My invoice is wrong', 'Let me check.']",
        "[]",
        "2 ['Let me check.']",
        "1 Invoice dispute",
        "0",
        "isolated",
    ]

    # The operator's loop from the command line, on a session that asks a human.
    async def paused() -> str:
        async with cortex.connect(newcomer["app"]) as store:
            with use_scope("acme/billing/user-7"):
                session = await store.resolve_session("billing-bot")
                await store.append_message(
                    session.id,
                    NewMessage(
                        "assistant",
                        "A refund over $100 needs a human.",
                        requested_input=RequestedInput(
                            interrupt_id="approve-refund",
                            message="Approve a $140 refund?",
                            response_schema={
                                "type": "object",
                                "properties": {"approved": {"type": "boolean"}},
                                "required": ["approved"],
                            },
                        ),
                    ),
                )
                return session.id

    sid = anyio.run(paused)
    done = _sh(
        f"cd {tmp_path}\n" + block("cli"), {"SID": sid, "CORTEX_DATABASE_URL": newcomer["app"]}
    )
    assert done.returncode == 0, done.stderr
    assert "paused" in done.stdout
    assert '"total": 1' in done.stdout  # the search finds the paused session
    assert "Approve a $140 refund?" in done.stdout
    assert "resumed" in done.stdout
    transcript = json.loads((tmp_path / "transcript.json").read_text())
    assert [m["seq"] for m in transcript["messages"]] == [1, 2]


def test_fastapi_block(newcomer: dict[str, str], tmp_path: Path) -> None:
    _migrate(newcomer)
    code = block("fastapi").replace(
        "postgresql://app_service:change-me@db.example/app", newcomer["app"]
    )
    namespace: dict[str, Any] = {}
    exec(compile(code, "README-fastapi", "exec"), namespace)
    app = namespace["app"]

    async def drive() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                headers = {"x-tenant-scope": "acme/support/user-42"}
                said = await client.post(
                    "/agents/support-bot/messages", json={"text": "hi"}, headers=headers
                )
                assert said.status_code == 200, said.text
                heard = await client.get("/agents/support-bot/messages", headers=headers)
                assert heard.json()[-1]["content"] == "hi"
                foreign = await client.get(
                    f"/sessions/{said.json()['session_id']}", headers={"x-tenant-scope": "globex"}
                )
                assert foreign.status_code == 404
                assert (await client.get("/agents/support-bot/messages")).status_code == 401

    anyio.run(drive)
