"""The operator console's data: the role ``cortex_console``, its policies, the view and the audit trail.

The console reads as a login granted ``cortex_console`` (made here, as a
DBA would); the store writes as the plain application role. Every row is
committed for real on separate connections: a rolled-back outer
transaction would hide a missing binding.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import anyio
import asyncpg
import pytest

import cortex
from cortex import (
    ActionKind,
    InvalidInput,
    NewMessage,
    OperatorView,
    RequestedInput,
    SessionState,
    WaitingFilter,
    use_scope,
)
from cortex.cli import EXIT_USAGE, main
from cortex.console import _encode_cursor
from cortex.errors import DatabaseError
from tests.conftest import Database, admin, asyncpg_dsn, with_user

# Marked here, not only by the conftest hook: a parametrized coroutine needs it at collection.
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def console_url(database: Database) -> Iterator[str]:
    """A login granted cortex_console, as docs/deployment/roles.md has a DBA make it."""
    role = f"console_login_{uuid.uuid4().hex[:10]}"
    asyncio.run(
        admin(
            database.owner_url, f'CREATE ROLE "{role}" LOGIN', f'GRANT cortex_console TO "{role}"'
        )
    )
    yield with_user(database.owner_url, role)
    asyncio.run(admin(database.owner_url, f'DROP ROLE IF EXISTS "{role}"'))


@pytest.fixture
def names() -> dict[str, str]:
    """Three tenants, one a prefix of another's name: acme, acme-corp, globex."""
    x = uuid.uuid4().hex[:8]
    return {"acme": f"acme{x}", "corp": f"acme{x}-corp", "globex": f"globex{x}"}


def ask(interrupt_id: str, question: str) -> NewMessage:
    return NewMessage(
        "assistant",
        "asking",
        requested_input=RequestedInput(interrupt_id=interrupt_id, message=question),
    )


async def paused(store: cortex.Store, scope: str, *, title: str, agent: str = "agent-a") -> str:
    with use_scope(scope):
        s = await store.create_session(agent, title=title)
        await store.append_messages(s.id, [ask("i1", f"approve {title}?")])
        return s.id


@pytest.fixture
async def seeded(store: cortex.Store, names: dict[str, str]) -> dict[str, str]:
    """One paused session per tenant, one interrupted and one aborted in acme."""
    ids = {
        "acme": await paused(store, f"{names['acme']}/eu/u1", title="acme-one"),
        "acme_us": await paused(store, f"{names['acme']}/us", title="acme-us"),
        "corp": await paused(store, names["corp"], title="corp-one"),
        "globex": await paused(
            store, f"{names['globex']}/x", title=f"{names['globex']}-one", agent="agent-b"
        ),
    }
    with use_scope(names["acme"]):
        s = await store.create_session("agent-a", title="acme-interrupted")
        await store.mark_interrupted(s.id, "deploy")
        ids["interrupted"] = s.id
        s = await store.create_session("agent-a", title="acme-aborted")
        await store.abort_session(s.id, "stuck")
        ids["aborted"] = s.id
    return ids


@pytest.fixture
async def raw_console(console_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(console_url))
    try:
        yield conn
    finally:
        await conn.close()


async def _console_ids(conn: asyncpg.Connection, setting: str, tenants: list[str]) -> set[str]:
    """Tenants of the session rows the console role reads with ``setting`` bound (no predicate)."""
    async with conn.transaction():
        await conn.execute("SET LOCAL ROLE cortex_console")
        await conn.execute("SELECT set_config('cortex.operator_scope', $1, true)", setting)
        rows = await conn.fetch(
            "SELECT tenant_id FROM sessions WHERE tenant_id = ANY($1::text[])", tenants
        )
    return {r["tenant_id"] for r in rows}


async def test_the_console_role_sees_its_scope_and_never_a_neighbour(
    raw_console: asyncpg.Connection, seeded: dict[str, str], names: dict[str, str]
) -> None:
    every = list(names.values())
    acme, corp, globex = names["acme"], names["corp"], names["globex"]
    assert await _console_ids(raw_console, f"{acme}/", every) == {acme}
    assert await _console_ids(raw_console, f"{acme}/eu/", every) == {acme}
    assert await _console_ids(raw_console, "/", every) == {acme, corp, globex}
    # Unbound, or bound to nothing, it reads nothing.
    assert await _console_ids(raw_console, "", every) == set()
    async with raw_console.transaction():
        await raw_console.execute("SET LOCAL ROLE cortex_console")
        assert await raw_console.fetchval("SELECT count(*) FROM sessions") == 0
        assert await raw_console.fetchval("SELECT count(*) FROM pending_inputs") == 0
    # A pending input is the console's only when its session is.
    async with raw_console.transaction():
        await raw_console.execute("SET LOCAL ROLE cortex_console")
        await raw_console.execute(
            "SELECT set_config('cortex.operator_scope', $1, true)", f"{acme}/eu/"
        )
        tenants = await raw_console.fetch("SELECT DISTINCT tenant_id FROM pending_inputs")
        assert {r["tenant_id"] for r in tenants} == {acme}
        assert await raw_console.fetchval("SELECT count(*) FROM pending_inputs") == 1


@pytest.mark.parametrize(
    "sql_text",
    [
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth)"
        " VALUES ('{t}', gen_random_uuid(), 'a', '{t}', 1)",
        "UPDATE sessions SET title = 'x' WHERE tenant_id = '{t}'",
        "DELETE FROM sessions WHERE tenant_id = '{t}'",
        "DELETE FROM pending_inputs WHERE tenant_id = '{t}'",
        "UPDATE session_markers SET reason = 'x' WHERE tenant_id = '{t}'",
        "INSERT INTO console_actions (tenant_id, id, scope, subject, action, outcome)"
        " VALUES ('{t}', gen_random_uuid(), '{t}', 's', 'abort', 'ok')",
        "SELECT data FROM sessions WHERE tenant_id = '{t}'",
        "SELECT content FROM messages WHERE tenant_id = '{t}'",
        "SELECT payload FROM pending_inputs WHERE tenant_id = '{t}'",
    ],
    ids=[
        "insert",
        "update",
        "delete",
        "delete-input",
        "update-marker",
        "insert-action",
        "read-data",
        "read-messages",
        "read-payload",
    ],
)
async def test_the_console_role_only_reads_what_a_listing_shows(
    raw_console: asyncpg.Connection, seeded: dict[str, str], names: dict[str, str], sql_text: str
) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await _as_console(raw_console, sql_text.format(t=names["acme"]))


async def _as_console(conn: asyncpg.Connection, sql_text: str) -> None:
    """``sql_text`` as the console role bound to every tenant, in a transaction of its own."""
    async with conn.transaction():
        await conn.execute("SET LOCAL ROLE cortex_console")
        await conn.execute("SELECT set_config('cortex.operator_scope', '/', true)")
        await conn.execute(sql_text)


async def _as_tenant(conn: asyncpg.Connection, tenant: str, sql_text: str) -> None:
    """``sql_text`` with ``tenant`` bound, in a transaction of its own."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('cortex.tenant', $1, true)", tenant)
        await conn.execute(sql_text)


async def test_the_application_role_gains_nothing_from_the_console_setting(
    app_conn: asyncpg.Connection, seeded: dict[str, str], names: dict[str, str]
) -> None:
    every = list(names.values())
    for bound in ("", names["acme"]):
        async with app_conn.transaction():
            await app_conn.execute("SELECT set_config('cortex.tenant', $1, true)", bound)
            await app_conn.execute("SELECT set_config('cortex.operator_scope', '/', true)")
            rows = await app_conn.fetch(
                "SELECT DISTINCT tenant_id FROM sessions WHERE tenant_id = ANY($1::text[])", every
            )
            inputs = await app_conn.fetch(
                "SELECT DISTINCT tenant_id FROM pending_inputs WHERE tenant_id = ANY($1::text[])",
                every,
            )
        expected = {bound} if bound else set()
        assert {r["tenant_id"] for r in rows} == expected
        assert {r["tenant_id"] for r in inputs} == expected
    # Nor can it take the console's role.
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await app_conn.execute("SET ROLE cortex_console")


async def test_list_waiting_across_tenants_by_scope(
    console_url: str, seeded: dict[str, str], names: dict[str, str]
) -> None:
    acme, corp, globex = names["acme"], names["corp"], names["globex"]
    async with OperatorView(console_url, operator_scope=acme) as view:
        page = await view.list_waiting()
        assert {r.session_id for r in page.rows} == {seeded["acme"], seeded["acme_us"]}
        row = next(r for r in page.rows if r.session_id == seeded["acme"])
        assert (row.tenant, str(row.scope), row.agent_id, row.title) == (
            acme,
            f"{acme}/eu/u1",
            "agent-a",
            "acme-one",
        )
        assert (row.state, row.question, row.interrupt_id) == (
            SessionState.PAUSED,
            "approve acme-one?",
            "i1",
        )
        assert row.waiting_since.tzinfo is not None
        interrupted = await view.list_waiting(WaitingFilter(state=SessionState.INTERRUPTED))
        assert [(r.session_id, r.reason) for r in interrupted.rows] == [
            (seeded["interrupted"], "deploy")
        ]
        aborted = await view.list_waiting(WaitingFilter(state="aborted"))
        assert [(r.session_id, r.reason, r.question) for r in aborted.rows] == [
            (seeded["aborted"], "stuck", None)
        ]
        # Another tenant named by the filter is outside the scope: nothing.
        assert (await view.list_waiting(WaitingFilter(tenant=globex))).rows == []
    async with OperatorView(console_url, operator_scope=f"{acme}/eu") as view:
        assert [r.session_id for r in (await view.list_waiting()).rows] == [seeded["acme"]]
    async with OperatorView(console_url, operator_scope=None) as view:
        for tenant, key in ((acme, None), (corp, "corp"), (globex, "globex")):
            page = await view.list_waiting(WaitingFilter(tenant=tenant))
            got = {r.session_id for r in page.rows}
            assert got == ({seeded["acme"], seeded["acme_us"]} if key is None else {seeded[key]})
        found = await view.list_waiting(
            WaitingFilter(agent_id="agent-b", search=f"{globex.upper()}-O")
        )
        assert [r.session_id for r in found.rows] == [seeded["globex"]]
        # LIKE's wildcards are text in a search.
        assert (await view.list_waiting(WaitingFilter(tenant=acme, search="acme%one"))).rows == []


async def test_pages_are_keyset_pages_newest_first(
    store: cortex.Store, console_url: str, names: dict[str, str]
) -> None:
    acme = names["acme"]
    made = [await paused(store, f"{acme}/p/u{i % 3}", title=f"s{i}") for i in range(45)]
    seen: list[str] = []
    cursor = None
    async with OperatorView(console_url, operator_scope=acme) as view:
        while True:
            page = await view.list_waiting(WaitingFilter(limit=20), cursor)
            seen += [r.session_id for r in page.rows]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == list(reversed(made))
        with pytest.raises(InvalidInput, match="cursor"):
            await view.list_waiting(cursor="not-a-cursor")
        actions = await view.list_actions()
        with pytest.raises(InvalidInput, match="cursor"):
            await view.list_waiting(cursor=actions.next_cursor or _action_cursor())


def _action_cursor() -> str:
    return _encode_cursor("a", datetime.now(UTC), uuid.uuid4(), "x")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"state": "idle"}, "state"),
        ({"limit": 19}, "limit"),
        ({"limit": 201}, "limit"),
        ({"tenant": "a/b"}, "tenant"),
        ({"agent_id": "has space"}, "agent_id"),
    ],
)
def test_a_bad_filter_is_invalid_input(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        WaitingFilter(**kwargs)


def test_a_bad_operator_scope_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        OperatorView("postgresql://nobody@127.0.0.1:1/x", operator_scope="a//b")


async def test_a_login_without_the_role_is_told_what_to_grant(
    database: Database, seeded: dict[str, str]
) -> None:
    async with OperatorView(database.app_url, operator_scope=None) as view:
        with pytest.raises(DatabaseError, match="GRANT cortex_console TO"):
            await view.list_waiting()


async def test_actions_are_recorded_by_the_store_and_read_by_the_console(
    store: cortex.Store, console_url: str, seeded: dict[str, str], names: dict[str, str]
) -> None:
    acme, globex = names["acme"], names["globex"]
    with use_scope(acme):
        done = await store.record_console_action(
            ActionKind.RESUME,
            subject="ops@example.com",
            session_id=seeded["acme"],
            detail={"interrupt_id": "i1", "answers": 1},
        )
        assert str(done.scope) == f"{acme}/eu/u1"
        await store.record_console_action(ActionKind.SIGN_IN, subject="ops@example.com")
        missing = await store.record_console_action(
            ActionKind.ABORT,
            subject="ops@example.com",
            session_id=seeded["globex"],
            outcome="NotFound",
        )
        # Another tenant's session is not found, and the row stays in the caller's scope.
        assert str(missing.scope) == acme
        with pytest.raises(InvalidInput, match="outcome"):
            await store.record_console_action(ActionKind.ABORT, subject="s", outcome="not ok")
        with pytest.raises(InvalidInput, match="detail"):
            await store.record_console_action(
                ActionKind.ABORT, subject="s", detail={"x": "y" * 5000}
            )
        with pytest.raises(InvalidInput, match="action"):
            await store.record_console_action("delete", subject="s")  # type: ignore[arg-type]  # wrong on purpose
    with use_scope(globex):
        await store.record_console_action(ActionKind.SIGN_IN, subject="other@example.com")
    async with OperatorView(console_url, operator_scope=f"{acme}/eu") as view:
        page = await view.list_actions()
        assert [(a.action, a.id) for a in page.rows] == [(ActionKind.RESUME, done.id)]
        assert page.rows[0].detail == {"interrupt_id": "i1", "answers": 1}
    async with OperatorView(console_url, operator_scope=acme) as view:
        assert [a.action for a in (await view.list_actions()).rows] == [
            "abort",
            "sign_in",
            "resume",
        ]
        mine = await view.list_actions(session_id=seeded["acme"])
        assert [a.id for a in mine.rows] == [done.id]
    async with OperatorView(console_url, operator_scope=None) as view:
        subjects = {a.subject for a in (await view.list_actions(limit=200)).rows}
        assert {"ops@example.com", "other@example.com"} <= subjects


async def test_the_application_role_cannot_rewrite_the_trail(
    store: cortex.Store, app_conn: asyncpg.Connection, names: dict[str, str]
) -> None:
    acme = names["acme"]
    with use_scope(acme):
        await store.record_console_action(ActionKind.SIGN_IN, subject="ops")
    for statement in ("UPDATE console_actions SET subject = 'x'", "DELETE FROM console_actions"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await _as_tenant(app_conn, acme, statement)


async def test_the_cli_lists_the_trail_and_the_waiting_sessions(
    store: cortex.Store,
    console_url: str,
    seeded: dict[str, str],
    names: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    acme = names["acme"]
    with use_scope(acme):
        done = await store.record_console_action(
            ActionKind.ABORT, subject="ops@example.com", session_id=seeded["acme"]
        )
    url = ["--database-url", console_url]
    run = anyio.to_thread.run_sync
    assert await run(lambda: main([*url, "audit", "list", "--scope", acme, "--json"])) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["id"] for a in listed["rows"]] == [done.id]
    assert listed["next_cursor"] is None
    assert await run(lambda: main([*url, "audit", "list", "--scope", acme])) == 0
    out = capsys.readouterr().out
    assert "ops@example.com" in out
    assert "abort" in out
    session = ["--session", seeded["acme_us"], "--scope", acme]
    assert await run(lambda: main([*url, "audit", "list", *session])) == 0
    assert "no operator actions" in capsys.readouterr().out
    waiting = ["sessions", "waiting", "--tenant", acme]
    assert await run(lambda: main([*url, *waiting, "--json"])) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["session_id"] for r in rows} == {seeded["acme"], seeded["acme_us"]}
    assert await run(lambda: main([*url, *waiting, "--state", "aborted"])) == 0
    assert "stuck" in capsys.readouterr().out
    assert await run(lambda: main([*url, *waiting, "--limit", "5"])) == EXIT_USAGE
    assert "limit" in capsys.readouterr().err
