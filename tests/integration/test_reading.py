"""Reading a conversation back: the newest N in order, paging backwards, session with history."""

from __future__ import annotations

import gc
import itertools
import json
import secrets
import tracemalloc
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope
from cortex._db.executor import compile_statement
from tests import plans

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20]


async def _conversation(store: cortex.Store, n: int) -> str:
    session = await store.create_session("bot")
    await store.append_messages(session.id, [NewMessage("user", f"m{i}") for i in range(1, n + 1)])
    return session.id


async def test_newest_n_in_order_and_paging_backwards(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 7)
        newest = await store.recent_messages(sid, limit=3)
        assert [m.content for m in newest] == ["m5", "m6", "m7"]
        older = await store.recent_messages(sid, limit=3, before_seq=newest[0].seq)
        assert [m.seq for m in older] == [2, 3, 4]
        oldest = await store.recent_messages(sid, limit=3, before_seq=older[0].seq)
        assert [m.seq for m in oldest] == [1]
        assert await store.recent_messages(sid, before_seq=1) == []
        everything = await store.recent_messages(sid)  # default limit covers all 7
        assert [m.seq for m in everything] == list(range(1, 8))
        # 0 is the default page, as in ListFilter: one rule for every limit.
        assert await store.recent_messages(sid, limit=0) == everything
        assert await store.list_messages(sid, limit=0) == everything
        assert (await store.get_session_with_messages(sid, limit=0)).messages == everything


async def test_walking_back_sees_every_message_once(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 25)
        seen: list[int] = []
        before: int | None = None
        while page := await store.recent_messages(sid, limit=4, before_seq=before):
            seen = [m.seq for m in page] + seen
            before = page[0].seq
    assert seen == list(range(1, 26))


async def test_empty_session_and_invisible_session(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    with use_scope(tenant):
        empty = await store.create_session("bot")
        assert await store.recent_messages(empty.id) == []
        session, history = await store.get_session_with_messages(empty.id)
        assert session.id == empty.id
        assert history == []
        sid = await _conversation(store, 2)
    with use_scope(other_tenant):
        with pytest.raises(cortex.NotFound):
            await store.recent_messages(sid)
        with pytest.raises(cortex.NotFound):
            await store.get_session_with_messages(sid)


_BAD: list[dict[str, object]] = [
    {"limit": -1},
    {"limit": 1001},
    {"limit": True},
    {"before_seq": 0},
    {"before_seq": -1},
    {"before_seq": 2**31},
    {"before_seq": "5"},
]


async def test_bad_arguments_are_invalid_input(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = await _conversation(store, 1)
        for bad in _BAD:
            with pytest.raises(cortex.InvalidInput):
                await store.recent_messages(sid, **bad)  # type: ignore[arg-type]  # deliberately wrong
            if "limit" in bad:
                with pytest.raises(cortex.InvalidInput):
                    await store.get_session_with_messages(sid, **bad)  # type: ignore[arg-type]  # deliberately wrong


async def test_session_with_messages_is_one_consistent_read(
    store: cortex.Store, tenant: str
) -> None:
    """The counter and the messages come from one snapshot, even under concurrent appends."""
    with use_scope(tenant):
        sid = await _conversation(store, 3)
        session, history = await store.get_session_with_messages(sid, limit=2)
        assert session.message_count == 3
        assert [m.content for m in history] == ["m2", "m3"]
        assert session.last_message == "m3"

        mismatches = 0

        async def writer() -> None:
            for i in range(30):
                await store.append_message(sid, NewMessage("user", f"w{i}"))

        async def reader() -> None:
            nonlocal mismatches
            for _ in range(30):
                s, h = await store.get_session_with_messages(sid, limit=1)
                mismatches += h[-1].seq != s.message_count

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            tg.start_soon(reader)
    assert mismatches == 0


async def _history_peak(store: cortex.Store, sid: str, limit: int) -> int:
    """Peak bytes Python allocated while ``get_session_with_messages`` read ``limit`` messages."""
    await store.get_session_with_messages(sid, limit=limit)  # statements prepared, pool warm
    gc.collect()
    tracemalloc.start()
    try:
        _, history = await store.get_session_with_messages(sid, limit=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(history) == limit
    return peak


async def test_a_history_carries_the_state_once_not_once_per_message(
    store: cortex.Store, tenant: str
) -> None:
    """A session's merged state comes back on one row of the read, whatever its length."""
    document = {f"k{i}": {"blob": secrets.token_hex(8_000)} for i in range(32)}
    size = len(json.dumps(document))
    with use_scope(f"{tenant}/team/user"):
        made = await store.create_session("bot", scope_data={tenant: document})
        await store.append_messages(made.id, [NewMessage("user", f"m{i}") for i in range(200)])
        ten = await _history_peak(store, made.id, 10)
        many = await _history_peak(store, made.id, 200)
        session, _ = await store.get_session_with_messages(made.id, limit=200)
    assert session.data == document
    # Twenty times the messages: the document is still read and decoded once.
    assert many < 3 * ten, (ten, many)
    assert many < 32 * size, (size, many)


# --- the tail after a timestamp -----------------------------------------------------


async def test_since_matches_a_filter_over_every_message(store: cortex.Store, tenant: str) -> None:
    """``since`` gives exactly the messages created after it, at every boundary, with ties.

    Messages of one append share a created_at; the search for the boundary
    must land after the last of them whatever the batch sizes.
    """
    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        for size in [1, 3, 1, 2, 1, 1, 4, 1, 2, 1, 1, 3, 1]:
            await store.append_messages(sid, [NewMessage("user", "x")] * size)
        everything = await store.list_messages(sid, limit=1000)
        times = sorted({m.created_at for m in everything})
        probes = [times[0] - timedelta(seconds=1), *times]
        probes += [a + (b - a) / 2 for a, b in itertools.pairwise(times)]
        for since in probes:
            expected = [m.seq for m in everything if m.created_at > since]
            got = await store.list_messages(sid, since=since, limit=1000)
            assert [m.seq for m in got] == expected, since
            # after_seq and limit still apply on top of the boundary
            for after_seq in (0, 5, 12, len(everything)):
                page = await store.list_messages(sid, since=since, after_seq=after_seq, limit=3)
                assert [m.seq for m in page] == [s for s in expected if s > after_seq][:3]
        # After a pop and a clear, seq runs from 1 again without a gap.
        await store.pop_message(sid)
        last = (await store.list_messages(sid, limit=1000))[-1]
        assert await store.list_messages(sid, since=last.created_at) == []
        await store.clear_messages(sid)
        fresh = await store.append_messages(sid, [NewMessage("user", "y")] * 2)
        assert [m.seq for m in await store.list_messages(sid, since=times[-1])] == [1, 2]
        assert await store.list_messages(sid, since=fresh[-1].created_at) == []


async def test_since_reads_the_tail_not_the_history(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    """The boundary is searched for in the seq index: a tail read touches a few dozen rows of 3,000."""
    from cortex._sql.messages import page_statement
    from cortex._sql.predicates import depth_class, scope_params
    from cortex.ids import parse_id
    from cortex.scope import Scope

    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        for _ in range(30):
            await store.append_messages(sid, [NewMessage("user", "x")] * 100)
        since = (await store.list_messages(sid, after_seq=2899, limit=1))[0].created_at
        tail = await store.list_messages(sid, since=since, limit=5)
        assert [m.seq for m in tail] == [2901, 2902, 2903, 2904, 2905]
        boundary = (await store.list_messages(sid, after_seq=2499, limit=1))[0].created_at
    scope = Scope.parse(tenant)
    compiled = compile_statement(page_statement(depth_class(scope), newest_first=False, since=True))
    params = {
        **scope_params(scope),
        "target_id": parse_id("ses", sid),
        "after_seq": 0,
        "limit": 10,
        "since": boundary,
    }
    args = [params[name] if name in params else compiled.fixed[name] for name in compiled.order]
    async with app_conn.transaction():
        # The binding as cortex sends it (cortex._db.transaction.begin_sql), which reaches Citus's workers too.
        await app_conn.execute(
            f"SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL cortex.tenant = '{tenant}'"
        )
        rows = await app_conn.fetch(compiled.sql, *args)
        assert [r["seq"] for r in rows] == list(range(2501, 2511))
        explained = await app_conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.sql, *args)
    # About log2(3,000) probes plus the page; a walk from the first message reads 2,510.
    assert plans.rows_read(plans.parsed(explained), "messages") <= 40


# --- a default-only page across a whole tenant ------------------------------------------


# Each case: the sessions (tenant, id, agent, scope, depth, scope_l2), the
# listed scope (under the tenant), the filter. The whole tenant is revision
# …14's; the exact scope (one scope, many agents), the depth-2 project and an
# agent across a project are …15's.
_DEFAULT_ONLY_CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "tenant": ("'bot', $1 || '/s' || g, 2, $1 || '/s' || g", "", {}),
    "exact scope": ("'bot' || g, $1 || '/p', 2, $1 || '/p'", "/p", {"exact": True}),
    "project": ("'bot', $1 || '/p/u' || g, 3, $1 || '/p'", "/p", {}),
    "agent": ("'bot' || (g % 2), $1 || '/p/u' || g, 3, $1 || '/p'", "/p", {"agent_id": "bot0"}),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(_DEFAULT_ONLY_CASES))
async def test_default_only_page_reads_only_defaults(
    case: str, tenant: str, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """is_default is tested on the listing index's entry, not on each session's row.

    4,000 sessions, one in 20 a default: the page reads defaults only
    (before revision …14, about 19 rows per default across a tenant; before
    …15, a scope's, a project's or an agent's page read and sorted every
    default of the tenant, or read rows to drop them).
    """
    rows, below, options = _DEFAULT_ONLY_CASES[case]
    await _default_only_reads_only_defaults(
        owner_conn,
        app_conn,
        tenant,
        f"SELECT $1, gen_random_uuid(), {rows}",
        tenant + below,
        cortex.ListFilter(default_only=True, limit=50, **options),
    )


async def _default_only_reads_only_defaults(
    owner_conn: asyncpg.Connection,
    app_conn: asyncpg.Connection,
    tenant: str,
    rows: str,
    path: str,
    flt: cortex.ListFilter,
) -> None:
    """4,000 sessions from ``rows`` (tenant, id, agent, scope, depth, scope_l2), one in 20 a
    default; the default-only page at ``path`` reads no session row only to drop it.
    """
    from cortex.scope import Scope

    await owner_conn.execute(
        f"""
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2,
                              is_default, created_at, updated_at)
        {rows}, g % 20 = 0, now(), now() - g * interval '1 second'
        FROM generate_series(1, 4000) AS g
        """,
        tenant,
    )
    # 16,000 defaults elsewhere in the tenant: reading all the tenant's defaults
    # through uq_sessions_default and sorting them is then no cheaper plan than
    # the walk (with only the 200 defaults above, it can be).
    await owner_conn.execute(
        """
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2,
                              is_default, created_at, updated_at)
        SELECT $1, gen_random_uuid(), $2, $1 || '/elsewhere/u' || g, 3,
               $1 || '/elsewhere', true, now(), now() - g * interval '1 second'
        FROM generate_series(1, 16000) AS g
        """,
        tenant,
        flt.agent_id or "other",
    )
    # As cortex writes it (on plain PostgreSQL a trigger would; Citus has none).
    await owner_conn.execute(
        "UPDATE sessions SET scope_l3 = split_part(scope, '/', 1) || '/' || split_part(scope, '/', 2)"
        " || '/' || split_part(scope, '/', 3) WHERE tenant_id = $1 AND scope_depth >= 3",
        tenant,
    )
    await owner_conn.execute("ANALYZE sessions")
    found, parsed = await plans.explain_page(app_conn, Scope.parse(path), flt)
    assert len(found) == flt.page_size
    assert all(row["is_default"] for row in found)
    # One ordered walk of a listing index that tests the flag on its entries:
    # no session row is read only to find it is no default, and the page never
    # reads and sorts all the tenant's defaults. Before revision …15 a
    # default-only page of a scope, a project or an agent did one or the other.
    assert not [node for node in plans.nodes(parsed) if node.get("Node Type") == "Sort"]
    scans = plans.scans(parsed, "sessions")
    assert scans
    for scan in scans:
        assert str(scan.get("Index Name", "")).startswith("ix_sessions_"), scan
        assert "is_default" not in str(scan.get("Filter", "")), scan
