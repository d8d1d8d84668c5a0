"""The README's newcomer path runs as written, block by block, on a database it creates itself.

Each block the README marks with ``<!-- readme-test: NAME -->`` is executed:
the SQL that creates the owner role, the database and the application role;
the shell lines that migrate and grant (as the owner, who is not a
superuser); the Python quick start (write, read the newest N, search, as the
application role); the operator's loop on the command line; the FastAPI
app; and the Google ADK and OpenAI Agents SDK snippets. The guides' blocks
marked ``<!-- docs-test: NAME -->`` that need a database run here too (the
others, and the copies of README blocks, are checked by
tests/unit/test_docs.py). Only names and URLs are substituted.
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
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
# The application role's URL as every Python block spells it.
APP_URL = "postgresql://app_service:change-me@localhost/app"


def block(name: str, text: str = README) -> str:
    found = re.search(rf"<!-- (?:readme|docs)-test: {name} -->\n```\w*\n(.*?)```", text, re.S)
    assert found is not None, f"block {name!r} is missing"
    return found.group(1)


def docs_block(page: str, name: str) -> str:
    return block(name, (DOCS / page).read_text())


def test_install_lines_are_truthful() -> None:
    import tomllib

    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    wheel = f"{name.replace('-', '_')}-{cortex.__version__}-py3-none-any.whl"
    lines = block("install")
    # Not published yet: the commands to run install from the checkout or
    # from a wheel built from it; the published form names the real distribution.
    assert 'pip install -e ".[embedded]"' in lines
    assert "python -m build" in lines
    assert f'pip install "dist/{wheel}[embedded]"' in lines
    assert f'# once it is published: pip install "{name}[embedded]"' in lines
    assert "the distribution named `cortex` there is an unrelated" in README


def test_the_routine_counts_are_this_release_s() -> None:
    from cortex._db.routines import wanted_count

    plain, citus = wanted_count(False), wanted_count(True)
    citus_page = (DOCS / "deployment" / "citus.md").read_text()
    fast_page = (DOCS / "design" / "performance.md").read_text()
    assert f"routines: {citus} of this cortex's {citus} hot statements" in citus_page
    assert f"{plain} shapes, {citus} on Citus" in fast_page


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


@pytest.fixture(scope="module")
def migrated(newcomer: dict[str, str]) -> dict[str, str]:
    """The README's migrate block, run once as the owner; the newcomer's names and URLs."""
    script = block("migrate").replace("cortex_owner", newcomer["owner_role"])
    script = script.replace("app_service", newcomer["app_role"])
    script = re.sub(r"(export CORTEX_DATABASE_URL=)\S+", r"\1" + newcomer["owner"], script)
    done = _sh(script, {})
    assert done.returncode == 0, done.stderr
    assert f"granted {newcomer['app_role']}" in done.stdout
    return newcomer


def _run_python(code: str, tmp_path: Path, name: str, app_url: str) -> list[str]:
    """Run a Python block as a script, on the newcomer's database; its stdout lines."""
    assert APP_URL in code, f"{name}: the block does not connect as the README's application role"
    script = tmp_path / f"{name}.py"
    script.write_text(code.replace(APP_URL, app_url))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_newcomer_path(migrated: dict[str, str], tmp_path: Path) -> None:
    newcomer = migrated
    # The quick start, as the application role (row-level security applies).
    code = block("quick-start")
    # The last line demonstrates the error: make it assert that instead of dying.
    code, replaced = re.subn(
        r"( +)await store\.get_session\(session\.id\) +# raises cortex\.NotFound.*",
        r"\1try:\n\1    await store.get_session(session.id)\n"
        r"\1except cortex.NotFound:\n\1    print('isolated')",
        code,
    )
    assert replaced == 1
    assert _run_python(code, tmp_path, "quick_start", newcomer["app"]) == [
        "2 Let me check.",
        "['My invoice is wrong', 'Let me check.']",
        "1 Invoice dispute",
        "0",
        "['Invoice dispute']",
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
    script = block("cli")
    assert f"export CORTEX_DATABASE_URL={APP_URL}\n" in script  # the operator is the app role
    done = _sh(f"cd {tmp_path}\n" + script.replace(APP_URL, newcomer["app"]), {"SID": sid})
    assert done.returncode == 0, done.stderr
    assert "paused" in done.stdout
    assert '"total": 1' in done.stdout  # the search finds the paused session
    assert "Approve a $140 refund?" in done.stdout
    assert "resumed" in done.stdout
    transcript = json.loads((tmp_path / "transcript.json").read_text())
    assert [m["seq"] for m in transcript["messages"]] == [1, 2]


def test_fastapi_block(migrated: dict[str, str]) -> None:
    code = block("fastapi")
    assert APP_URL in code
    code = code.replace(APP_URL, migrated["app"])
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
                sid = said.json()["session_id"]
                heard = await client.get(f"/sessions/{sid}", headers=headers)
                assert heard.json()["last_message"] == "hi"
                foreign = await client.get(f"/sessions/{sid}", headers={"x-tenant-scope": "globex"})
                assert foreign.status_code == 404
                assert (await client.get(f"/sessions/{sid}")).status_code == 401

    anyio.run(drive)


def test_adk_block(migrated: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("google.adk")
    lines = _run_python(block("adk"), tmp_path, "adk_block", migrated["app"])
    assert lines == ["You said: hello", "2"]


def test_openai_agents_block(migrated: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("agents")
    lines = _run_python(block("openai-agents"), tmp_path, "openai_agents_block", migrated["app"])
    assert lines == ["San Francisco.", "2"]


def test_guide_messages_and_state(migrated: dict[str, str], tmp_path: Path) -> None:
    code = docs_block("guides/messages-and-state.md", "messages-and-state")
    assert _run_python(code, tmp_path, "messages_and_state", migrated["app"]) == [
        "2 {'step': 'done', 'open_refunds': 3}",
        "[None, {'type': 'message', 'id': 7}]",
        "Refund sent.",
        "0 done",
    ]


def test_guide_fork_and_rewind(migrated: dict[str, str], tmp_path: Path) -> None:
    code = docs_block("guides/messages-and-state.md", "fork-and-rewind")
    assert _run_python(code, tmp_path, "fork_and_rewind", migrated["app"]) == [
        "2 1 2",
        "2 paused",
        "3",
        "False",
    ]


def test_guide_scope_lifecycle(migrated: dict[str, str], tmp_path: Path) -> None:
    code = docs_block("guides/scope-lifecycle.md", "scope-lifecycle")
    assert _run_python(code, tmp_path, "scope_lifecycle", migrated["app"]) == [
        "header 1 1",
        "1 1 done",
        "acme/eu/user-42 1",
        "acme/eu/archive/user-42 1 1",
        "0 2",
    ]


def test_guide_retention(migrated: dict[str, str], tmp_path: Path) -> None:
    code = docs_block("guides/scope-lifecycle.md", "retention")
    assert _run_python(code, tmp_path, "retention", migrated["app"]) == [
        "4 90",
        "6 6 0",
        "[7, 8, 9, 10] 4 6",
        "11",
    ]


def test_guide_operators(migrated: dict[str, str], tmp_path: Path) -> None:
    code = docs_block("guides/operators.md", "operators")
    assert _run_python(code, tmp_path, "operators", migrated["app"]) == [
        "paused ['Approve a $140 refund?']",
        'response: at approved: "yes" is not of type "boolean"',
        "0",
        "interrupted",
        "aborted",
    ]
