"""Erasing a scope: everything at and beneath it, nothing beside it, a receipt, online and resumable.

Every call runs as the plain application role (row-level security applies);
the owner's connection checks what is really stored.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import cortex
from cortex import (
    ErasureReport,
    ErasureState,
    InvalidInput,
    NewMessage,
    NotFound,
    ScopeViolation,
    use_scope,
)
from cortex._calls import erasure as erasure_calls
from cortex.ids import parse_id
from tests.lifecycle import TABLES, populate, stored

pytestmark = pytest.mark.citus


async def _count(owner: asyncpg.Connection, tenant: str) -> dict[str, int]:
    return {
        table: await owner.fetchval(f"SELECT count(*) FROM {table} WHERE tenant_id = $1", tenant)
        for table in TABLES
    }


async def test_erase_removes_the_subtree_and_nothing_beside_it(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    written = await populate(store, root)
    # Neighbours whose paths share the prefix as text, not as segments.
    beside = {}
    for path in (f"{tenant}/u10", f"{tenant}/u1-x", f"{tenant}/u1.x", tenant):
        with use_scope(path):
            s = await store.create_session("bot", scope_data={path: {"keep": path}})
            await store.append_messages(s.id, [NewMessage("user", "stay")])
            beside[path] = s.id
    before = await _count(owner_conn, tenant)
    with use_scope(root):
        dry = await store.erase_scope(dry_run=True)
    assert (dry.sessions, dry.messages, dry.pending_inputs) == (3, written["messages"], 1)
    assert (dry.markers, dry.scope_documents) == (3, 3)  # interrupt, abort, parked
    assert dry.dry_run
    assert dry.receipt is None
    assert await _count(owner_conn, tenant) == before  # a dry run writes nothing
    with use_scope(tenant):
        report = await store.erase_scope(root)
    assert report.model_dump(exclude={"receipt"}) == dry.model_dump(
        exclude={"receipt", "dry_run"}
    ) | {"dry_run": False}
    assert report.receipt is not None
    assert report.receipt.state is ErasureState.DONE
    assert report.receipt.finished_at is not None
    assert (report.receipt.sessions, report.receipt.messages) == (3, written["messages"])
    assert all(rows == [] for rows in (await stored(owner_conn, tenant, root)).values())
    for path, sid in beside.items():
        with use_scope(path):
            assert (await store.get_session(sid)).message_count == 1
            assert await store.get_scope_data() == {"keep": path}
    # The erased scope starts clean: only the tenant's own document reaches it.
    with use_scope(root):
        assert await store.get_scope_data() == {}
        fresh = await store.create_session("bot")
        assert (await store.get_session(fresh.id)).data == {"keep": tenant}


async def test_receipts_are_listed_newest_first_and_only_at_or_beneath(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    for path in (f"{tenant}/a", f"{tenant}/a/b", f"{tenant}/ab", f"{tenant}/a"):
        with use_scope(path):
            await populate(store, path, sessions=1)
            await store.erase_scope()
    with use_scope(f"{tenant}/a"):
        listed = await store.list_erasures()
        assert [str(e.scope) for e in listed] == [f"{tenant}/a", f"{tenant}/a/b", f"{tenant}/a"]
        assert [e.at for e in listed] == sorted((e.at for e in listed), reverse=True)
        assert listed[0].sessions == 1
        assert listed[0].messages == 4
        assert [str(e.scope) for e in await store.list_erasures(f"{tenant}/a/b")] == [
            f"{tenant}/a/b"
        ]
        with pytest.raises(ScopeViolation):
            await store.list_erasures(f"{tenant}/ab")
    with use_scope(tenant):
        assert len(await store.list_erasures()) == 4
    # Row-level security: another tenant bound on the raw connection sees none of
    # them (SET LOCAL, which Citus replays on its workers, as the store binds it).
    for bound, seen in (("someone-else", 0), (tenant, 4)):
        async with app_conn.transaction():
            await app_conn.execute(
                "SET LOCAL citus.propagate_set_commands = 'local';"
                f" SET LOCAL cortex.tenant = '{bound}'"
            )
            assert (
                await app_conn.fetchval(
                    "SELECT count(*) FROM erasures WHERE tenant_id = $1", tenant
                )
                == seen
            )


async def test_a_path_outside_the_current_scope_is_refused_before_anything(
    store: cortex.Store, tenant: str, other_tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{other_tenant}/u1"):
        victim = await store.create_session("bot")
    with use_scope(f"{tenant}-corp/u1"):
        neighbour = await store.create_session("bot")
    with use_scope(f"{tenant}/u1"):
        for path in (
            tenant,  # above
            f"{tenant}/u10",  # beside, a text prefix
            f"{tenant}/u2",
            f"{other_tenant}/u1",  # another tenant
            other_tenant,
            f"{tenant}-corp/u1",
            "../x",  # two valid segments: ".." is a name, not a step up
        ):
            with pytest.raises(ScopeViolation):
                await store.erase_scope(path)
            with pytest.raises(ScopeViolation):
                await store.erase_scope(path, dry_run=True)
        for bad in ("", "a//b", f"{tenant}/u1/", f"{tenant}/u1/%", "a b", "x/" * 9 + "x"):
            with pytest.raises(InvalidInput):
                await store.erase_scope(bad)
        with pytest.raises(InvalidInput):
            await store.erase_scope(42)  # type: ignore[arg-type]
    assert (
        await owner_conn.fetchval("SELECT count(*) FROM erasures WHERE tenant_id = $1", tenant) == 0
    )
    with use_scope(f"{other_tenant}/u1"):
        assert (await store.get_session(victim.id)).id == victim.id
    with use_scope(f"{tenant}-corp/u1"):
        assert (await store.get_session(neighbour.id)).id == neighbour.id


async def test_like_wildcards_in_a_path_are_plain_characters(
    store: cortex.Store, tenant: str
) -> None:
    """``_`` and ``.`` are a LIKE wildcard and a regex one: the subtree is a byte range."""
    with use_scope(f"{tenant}/u_1"):
        await store.create_session("bot")
    with use_scope(f"{tenant}/ux1"):
        kept = await store.create_session("bot")
    with use_scope(f"{tenant}/u.1"):
        kept_dot = await store.create_session("bot")
    with use_scope(f"{tenant}/u_1"):
        assert (await store.erase_scope()).sessions == 1
    with use_scope(tenant):
        left = {s.id for s in await store.list_sessions()}
    assert left == {kept.id, kept_dot.id}


async def test_erasing_again_is_an_empty_erasure(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/u1"):
        await populate(store, f"{tenant}/u1", sessions=2)
        first = await store.erase_scope()
        again = await store.erase_scope()
        assert first.sessions == 2
        assert again.model_dump(exclude={"receipt"}) == ErasureReport(
            scope=f"{tenant}/u1"
        ).model_dump(exclude={"receipt"})
        assert again.receipt is not None
        assert again.receipt.state is ErasureState.DONE
        assert len(await store.list_erasures()) == 2


async def test_a_cancelled_erasure_is_finished_by_the_next_call(
    store: cortex.Store,
    tenant: str,
    owner_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = f"{tenant}/big"
    with use_scope(root):
        created = [await store.create_session("bot") for _ in range(30)]
        for s in created[:10]:
            await store.append_messages(s.id, [NewMessage("user", "x")] * 3)
    await populate(store, f"{root}/rich", sessions=2)
    monkeypatch.setattr(erasure_calls, "BATCH_SESSIONS", 4)
    batches = 0
    halfway = anyio.Event()

    def on_batch(report: ErasureReport) -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            halfway.set()

    with use_scope(root):
        async with anyio.create_task_group() as tg:

            async def erase() -> None:
                await store.erase_scope(on_batch=on_batch)

            tg.start_soon(erase)
            await halfway.wait()
            tg.cancel_scope.cancel()
        (cut,) = await store.list_erasures()
        assert cut.state is ErasureState.RUNNING
        assert cut.finished_at is None
        assert 8 <= cut.sessions < 32
        left = await owner_conn.fetchval(
            "SELECT count(*) FROM sessions WHERE tenant_id = $1", tenant
        )
        assert left == 32 - cut.sessions
        done = await store.erase_scope()
    assert done.receipt is not None
    assert done.receipt.id == cut.id
    assert done.receipt.state is ErasureState.DONE
    assert done.receipt.sessions == 32
    assert done.receipt.messages == 30 + 4 + 5
    assert done.sessions == 32 - cut.sessions
    assert all(rows == [] for rows in (await stored(owner_conn, tenant, root)).values())
    with use_scope(root):
        assert len(await store.list_erasures()) == 1


async def test_an_erasure_races_appends_inside_and_outside_its_scope(
    store: cortex.Store,
    tenant: str,
    owner_conn: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, beside = f"{tenant}/u1", f"{tenant}/u10"
    monkeypatch.setattr(erasure_calls, "BATCH_SESSIONS", 3)
    with use_scope(root):
        inside = [await store.create_session("bot") for _ in range(12)]
    with use_scope(beside):
        outside = [await store.create_session("bot") for _ in range(3)]
    appended = {s.id: 0 for s in outside}
    refused = 0
    late: list[str] = []
    erasing = True

    async def append_outside(sid: str) -> None:
        with use_scope(beside):
            while erasing:
                await store.append_messages(sid, [NewMessage("user", "outside")])
                appended[sid] += 1

    async def append_inside(sid: str) -> None:
        nonlocal refused
        with use_scope(root):
            while erasing:
                try:
                    await store.append_messages(sid, [NewMessage("user", "inside")])
                except NotFound:
                    refused += 1
                    return
                await anyio.lowlevel.checkpoint()

    def on_batch(report: ErasureReport) -> None:
        tg.start_soon(create_late)

    async def create_late() -> None:
        with use_scope(f"{root}/late"):
            late.append((await store.create_session("bot")).id)

    async with anyio.create_task_group() as tg:
        for s in outside:
            tg.start_soon(append_outside, s.id)
        for s in inside:
            tg.start_soon(append_inside, s.id)
        await anyio.sleep(0.2)
        with use_scope(root):
            report = await store.erase_scope(on_batch=on_batch)
        erasing = False
    assert report.sessions >= 12
    assert refused == 12  # every inside writer found its session gone
    remaining = await owner_conn.fetch(
        "SELECT id FROM sessions WHERE tenant_id = $1 AND scope >= $2 AND scope < $3",
        tenant,
        root + "/",
        root + "0",
    )
    # Only sessions created after the call began may survive it.
    assert {r["id"] for r in remaining} <= {parse_id("ses", sid) for sid in late}
    with use_scope(beside):
        for s in outside:
            assert (await store.get_session(s.id)).message_count == appended[s.id] > 0
        for s in inside:
            with pytest.raises(NotFound):
                await store.get_session(s.id)


async def test_legacy_messages_outside_any_session_go_too(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """Rows an older release wrote that the backfill left unsessioned (e.g. a refused agent id)."""
    for scope in (f"{tenant}/u1", f"{tenant}/u1/t", f"{tenant}/u10", f"{tenant}/u1-x"):
        await owner_conn.execute(
            "INSERT INTO messages (tenant_id, id, role, content, created_at, agent_id, scope)"
            " VALUES ($1, gen_random_uuid(), 'user', 'legacy', now(), 'bot\u00a0x', $2)",
            tenant,
            scope,
        )
    with use_scope(f"{tenant}/u1"):
        assert (await store.erase_scope(dry_run=True)).messages == 2
        report = await store.erase_scope()
    assert report.messages == 2
    left = await owner_conn.fetch(
        "SELECT scope FROM messages WHERE tenant_id = $1 AND session_id IS NULL", tenant
    )
    assert sorted(r["scope"] for r in left) == [f"{tenant}/u1-x", f"{tenant}/u10"]
