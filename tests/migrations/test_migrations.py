"""Alembic history: shape, round trips, drift, the backfill, concurrency, offline SQL."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

import cortex
from alembic import command
from cortex import NewMessage, use_scope
from cortex._db.engine import SCHEMA_REVISION
from cortex._revision_helpers import backfill_v1
from cortex.cli import main
from cortex.migrate import alembic_config, downgrade, grant_sql, upgrade
from tests.conftest import admin, asyncpg_dsn, with_database
from tests.migrations.legacy import current, execute, fetch

BACKFILL = "20260824000004"


def test_history_shape() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    heads = script.get_heads()
    assert heads == [SCHEMA_REVISION]
    revisions = list(script.walk_revisions())
    assert [r.revision for r in reversed(revisions)][:4] == [
        "20260801000001",
        "20260824000002",
        "20260824000003",
        BACKFILL,
    ]
    for rev in revisions:
        assert re.fullmatch(r"\d{14}", rev.revision), rev.revision
        assert rev.module.__doc__, rev.revision
        assert "Why it exists" in rev.module.__doc__, rev.revision


def test_round_trip_and_no_drift(blank_db: str) -> None:
    upgrade(blank_db)
    assert current(blank_db) == [SCHEMA_REVISION]
    command.check(alembic_config(blank_db))  # raises on drift between _tables and the migrations
    downgrade(blank_db, "base")
    assert current(blank_db) == []
    tables = {
        r["tablename"]
        for r in fetch(blank_db, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert tables == {"alembic_version"}
    upgrade(blank_db)
    assert current(blank_db) == [SCHEMA_REVISION]
    command.check(alembic_config(blank_db))


def test_concurrent_upgrades_both_succeed(blank_db: str) -> None:
    # Two deploy jobs are two processes (Alembic's context proxy is process-global).
    code = "import sys; from cortex.migrate import upgrade; upgrade(sys.argv[1])"
    jobs = [
        subprocess.Popen([sys.executable, "-c", code, blank_db], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [job.communicate(timeout=180)[1] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs
    assert current(blank_db) == [SCHEMA_REVISION]
    # One of them ran the revisions; the other waited on the lock and found nothing to do.
    assert sum("Running upgrade" in out for out in outputs) <= 1


def test_offline_sql_for_review() -> None:
    buffer = io.StringIO()
    config = alembic_config("postgresql://u@localhost/db")
    config.stdout = buffer
    with contextlib.redirect_stdout(buffer):
        command.upgrade(config, "head", sql=True)
    sql = buffer.getvalue()
    assert "CREATE TABLE messages" in sql
    assert "CREATE TABLE sessions" in sql
    assert "uq_sessions_default" in sql
    assert "backfilled_by" in sql
    assert "'20260824000004'" in sql
    assert "FORCE ROW LEVEL SECURITY" in sql


# --- the backfill -------------------------------------------------------------

T0 = datetime(2026, 7, 1, tzinfo=UTC)


def _legacy(url: str, rows: list[tuple[str, str, str, str, int]]) -> None:
    """Insert legacy messages: (agent_id, scope, role, content, minutes after T0)."""

    async def run() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await conn.executemany(
                "INSERT INTO messages (id, agent_id, scope, role, content, created_at) "
                "VALUES (gen_random_uuid(), $1, $2, $3, $4, $5)",
                [(a, s, r, c, T0 + timedelta(minutes=m)) for a, s, r, c, m in rows],
            )
        finally:
            await conn.close()

    asyncio.run(run())


LEGACY = [
    # tenant acme, depth 3: two agents, out-of-order inserts (seq must follow created_at)
    ("bot", "acme/support/u1", "user", "hello", 1),
    ("bot", "acme/support/u1", "assistant", "hi there", 2),
    ("bot", "acme/support/u1", "user", "bye", 5),
    ("bot", "acme/support/u1", "user", "in between", 3),
    ("helper", "acme/support/u1", "user", "other agent", 4),
    # depth 1 and a look-alike tenant
    ("bot", "acme", "user", "tenant-level", 1),
    ("bot", "acme-corp", "user", "not acme", 1),
    # another tenant, depth 2, long content (preview is bounded)
    ("bot", "globex/team", "user", "x" * 1000, 1),
    # the conversation whose default already exists
    ("bot", "initech/u9", "user", "legacy one", 1),
    ("bot", "initech/u9", "user", "legacy two", 2),
    # outside cortex's grammar: stays unsessioned
    ("bot", "bad scope/with space", "user", "skip me", 1),
    ("has space", "acme/x", "user", "skip me too", 1),
]


def _seed_existing_default(url: str) -> str:
    """At revision 0003: a default for (bot, initech/u9) with two cortex messages."""
    sid = str(uuid.uuid4())
    execute(
        url,
        f"""
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2,
                              is_default, message_count, last_message, title)
        VALUES ('initech', '{sid}', 'bot', 'initech/u9', 2, 'initech/u9', true, 2, 'new two', 'kept');
        INSERT INTO messages (tenant_id, id, session_id, seq, role, content, created_at)
        VALUES ('initech', gen_random_uuid(), '{sid}', 1, 'user', 'new one', now()),
               ('initech', gen_random_uuid(), '{sid}', 2, 'user', 'new two', now());
        """,
    )
    return sid


def _sessions(url: str) -> dict[tuple[str, str], asyncpg.Record]:
    rows = fetch(url, "SELECT * FROM sessions")
    return {(r["agent_id"], r["scope"]): r for r in rows}


def _messages(url: str, session_id: uuid.UUID) -> list[tuple[int, str]]:
    rows = fetch(
        url, "SELECT seq, content FROM messages WHERE session_id = $1 ORDER BY seq", session_id
    )
    return [(r["seq"], r["content"]) for r in rows]


def _check_backfilled(url: str, existing: str) -> None:
    sessions = _sessions(url)
    expected_keys = {
        ("bot", "acme/support/u1"),
        ("helper", "acme/support/u1"),
        ("bot", "acme"),
        ("bot", "acme-corp"),
        ("bot", "globex/team"),
        ("bot", "initech/u9"),
    }
    assert set(sessions) == expected_keys
    u1 = sessions[("bot", "acme/support/u1")]
    assert u1["backfilled_by"] == BACKFILL
    assert u1["is_default"]
    assert u1["message_count"] == 4
    assert u1["last_message"] == "bye"
    assert u1["created_at"] == T0 + timedelta(minutes=1)
    assert u1["updated_at"] == T0 + timedelta(minutes=5)
    assert u1["id"].version == 7
    assert u1["scope_depth"] == 3
    assert u1["scope_l2"] == "acme/support"
    assert _messages(url, u1["id"]) == [
        (1, "hello"),
        (2, "hi there"),
        (3, "in between"),
        (4, "bye"),
    ]
    assert sessions[("bot", "acme")]["scope_l2"] is None
    assert sessions[("bot", "acme-corp")]["tenant_id"] == "acme-corp"
    assert sessions[("bot", "globex/team")]["last_message"] == "x" * 256
    joined = sessions[("bot", "initech/u9")]
    assert str(joined["id"]) == existing
    assert joined["backfilled_by"] == ""
    assert joined["title"] == "kept"
    assert joined["message_count"] == 4
    assert joined["last_message"] == "legacy two"
    assert _messages(url, joined["id"]) == [
        (1, "new one"),
        (2, "new two"),
        (3, "legacy one"),
        (4, "legacy two"),
    ]
    left = fetch(url, "SELECT content FROM messages WHERE session_id IS NULL ORDER BY content")
    assert [r["content"] for r in left] == ["skip me", "skip me too"]
    counters = fetch(
        url,
        "SELECT s.id FROM sessions s WHERE s.message_count <> "
        "(SELECT count(*) FROM messages m WHERE m.session_id = s.id)",
    )
    assert counters == []


def test_backfill_then_downgrade_then_again(blank_db: str) -> None:
    upgrade(blank_db, "20260801000001")
    _legacy(blank_db, LEGACY)
    upgrade(blank_db, "20260824000003")
    existing = _seed_existing_default(blank_db)
    upgrade(blank_db)
    _check_backfilled(blank_db, existing)

    downgrade(blank_db, "20260824000003", allow_data_loss=True)
    sessions = _sessions(blank_db)
    assert set(sessions) == {("bot", "initech/u9")}
    kept = sessions[("bot", "initech/u9")]
    assert kept["message_count"] == 2
    assert kept["last_message"] == "new two"
    assert _messages(blank_db, kept["id"]) == [(1, "new one"), (2, "new two")]
    unsessioned = fetch(blank_db, "SELECT count(*) AS n FROM messages WHERE session_id IS NULL")
    assert unsessioned[0]["n"] == len(LEGACY)

    upgrade(blank_db)
    _check_backfilled(blank_db, existing)


class _Crash(Exception):
    pass


def test_backfill_restarts_after_partial_run_and_is_idempotent(
    blank_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(blank_db, "20260801000001")
    _legacy(blank_db, LEGACY)
    upgrade(blank_db, "20260824000003")
    existing = _seed_existing_default(blank_db)

    # A crashed deploy: two committed batches (of 2 messages each), then the process dies.
    @contextlib.contextmanager
    def crash_after_two(*_args: Any, **_kwargs: Any) -> Iterator[Callable[[int], None]]:
        calls = []

        def advance(done: int) -> None:
            calls.append(done)
            if len(calls) == 2:
                raise _Crash

        yield advance

    monkeypatch.setattr(backfill_v1, "progress", crash_after_two)
    with pytest.raises(_Crash):
        upgrade(blank_db, BACKFILL, backfill_batch=2)
    monkeypatch.undo()
    assert current(blank_db) == ["20260824000003"]
    assert len(_sessions(blank_db)) > 1
    upgrade(blank_db, backfill_batch=1)
    _check_backfilled(blank_db, existing)
    # Running the backfill again finds nothing to do.
    before = fetch(blank_db, "SELECT id, message_count, updated_at FROM sessions ORDER BY id")
    assert main(["--database-url", blank_db, "db", "backfill"]) == 0
    assert (
        fetch(blank_db, "SELECT id, message_count, updated_at FROM sessions ORDER BY id") == before
    )


async def test_backfilled_sessions_serve_through_the_store(blank_db: str, server_url: str) -> None:
    import anyio.to_thread

    await anyio.to_thread.run_sync(upgrade, blank_db, "20260801000001")
    await anyio.to_thread.run_sync(_legacy, blank_db, LEGACY[:4])
    await anyio.to_thread.run_sync(upgrade, blank_db)
    role = f"cortex_app_{uuid.uuid4().hex[:8]}"
    await admin(server_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        await admin(blank_db, *grant_sql(role))
        async with cortex.connect(
            with_database(blank_db, str(make_url(blank_db).database), user=role)
        ) as store:
            with use_scope("acme/support/u1"):
                default = await store.resolve_session("bot")
                assert default.backfilled_by == BACKFILL
                assert default.message_count == 4
                new = await store.append_message(default.id, NewMessage("user", "after backfill"))
                assert new.seq == 5
                assert [m.content for m in await store.list_messages(default.id)][-2:] == [
                    "bye",
                    "after backfill",
                ]
    finally:
        await admin(blank_db, f'DROP OWNED BY "{role}"')
        await admin(server_url, f'DROP ROLE "{role}"')


@pytest.mark.slow
def test_wheel_carries_the_migrations(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(root),
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cortex/_alembic/env.py" in names
    assert "cortex/_alembic/alembic.ini" in names
    assert f"cortex/_alembic/versions/{BACKFILL}_backfill_default_sessions.py" in names
    assert "cortex/py.typed" in names


def test_operator_state_migration_derives_pending_from_history(blank_db: str) -> None:
    upgrade(blank_db, "20260901000005")
    sid = str(uuid.uuid4())
    execute(
        blank_db,
        f"""
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, message_count)
        VALUES ('acme', '{sid}', 'bot', 'acme', 1, 4);
        INSERT INTO messages (tenant_id, id, session_id, seq, role, content, created_at,
                              requested_input, function_response)
        VALUES
          ('acme', gen_random_uuid(), '{sid}', 1, 'user', '', now(), NULL, '{{"id": "late"}}'),
          ('acme', gen_random_uuid(), '{sid}', 2, 'assistant', '', now(),
           '{{"interrupt_id": "late", "message": "answered too early"}}', NULL),
          ('acme', gen_random_uuid(), '{sid}', 3, 'assistant', '', now(),
           '{{"interrupt_id": "done"}}', NULL),
          ('acme', gen_random_uuid(), '{sid}', 4, 'user', '', now(), NULL, '{{"id": "done"}}');
        """,
    )
    upgrade(blank_db)
    pending = fetch(blank_db, "SELECT interrupt_id, raised_seq, message FROM pending_inputs")
    assert [tuple(r) for r in pending] == [("late", 2, "answered too early")]
    row = fetch(blank_db, "SELECT pending_count, state FROM sessions")[0]
    assert (row["pending_count"], row["state"]) == (1, "paused")
    forced = fetch(
        blank_db,
        "SELECT relname FROM pg_class WHERE relforcerowsecurity AND relname IN "
        "('sessions', 'messages', 'pending_inputs', 'session_markers') ORDER BY relname",
    )
    assert [r["relname"] for r in forced] == [
        "messages",
        "pending_inputs",
        "session_markers",
        "sessions",
    ]


def test_backfill_throttle_holds_the_rate(blank_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    upgrade(blank_db, "20260801000001")
    _legacy(blank_db, LEGACY)
    upgrade(blank_db, "20260824000003")
    existing = _seed_existing_default(blank_db)
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    # 10 messages per second at most: after each batch of 2 it must wait its turn.
    upgrade(blank_db, backfill_batch=2, backfill_rate=10)
    assert pauses
    assert all(p > 0 for p in pauses)
    _check_backfilled(blank_db, existing)
