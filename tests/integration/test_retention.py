"""Retention: policies by nearest ancestor, idle sessions erased, long ones trimmed, online.

Every store call runs as the plain application role (row-level security
applies); the owner's connection ages sessions and checks what is stored.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import (
    FunctionResponse,
    InvalidInput,
    NewMessage,
    RequestedInput,
    RetentionPolicy,
    RetentionReport,
    ScopeViolation,
    SessionState,
    use_scope,
)
from cortex._calls import retention as retention_calls
from cortex.cli import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main
from cortex.ids import parse_id
from tests.conftest import Database

pytestmark = pytest.mark.citus

DAY = timedelta(days=1)


async def _session(
    store: cortex.Store, path: str, messages: int, *, agent: str = "bot"
) -> cortex.Session:
    with use_scope(path):
        s = await store.create_session(agent)
        if messages:
            await store.append_messages(
                s.id,
                [
                    NewMessage("user" if i % 2 else "assistant", f"m{i + 1}")
                    for i in range(messages)
                ],
            )
        return await store.get_session(s.id)


async def _age(owner: asyncpg.Connection, session_id: str, days: float) -> None:
    """Make the session look untouched for ``days`` (the owner writes past row-level security)."""
    await owner.execute(
        "UPDATE sessions SET updated_at = now() - make_interval(secs => $2) WHERE id = $1",
        parse_id("ses", session_id),
        days * 86400,
    )


async def _exists(owner: asyncpg.Connection, session_id: str) -> bool:
    return bool(
        await owner.fetchval(
            "SELECT count(*) FROM sessions WHERE id = $1", parse_id("ses", session_id)
        )
    )


async def _consistent(owner: asyncpg.Connection, tenant: str) -> None:
    """Every session of the tenant: its counters equal its rows, its seqs one unbroken run."""
    rows = await owner.fetch(
        "SELECT s.id, s.message_count, s.trimmed_count, count(m.id) AS n,"
        " min(m.seq) AS lo, max(m.seq) AS hi FROM sessions s"
        " LEFT JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id"
        " WHERE s.tenant_id = $1 GROUP BY s.id, s.message_count, s.trimmed_count",
        tenant,
    )
    for r in rows:
        assert r["message_count"] == r["n"], dict(r)
        if r["n"]:
            assert (r["lo"], r["hi"]) == (r["trimmed_count"] + 1, r["trimmed_count"] + r["n"])


async def _ask(store: cortex.Store, session_id: str, interrupt_id: str) -> cortex.Message:
    return await store.append_message(
        session_id,
        NewMessage(
            "assistant",
            f"May I refund {interrupt_id}?",
            requested_input=RequestedInput(interrupt_id=interrupt_id, message="Approve?"),
        ),
    )


async def _answer(store: cortex.Store, session_id: str, interrupt_id: str) -> cortex.Message:
    return await store.append_message(
        session_id,
        NewMessage("user", function_response=FunctionResponse(id=interrupt_id, response={"ok": 1})),
    )


# --- policies ---------------------------------------------------------------------------------


async def test_the_policy_in_force_is_the_nearest_at_or_above_by_whole_segments(
    store: cortex.Store, tenant: str
) -> None:
    idle = RetentionPolicy(delete_idle_after=30 * DAY)
    keep = RetentionPolicy(keep_last_messages=50, include_paused=True)
    with use_scope(tenant):
        assert await store.get_retention_policy() is None
        await store.set_retention_policy(idle)
        await store.set_retention_policy(keep, f"{tenant}/u1")
        await store.set_retention_policy(RetentionPolicy(), f"{tenant}/u1/vip")
        assert await store.get_retention_policy() == idle
        assert await store.get_retention_policy(f"{tenant}/u1") == keep
        assert await store.get_retention_policy(f"{tenant}/u1/x/y") == keep
        assert await store.get_retention_policy(f"{tenant}/u10") == idle  # not beneath u1
        assert await store.get_retention_policy(f"{tenant}/u1-x") == idle
        assert await store.get_retention_policy(f"{tenant}/u1/vip/z") == RetentionPolicy()
    with use_scope(f"{tenant}/u1/vip"):
        # The scope's own policy, and one set above it, govern it: both readable.
        assert await store.get_retention_policy() == RetentionPolicy()
    with use_scope(f"{tenant}/u2"):
        assert await store.get_retention_policy() == idle
    with use_scope(tenant):
        await store.set_retention_policy(None, f"{tenant}/u1")  # removed: the tenant's again
        assert await store.get_retention_policy(f"{tenant}/u1/x") == idle
        await store.set_retention_policy(None, f"{tenant}/u1")  # removing none is no error
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=7))  # replaced
        assert await store.get_retention_policy(f"{tenant}/u3") == RetentionPolicy(
            keep_last_messages=7
        )


async def test_a_policy_above_or_beside_the_scope_is_refused(
    store: cortex.Store, tenant: str, other_tenant: str, owner_conn: asyncpg.Connection
) -> None:
    policy = RetentionPolicy(keep_last_messages=1)
    with use_scope(f"{tenant}/u1"):
        for path in (tenant, f"{tenant}/u10", f"{tenant}/u1-x", other_tenant, f"{other_tenant}/u1"):
            with pytest.raises(ScopeViolation):
                await store.set_retention_policy(policy, path)
            with pytest.raises(ScopeViolation):
                await store.set_retention_policy(None, path)
        with pytest.raises(ScopeViolation):
            await store.get_retention_policy(tenant)
    for t in (tenant, other_tenant):
        assert (
            await owner_conn.fetchval(
                "SELECT count(*) FROM retention_policies WHERE tenant_id = $1", t
            )
            == 0
        )


HOSTILE: list[dict[str, Any]] = [
    {"delete_idle_after": timedelta(0)},
    {"delete_idle_after": -DAY},
    {"delete_idle_after": timedelta(days=36_501)},
    {"delete_idle_after": 86400},
    {"delete_idle_after": "P1D"},
    {"keep_last_messages": 0},
    {"keep_last_messages": -5},
    {"keep_last_messages": 2**31},
    {"keep_last_messages": True},
    {"keep_last_messages": "10"},
    {"keep_last_messages": 1.5},
    {"include_paused": "yes"},
    {"include_paused": 1},
    {"delete_after": DAY},
]


async def test_hostile_policies_are_invalid_input_before_any_sql(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    for given in HOSTILE:
        with pytest.raises(InvalidInput):
            RetentionPolicy(**given)
        with use_scope(tenant):
            if given.keys() <= RetentionPolicy.model_fields.keys():
                smuggled = RetentionPolicy.model_construct(**given)  # validated again
                with pytest.raises(InvalidInput):
                    await store.set_retention_policy(smuggled)
            with pytest.raises(InvalidInput):
                await store.set_retention_policy(given)  # type: ignore[arg-type]  # a dict
            for path in ("", "a//b", f"{tenant}/a b", tenant + "/" + "x" * 65, 42):
                with pytest.raises(InvalidInput):
                    await store.set_retention_policy(None, path)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput):
                await store.apply_retention(dry_run="yes")  # type: ignore[arg-type]
        assert (
            await owner_conn.fetchval(
                "SELECT count(*) FROM retention_policies WHERE tenant_id = $1", tenant
            )
            == 0
        )


async def test_a_tenant_s_policy_never_reaches_another_tenant(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    mine = await _session(store, f"{tenant}/u1", 6)
    theirs = await _session(store, f"{other_tenant}/u1", 6)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=1))
        report = await store.apply_retention()
    assert (report.trimmed_sessions, report.trimmed_messages) == (1, 5)
    with use_scope(other_tenant):
        assert await store.get_retention_policy() is None
        assert (await store.apply_retention()).messages == 0
        assert (await store.get_session(theirs.id)).message_count == 6
    with use_scope(tenant):
        assert (await store.get_session(mine.id)).message_count == 1
    # Row-level security: bound to the other tenant, the policy's row is invisible.
    for bound, seen in ((other_tenant, 0), (tenant, 1)):
        async with app_conn.transaction():
            await app_conn.execute(
                "SET LOCAL citus.propagate_set_commands = 'local';"
                f" SET LOCAL cortex.tenant = '{bound}'"
            )
            count = await app_conn.fetchval(
                "SELECT count(*) FROM retention_policies WHERE tenant_id = $1", tenant
            )
            assert count == seen


# --- idle sessions ------------------------------------------------------------------------------


async def test_idle_sessions_are_erased_with_everything_they_hold(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    old = await _session(store, f"{tenant}/u1", 3)
    with use_scope(f"{tenant}/u1"):
        await store.mark_interrupted(old.id, "worker gone")
        await store.abort_session((await _session(store, f"{tenant}/u1", 1)).id, "x")
    deep = (await _session(store, f"{tenant}/u1/t", 2)).id
    fresh = await _session(store, f"{tenant}/u1", 3)
    beside = await _session(store, f"{tenant}/u10", 3)  # same prefix as text, not as segments
    nested = await _session(store, f"{tenant}/u1/t", 2)
    for sid in (old.id, deep, beside.id, nested.id):
        await _age(owner_conn, sid, 3)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(delete_idle_after=2 * DAY), f"{tenant}/u1")
    with use_scope(f"{tenant}/u1"):
        report = await store.apply_retention()
    assert (report.sessions, report.messages, report.markers) == (3, 7, 1)
    assert report.trimmed_sessions == report.trimmed_messages == 0
    assert not await _exists(owner_conn, old.id)
    assert not await _exists(owner_conn, nested.id)
    assert await _exists(owner_conn, fresh.id)
    assert await _exists(owner_conn, beside.id)
    assert not await owner_conn.fetchval(
        "SELECT count(*) FROM messages WHERE session_id = ANY($1::uuid[])",
        [parse_id("ses", s) for s in (old.id, nested.id, deep)],
    )
    assert not await owner_conn.fetchval(
        "SELECT count(*) FROM session_markers WHERE session_id = $1", parse_id("ses", old.id)
    )
    with use_scope(f"{tenant}/u1"):
        again = await store.apply_retention()
    assert again == RetentionReport(scope=cortex.Scope.parse(f"{tenant}/u1"))


async def test_an_update_or_an_append_makes_a_session_busy_again(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    appended, updated, idle = [await _session(store, f"{tenant}/u1", 1) for _ in range(3)]
    for s in (appended, updated, idle):
        await _age(owner_conn, s.id, 3)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(delete_idle_after=DAY))
        await store.append_message(appended.id, NewMessage("user", "still here"))
        await store.update_session(updated.model_copy(update={"title": "renamed"}))
        report = await store.apply_retention()
    assert report.sessions == 1
    assert [await _exists(owner_conn, s.id) for s in (appended, updated, idle)] == [
        True,
        True,
        False,
    ]


async def test_a_paused_session_is_kept_unless_its_policy_includes_paused(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    paused = []
    for path in (f"{tenant}/keep", f"{tenant}/drop"):
        s = await _session(store, path, 2)
        with use_scope(path):
            await _ask(store, s.id, "refund-1")
            assert (await store.get_session(s.id)).state is SessionState.PAUSED
        await _age(owner_conn, s.id, 10)
        paused.append(s)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(delete_idle_after=DAY), f"{tenant}/keep")
        await store.set_retention_policy(
            RetentionPolicy(delete_idle_after=DAY, include_paused=True), f"{tenant}/drop"
        )
        report = await store.apply_retention()
    assert (report.sessions, report.messages, report.pending_inputs) == (1, 3, 1)
    assert await _exists(owner_conn, paused[0].id)
    assert not await _exists(owner_conn, paused[1].id)
    assert not await owner_conn.fetchval(
        "SELECT count(*) FROM pending_inputs WHERE session_id = $1", parse_id("ses", paused[1].id)
    )


# --- long sessions -------------------------------------------------------------------------------


async def test_a_trim_keeps_the_newest_messages_at_their_positions(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    s = await _session(store, f"{tenant}/u1", 10)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=3))
        report = await store.apply_retention()
        assert (report.sessions, report.messages, report.trimmed_sessions) == (0, 7, 1)
        trimmed = await store.get_session(s.id)
        assert (trimmed.message_count, trimmed.trimmed_count) == (3, 7)
        assert trimmed.updated_at == s.updated_at  # a trim is no activity
        assert trimmed.last_message == s.last_message == "m10"
        assert [m.seq for m in await store.list_messages(s.id)] == [8, 9, 10]
        assert [m.content for m in await store.list_messages(s.id, after_seq=8)] == ["m9", "m10"]
        assert [m.seq for m in await store.recent_messages(s.id, limit=2)] == [9, 10]
        assert [m.seq for m in await store.recent_messages(s.id, before_seq=9)] == [8]
        assert await store.recent_messages(s.id, before_seq=8) == []
        history = await store.get_session_with_messages(s.id, limit=2)
        assert history.session.trimmed_count + history.session.message_count == 10
        # Appends go on after the kept ones; a pop removes the last; since still finds the tail.
        added = await store.append_messages(
            s.id, [NewMessage("user", "m11"), NewMessage("user", "m12")]
        )
        assert [m.seq for m in added] == [11, 12]
        popped = await store.pop_message(s.id)
        assert popped is not None
        assert popped.seq == 12
        tail = await store.list_messages(s.id, since=trimmed.updated_at)
        assert [m.seq for m in tail] == [11]
        assert (await store.get_session(s.id)).message_count == 4
        # A second run trims the appended one's elder away.
        assert (await store.apply_retention()).trimmed_messages == 1
        assert [m.seq for m in await store.list_messages(s.id)] == [9, 10, 11]
        # Clearing starts the positions again at 1.
        cleared = await store.clear_messages(s.id)
        assert (cleared.message_count, cleared.trimmed_count) == (0, 0)
        assert (await store.append_message(s.id, NewMessage("user", "again"))).seq == 1
    await _consistent(owner_conn, tenant)


async def test_popping_every_kept_message_leaves_the_positions_after_the_trimmed(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    s = await _session(store, f"{tenant}/u1", 4)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=1))
        await store.apply_retention()
        assert (await store.pop_message(s.id)).seq == 4  # type: ignore[union-attr]
        assert await store.pop_message(s.id) is None
        assert (await store.append_message(s.id, NewMessage("user", "next"))).seq == 4
    await _consistent(owner_conn, tenant)


async def test_a_pending_question_and_everything_after_it_are_kept(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    s = await _session(store, f"{tenant}/u1", 3)
    with use_scope(f"{tenant}/u1"):
        asked = await _ask(store, s.id, "q1")  # seq 4
        for i in range(6):
            await store.append_message(s.id, NewMessage("user", f"later {i}"))
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=2))
        report = await store.apply_retention()
        assert report.trimmed_messages == 3
        assert next(m.seq for m in await store.list_messages(s.id)) == asked.seq == 4
        pending = await store.inspect_session(s.id)
        assert [p.raised_seq for p in pending.pending] == [4]
        # Answered, the question is no longer pending: the next run trims down to 2.
        await _answer(store, s.id, "q1")
        again = await store.apply_retention()
        assert again.trimmed_messages == 6  # 4 to 9: the answer at 11 and 10 stay
        assert [m.seq for m in await store.list_messages(s.id)] == [10, 11]
    await _consistent(owner_conn, tenant)


async def test_a_trimmed_scope_exports_and_imports_as_it_was(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    s = await _session(store, f"{tenant}/u1", 6)
    with use_scope(f"{tenant}/u1"):
        await _ask(store, s.id, "q1")
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=3))
        await store.apply_retention()
        records = [record async for record in store.export_scope()]
        await store.erase_scope()
        restored = await store.import_scope(records)
        assert (restored.sessions, restored.messages, restored.pending_inputs) == (1, 3, 1)
        back = await store.get_session(s.id)
        assert (back.message_count, back.trimmed_count, back.pending_count) == (3, 4, 1)
        assert [m.seq for m in await store.list_messages(s.id)] == [5, 6, 7]
        assert (await store.append_message(s.id, NewMessage("user", "on"))).seq == 8
    await _consistent(owner_conn, tenant)


# --- a run as a whole -------------------------------------------------------------------------


async def _mixed(store: cortex.Store, owner: asyncpg.Connection, root: str, n: int) -> None:
    """``n`` of each: idle sessions, long sessions, paused idle ones, idle and long beside."""
    for i in range(n):
        idle = await _session(store, f"{root}/u{i}", 2 + i % 3)
        await _age(owner, idle.id, 5)
        await _session(store, f"{root}/u{i}/deep", 8 + i % 5)
        paused = await _session(store, f"{root}/u{i}", 1)
        with use_scope(f"{root}/u{i}"):
            await _ask(store, paused.id, f"q{i}")
        await _age(owner, paused.id, 5)
        both = await _session(store, f"{root}/v{i}", 12)
        await _age(owner, both.id, 1)  # busy enough for its policy, too long
    with use_scope(root):
        await store.set_retention_policy(
            RetentionPolicy(delete_idle_after=2 * DAY, keep_last_messages=4)
        )
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=6), f"{root}/u0")


async def test_a_dry_run_reports_exactly_what_the_run_then_does(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    await _mixed(store, owner_conn, tenant, 6)
    before = await owner_conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant)
    with use_scope(tenant):
        dry = await store.apply_retention(dry_run=True)
        assert dry.dry_run
        assert (
            await owner_conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant)
            == before
        )
        assert dry.sessions > 0
        assert dry.trimmed_sessions > 0
        real = await store.apply_retention()
        assert real.model_dump() == dry.model_dump() | {"dry_run": False}
        after = await owner_conn.fetchval(
            "SELECT count(*) FROM messages WHERE tenant_id = $1", tenant
        )
        assert before - after == real.messages
        # Idempotent: nothing is left to do, and a dry run says so.
        assert (await store.apply_retention(dry_run=True)).model_dump(exclude={"dry_run"}) == (
            RetentionReport(scope=cortex.Scope.parse(tenant)).model_dump(exclude={"dry_run"})
        )
    await _consistent(owner_conn, tenant)


async def test_two_runs_at_once_remove_each_row_once(
    store: cortex.Store,
    tenant: str,
    owner_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _mixed(store, owner_conn, tenant, 10)
    # Small pages and batches: the two runs interleave over many transactions.
    monkeypatch.setattr(retention_calls, "PAGE_SESSIONS", 4)
    monkeypatch.setattr(retention_calls, "BATCH_SESSIONS", 2)
    with use_scope(tenant):
        planned = await store.apply_retention(dry_run=True)
    reports: list[RetentionReport] = []

    async def run(path: str) -> None:
        with use_scope(path):
            reports.append(await store.apply_retention())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, tenant)
        tg.start_soon(run, tenant)
    counted = ("sessions", "messages", "pending_inputs", "markers", "trimmed_messages")
    for name in counted:
        assert sum(getattr(r, name) for r in reports) == getattr(planned, name), name
    assert sum(r.trimmed_sessions for r in reports) <= planned.trimmed_sessions
    await _consistent(owner_conn, tenant)
    with use_scope(tenant):
        assert (await store.apply_retention()).messages == 0


async def test_appends_racing_a_trim_keep_the_counters_equal_to_the_rows(
    store: cortex.Store,
    tenant: str,
    owner_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retention_calls, "PAGE_SESSIONS", 3)
    monkeypatch.setattr(retention_calls, "BATCH_SESSIONS", 1)
    sessions = [await _session(store, f"{tenant}/u{i}", 30) for i in range(6)]
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=5))
    appended: dict[str, list[int]] = {s.id: [] for s in sessions}

    async def append(s: cortex.Session) -> None:
        with use_scope(f"{tenant}"):
            for i in range(15):
                stored = await store.append_messages(
                    s.id, [NewMessage("user", f"a{i}"), NewMessage("assistant", f"b{i}")]
                )
                appended[s.id] += [m.seq for m in stored]

    async def trim() -> None:
        with use_scope(tenant):
            for _ in range(4):
                await store.apply_retention()

    async with anyio.create_task_group() as tg:
        for s in sessions:
            tg.start_soon(append, s)
        tg.start_soon(trim)
    for s in sessions:
        # Every append numbered on from the last position, whatever was trimmed meanwhile.
        assert appended[s.id] == list(range(31, 61))
    await _consistent(owner_conn, tenant)
    with use_scope(tenant):
        await store.apply_retention()
        for s in sessions:
            kept = await store.get_session(s.id)
            assert (kept.message_count, kept.trimmed_count) == (5, 55)
    await _consistent(owner_conn, tenant)


async def test_an_adk_style_writer_with_an_expected_count_goes_on_after_a_trim(
    store: cortex.Store, tenant: str
) -> None:
    s = await _session(store, f"{tenant}/u1", 8)
    with use_scope(tenant):
        await store.set_retention_policy(RetentionPolicy(keep_last_messages=2))
        await store.apply_retention()
        seen = await store.get_session(s.id)
        # expected_count is the count of messages held, as read: after a trim, 2.
        stored = await store.append_messages(
            s.id, [NewMessage("user", "go on")], expected_count=seen.message_count
        )
        assert stored[0].seq == 9
        with pytest.raises(cortex.Conflict):
            await store.append_messages(s.id, [NewMessage("user", "stale")], expected_count=2)


# --- the command line ---------------------------------------------------------------------------


def _cli(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--database-url", url, "retention", "run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _prepare(database: Database, tenants: list[str]) -> None:
    async def seed() -> None:
        async with cortex.connect(database.app_url) as store:
            for t in tenants:
                await _session(store, f"{t}/u1", 5)
                with use_scope(t):
                    await store.set_retention_policy(RetentionPolicy(keep_last_messages=2))

    anyio.run(seed)


def test_the_command_runs_every_tenant_as_the_owner(
    database: Database, tenant: str, other_tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _prepare(database, [tenant, other_tenant])
    code, out, _ = _cli(database.owner_url, capsys, "--dry-run", "--json")
    assert code == EXIT_OK
    dry = json.loads(out)
    assert dry["dry_run"] is True
    by_tenant = {r["scope"]: r for r in dry["tenants"]}
    assert by_tenant[tenant]["trimmed_messages"] == by_tenant[other_tenant]["trimmed_messages"] == 3
    code, out, _ = _cli(database.owner_url, capsys, "--json")
    assert code == EXIT_OK
    done = json.loads(out)
    assert {r["scope"]: r for r in done["tenants"]}[tenant] == by_tenant[tenant] | {
        "dry_run": False
    }
    assert done["total"]["messages"] >= 6
    code, out, _ = _cli(database.owner_url, capsys)
    assert code == EXIT_OK
    assert "0 messages" in out


def test_the_command_runs_one_scope_as_the_application_role(
    database: Database, tenant: str, other_tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _prepare(database, [tenant, other_tenant])
    code, out, _ = _cli(database.app_url, capsys, "--scope", tenant, "--json")
    assert code == EXIT_OK
    report = json.loads(out)
    assert [r["scope"] for r in report["tenants"]] == [tenant]
    assert report["total"]["trimmed_messages"] == 3
    code, out, _ = _cli(database.app_url, capsys, "--scope", f"{tenant}/u1")
    assert (code, out.strip()) == (
        EXIT_OK,
        f"retention in {tenant}/u1: 0 sessions erased, 0 messages removed"
        " (0 trimmed from 0 sessions), 0 pending inputs, 0 markers",
    )
    # The other tenant was not touched by the scoped run.
    code, out, _ = _cli(database.app_url, capsys, "--scope", other_tenant, "--dry-run", "--json")
    assert json.loads(out)["total"]["trimmed_messages"] == 3


def test_the_command_says_when_its_role_cannot_read_every_tenant(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(database.app_url, capsys)
    assert code == EXIT_USAGE
    assert out == ""
    assert "every tenant" in err
    assert "BYPASSRLS" in err
    assert "--scope" in err
    code, _, err = _cli(database.app_url, capsys, "--scope", "a//b")
    assert code == EXIT_USAGE
    code, _, err = _cli(
        "postgresql://nobody@127.0.0.1:1/nothing", capsys, "--scope", "acme", "--dry-run"
    )
    assert code == EXIT_UNAVAILABLE
