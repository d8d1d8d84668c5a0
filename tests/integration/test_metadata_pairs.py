"""``metadata_pairs`` holds each session's pairs at its current hour, and pages read it newest hours first.

Revision 20261205000026's triggers write the table in the transaction that
writes the session: on create, fork and import, when the metadata changes,
when ``updated_at`` moves into another hour, and on delete and erase; an
append within the hour leaves it alone. A metadata-filtered page, with a
cursor, an offset, a bound or another filter that drops candidates, equals
the same page computed from every row, whatever hours the matches lie in.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from cortex.ids import parse_id
from tests.conftest import Database

pytestmark = pytest.mark.anyio

WEB = {"channel": "web"}

_PAIRS = """
SELECT m.hour, count(*) AS n FROM metadata_pairs AS m
WHERE m.tenant_id = $1 AND m.session_id = $2 GROUP BY m.hour ORDER BY m.hour
"""
_HOUR = "SELECT (floor(EXTRACT(epoch FROM updated_at) / 3600))::bigint FROM sessions"


async def _set_metadata(store: cortex.Store, sid: str, metadata: dict[str, Any]) -> None:
    session = await store.get_session(sid)
    await store.update_session(session.model_copy(update={"metadata": metadata}))


def parse_session_id(sid: str) -> uuid.UUID:
    return parse_id("ses", sid)


async def _pairs(owner_conn: asyncpg.Connection, tenant: str, sid: str) -> list[tuple[int, int]]:
    rows = await owner_conn.fetch(_PAIRS, tenant, parse_session_id(sid))
    return [(r["hour"], r["n"]) for r in rows]


async def _hour(owner_conn: asyncpg.Connection, tenant: str, sid: str) -> int:
    return int(
        await owner_conn.fetchval(
            _HOUR + " WHERE tenant_id = $1 AND id = $2", tenant, parse_session_id(sid)
        )
    )


async def test_the_pairs_follow_each_write_of_a_session(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{tenant}/app"):
        session = await store.create_session("bot", metadata={"channel": "web", "n": 1})
        hour = await _hour(owner_conn, tenant, session.id)
        assert await _pairs(owner_conn, tenant, session.id) == [(hour, 2)]
        plain = await store.create_session("bot")
        assert await _pairs(owner_conn, tenant, plain.id) == []

        # An append within the hour leaves the rows as they are (same row versions).
        before = await owner_conn.fetch(
            "SELECT xmin::text FROM metadata_pairs WHERE session_id = $1",
            parse_session_id(session.id),
        )
        await store.append_messages(session.id, [NewMessage(role="user", content="hi")])
        after = await owner_conn.fetch(
            "SELECT xmin::text FROM metadata_pairs WHERE session_id = $1",
            parse_session_id(session.id),
        )
        if await _hour(owner_conn, tenant, session.id) == hour:
            assert sorted(r[0] for r in before) == sorted(r[0] for r in after)

        await _set_metadata(store, session.id, {"channel": "email", "a": 1, "b": 2})
        hour = await _hour(owner_conn, tenant, session.id)
        assert await _pairs(owner_conn, tenant, session.id) == [(hour, 3)]
        assert [s.id for s in await store.list_sessions(ListFilter(metadata=WEB))] == []

        # updated_at moved into another hour (a write of an older release, say).
        await owner_conn.execute(
            "UPDATE sessions SET updated_at = updated_at - interval '5 hours'"
            " WHERE tenant_id = $1 AND id = $2",
            tenant,
            parse_session_id(session.id),
        )
        assert await _pairs(owner_conn, tenant, session.id) == [(hour - 5, 3)]
        await store.append_messages(session.id, [NewMessage(role="user", content="back")])
        hour = await _hour(owner_conn, tenant, session.id)
        assert await _pairs(owner_conn, tenant, session.id) == [(hour, 3)]

        fork = await store.fork_session(session.id)
        assert await _pairs(owner_conn, tenant, fork.id) == [
            (await _hour(owner_conn, tenant, fork.id), 3)
        ]
        await _set_metadata(store, session.id, {})
        assert await _pairs(owner_conn, tenant, session.id) == []
        await _set_metadata(store, session.id, {"channel": "web"})
        await store.delete_session(session.id)
        assert await _pairs(owner_conn, tenant, session.id) == []

        exported = [record async for record in store.export_scope()]
        await store.erase_scope()
        assert (
            await owner_conn.fetchval(
                "SELECT count(*) FROM metadata_pairs WHERE tenant_id = $1", tenant
            )
            == 0
        )
        await store.import_scope(exported)
        assert await _pairs(owner_conn, tenant, fork.id) == [
            (await _hour(owner_conn, tenant, fork.id), 3)
        ]


# Sessions across 60 hours, a fifth of them web, a third of those of agent a.
_SEED = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, scope_l2, scope_l3,
                      metadata_json, created_at, updated_at)
SELECT $1, gen_random_uuid(), 'agent-' || (g % 3), $1 || '/p' || (g % 2) || '/u' || (g % 7), 3,
       $1 || '/p' || (g % 2), $1 || '/p' || (g % 2) || '/u' || (g % 7),
       CASE WHEN g % 5 = 0 THEN '{"channel":"web","g":' || g || '}'
            ELSE '{"channel":"email"}' END::json,
       $2::timestamptz - (g * 97) * interval '1 minute' / 1.3,
       $2::timestamptz - (g * 97) * interval '1 minute' / 1.3
FROM generate_series(1, 2400) AS g
"""


def _expected(rows: list[dict[str, Any]], flt: ListFilter) -> list[str]:
    kept = [
        r
        for r in rows
        if r["metadata"].get("channel") == "web"
        and (flt.agent_id is None or r["agent_id"] == flt.agent_id)
        and (flt.updated_before is None or r["updated_at"] < flt.updated_before)
    ]
    kept.sort(key=lambda r: (r["updated_at"], r["id"]), reverse=True)
    return [r["sid"] for r in kept]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"agent_id": "agent-1"},
        {"updated_before": datetime(2026, 1, 1, 3, tzinfo=UTC) - timedelta(hours=20)},
    ],
    ids=["plain", "agent", "bounded"],
)
async def test_pages_across_hours_equal_the_pages_of_every_row(
    extra: dict[str, Any], store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    anchor = datetime(2026, 1, 1, 3, tzinfo=UTC)
    await owner_conn.execute(_SEED, tenant, anchor)
    with use_scope(tenant):
        every = await store.list_sessions(ListFilter(limit=1000))
        every += await store.list_sessions(ListFilter(limit=1000, offset=1000))
        every += await store.list_sessions(ListFilter(limit=1000, offset=2000))
    assert len(every) == 2400
    rows = [
        {
            "sid": s.id,
            "id": parse_session_id(s.id),
            "agent_id": s.agent_id,
            "metadata": s.metadata,
            "updated_at": s.updated_at,
        }
        for s in every
    ]
    with use_scope(tenant):
        for size in (1, 7, 50):
            flt = ListFilter(metadata=WEB, limit=size, **extra)
            want = _expected(rows, flt)
            got: list[str] = []
            cursor = None
            while True:
                page = await store.list_sessions_page(flt, cursor=cursor)
                got += [s.id for s in page.items]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert got == want
            walked = [s.id async for s in store.iter_sessions(flt)]
            assert walked == want
            for offset in (0, 3, 40, 130):
                page_by_offset = await store.list_sessions(
                    ListFilter(metadata=WEB, limit=size, offset=offset, **extra)
                )
                assert [s.id for s in page_by_offset] == want[offset : offset + size]
        assert await store.count_sessions(ListFilter(metadata=WEB, **extra)) == len(
            _expected(rows, ListFilter(metadata=WEB, **extra))
        )


async def test_concurrent_writes_leave_the_pairs_exact(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """Appends, metadata changes and deletes at once: each session's rows are its pairs at its hour."""
    with use_scope(f"{tenant}/app"):
        sessions = [
            await store.create_session("bot", metadata={"channel": "web", "i": i}) for i in range(8)
        ]

    async def churn(i: int) -> None:
        rng = random.Random(i)
        with use_scope(f"{tenant}/app"):
            for step in range(15):
                sid = sessions[rng.randrange(len(sessions))].id
                try:
                    if step % 3 == 0:
                        await _set_metadata(
                            store, sid, {"channel": rng.choice(["web", "email"]), "s": step}
                        )
                    else:
                        await store.append_messages(
                            sid, [NewMessage(role="user", content=f"{i}-{step}")]
                        )
                except cortex.NotFound:
                    pass

    await asyncio.gather(*(churn(i) for i in range(6)))
    wrong = await owner_conn.fetchval(
        """
        WITH want AS (
            SELECT s.tenant_id, p.pair, (floor(EXTRACT(epoch FROM s.updated_at) / 3600))::bigint AS hour,
                   s.id AS session_id
            FROM sessions AS s,
                 unnest(cortex_metadata_pairs(s.tenant_id, s.metadata_json, s.metadata)) AS p(pair)
            WHERE s.tenant_id = $1
        ), have AS (SELECT tenant_id, pair, hour, session_id FROM metadata_pairs WHERE tenant_id = $1)
        SELECT count(*) FROM ((TABLE want EXCEPT TABLE have) UNION ALL (TABLE have EXCEPT TABLE want)) AS d
        """,
        tenant,
    )
    assert wrong == 0
    with use_scope(f"{tenant}/app"):
        web = await store.list_sessions(ListFilter(metadata=WEB))
    assert all(s.metadata["channel"] == "web" for s in web)


async def test_a_tenant_never_reads_another_tenants_pairs(
    database: Database, store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    other = f"x{uuid.uuid4().hex[:10]}"
    with use_scope(other):
        await store.create_session("bot", metadata=WEB)
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        assert (
            await app_conn.fetchval(
                "SELECT count(*) FROM metadata_pairs WHERE tenant_id = $1", other
            )
            == 0
        )


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def test_a_new_hour_finds_the_old_rows_by_their_key(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """The update trigger's DELETE probes the key for each pair under a generic plan too.

    The routines run with ``plan_cache_mode = force_generic_plan``, which
    reaches the trigger. There a pair array in the condition was a filter
    over the tenant's whole range of the key, and, computed inline, hashed
    every key again for each row (3,845 keys: 18 s for the first append of
    an hour).
    """
    with use_scope(f"{tenant}/wide"):
        session = await store.create_session("bot", metadata={f"k{i}": i for i in range(50)})
    notes: list[str] = []

    def heard(_conn: Any, message: Any) -> None:
        notes.append(message.message)

    owner_conn.add_log_listener(heard)
    try:
        await owner_conn.execute("LOAD 'auto_explain'")
        async with owner_conn.transaction():
            for setting in (
                "plan_cache_mode = force_generic_plan",
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_nested_statements = on",
                "auto_explain.log_format = 'json'",
                "auto_explain.log_level = 'notice'",
            ):
                await owner_conn.execute(f"SET LOCAL {setting}")
            await owner_conn.execute(
                "UPDATE sessions SET updated_at = updated_at + interval '2 hours'"
                " WHERE tenant_id = $1 AND id = $2",
                tenant,
                parse_session_id(session.id),
            )
    finally:
        owner_conn.remove_log_listener(heard)
    plans = [json.loads(note.split("plan:", 1)[1]) for note in notes if "plan:" in note]
    deletes = [
        p["Plan"]
        for p in plans
        if p["Query Text"].lstrip().startswith("DELETE") and "metadata_pairs" in p["Query Text"]
    ]
    assert deletes, [p["Query Text"] for p in plans]
    scans = [
        node for plan in deletes for node in _nodes(plan) if node["Node Type"].endswith("Scan")
    ]
    # Every column of the key in the scan's condition: one probe a pair, no range read.
    assert scans, deletes
    for scan in scans:
        assert "Seq" not in scan["Node Type"], json.dumps(scan)
        assert "Filter" not in scan, json.dumps(scan)
        cond = str(scan.get("Index Cond", scan.get("Recheck Cond", "")))
        columns = ("tenant_id", "pair", "hour", "session_id")
        assert all(f"{column} = " in cond for column in columns), json.dumps(scan)
    hour = await _hour(owner_conn, tenant, session.id)
    assert await _pairs(owner_conn, tenant, session.id) == [(hour, 50)]


async def test_a_changed_session_id_moves_its_rows(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection, owner_conn: asyncpg.Connection
) -> None:
    """Raw SQL as the application role changing a session's id leaves no row behind."""
    with use_scope(f"{tenant}/moved"):
        session = await store.create_session("bot", metadata={"channel": "web", "n": 1})
    old, new = parse_session_id(session.id), uuid.uuid4()
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        await app_conn.execute(
            "UPDATE sessions SET id = $3 WHERE tenant_id = $1 AND id = $2", tenant, old, new
        )
    rows = await owner_conn.fetch(
        "SELECT session_id, count(*) AS n FROM metadata_pairs WHERE tenant_id = $1"
        " AND session_id = ANY($2::uuid[]) GROUP BY session_id",
        tenant,
        [old, new],
    )
    assert {(r["session_id"], r["n"]) for r in rows} == {(new, 2)}
