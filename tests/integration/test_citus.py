"""What holds only on a Citus cluster: the lane's own tests (``CORTEX_TEST_CITUS``).

Skipped outside the lane. On it, the throwaway database was migrated by
``cortex db upgrade`` alone (tests/conftest.py), and the store under test
refuses any statement Citus would fan out to more than one shard
(``citus.multi_task_query_log_level = error``), so every call these tests
make is also proof that it routed to one shard.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import pytest
from sqlalchemy.engine import make_url

import cortex
from cortex import ListFilter, NewMessage, use_scope
from cortex.cli import main
from tests import plans
from tests.conftest import (
    CITUS_URL,
    Database,
    admin,
    asyncpg_dsn,
    citus_workers,
    create_database,
    drop_database,
    store_url,
)
from tests.factories import agent

pytestmark = [
    pytest.mark.skipif(CITUS_URL is None, reason="the Citus lane only (CORTEX_TEST_CITUS)"),
    pytest.mark.citus,
]

_TABLES = [
    "console_actions",
    "erasures",
    "messages",
    "metadata_pairs",
    "pending_inputs",
    "retention_policies",
    "scope_data",
    "session_markers",
    "sessions",
]


async def test_upgrade_alone_distributes_every_table_colocated(
    owner_conn: asyncpg.Connection,
) -> None:
    rows = await owner_conn.fetch(
        "SELECT table_name::text AS name, citus_table_type AS kind,"
        " distribution_column AS column, colocation_id FROM citus_tables ORDER BY 1"
    )
    assert [r["name"] for r in rows] == _TABLES
    assert {r["kind"] for r in rows} == {"distributed"}
    assert {r["column"] for r in rows} == {"tenant_id"}
    assert len({r["colocation_id"] for r in rows}) == 1
    # Nothing cortex owns is left local on the coordinator but its revision table.
    local = await owner_conn.fetch(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace"
        " AND c.relkind = 'r' AND NOT EXISTS"
        " (SELECT FROM pg_dist_partition p WHERE p.logicalrelid = c.oid)"
    )
    # What only migrations and connect() read stays on the coordinator.
    assert sorted(r["relname"] for r in local) == ["alembic_version", "cortex_schema_compat"]


async def test_only_this_release_may_connect_to_a_distributed_database(
    owner_conn: asyncpg.Connection,
) -> None:
    """No trigger fills ``scope_l3`` for a release before …16 on Citus, so none connects.

    Later revisions serve …16's code (…17 moves a size check into cortex's
    statements; …16's code is held by the backstop it keeps; …18 makes the
    title index partial and keeps the functions' results).
    """
    from cortex._db.engine import SCHEMA_REVISION

    served = await owner_conn.fetchval("SELECT oldest_code_revision FROM cortex_schema_compat")
    assert served == "20261201000016"
    assert served <= SCHEMA_REVISION


def test_db_current_says_distributed(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", database.owner_url, "db", "current", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"distributed": true' in out
    assert "co-located" in out


async def test_many_tenants_land_on_both_workers_with_exact_counters(
    store: cortex.Store, owner_conn: asyncpg.Connection
) -> None:
    tenants = [f"t{uuid.uuid4().hex[:12]}" for _ in range(24)]

    async def work(tenant: str) -> None:
        with use_scope(f"{tenant}/proj"):
            session = await store.create_session(agent())
            for i in range(3):
                await store.append_messages(
                    session.id, [NewMessage("user", f"m{i}"), NewMessage("assistant", "r")]
                )
            await store.resolve_session(agent())

    async with anyio.create_task_group() as tg:
        for tenant in tenants:
            tg.start_soon(work, tenant)

    placed = await owner_conn.fetch(
        """
        SELECT s.tenant_id, n.nodeport
        FROM sessions s
        JOIN pg_dist_shard sh ON sh.shardid = get_shard_id_for_distribution_column('sessions', s.tenant_id)
        JOIN pg_dist_placement pl ON pl.shardid = sh.shardid
        JOIN pg_dist_node n ON n.groupid = pl.groupid
        WHERE s.tenant_id = ANY($1::text[])
        """,
        tenants,
    )
    ports = {r["nodeport"] for r in placed}
    assert ports == {port for _, port in citus_workers()}
    # Counters equal rows, tenant by tenant (each check a router query).
    for tenant in tenants:
        bad = await owner_conn.fetch(
            "SELECT s.id FROM sessions s LEFT JOIN messages m"
            " ON m.tenant_id = s.tenant_id AND m.session_id = s.id"
            " WHERE s.tenant_id = $1 GROUP BY s.id, s.message_count"
            " HAVING s.message_count <> count(m.id) OR coalesce(max(m.seq), 0) <> count(m.id)",
            tenant,
        )
        assert bad == []
        total = await owner_conn.fetchval(
            "SELECT sum(message_count) FROM sessions WHERE tenant_id = $1", tenant
        )
        assert total == 6


async def test_one_default_per_pair_under_a_race(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    bot = agent()
    with use_scope(f"{tenant}/race"):
        extra = [await store.create_session(bot) for _ in range(4)]

        async def resolve() -> None:
            await store.resolve_session(bot)

        async def switch(session_id: str) -> None:
            await store.set_default_session(session_id)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(resolve)
            for session in extra:
                tg.start_soon(switch, session.id)
        defaults = await store.list_sessions(ListFilter(default_only=True, exact=True))
    assert len(defaults) == 1
    assert (
        await owner_conn.fetchval(
            "SELECT count(*) FROM sessions WHERE tenant_id = $1 AND is_default", tenant
        )
        == 1
    )


async def test_a_duplicate_default_is_a_conflict_not_a_shard_name(
    store: cortex.Store, tenant: str
) -> None:
    bot = agent()
    with use_scope(tenant):
        await store.create_session(bot, is_default=True)
        with pytest.raises(cortex.Conflict, match="already has a default"):
            await store.create_session(bot, is_default=True)


async def test_search_across_a_tenant_finds_its_own_matches_only(
    store: cortex.Store, tenant: str
) -> None:
    other = f"t{uuid.uuid4().hex[:12]}"
    with use_scope(other):
        await store.create_session(agent(), title="the needle elsewhere")
    with use_scope(f"{tenant}/a"):
        mine = await store.create_session(agent(), title="a Needle here")
        await store.create_session(agent(), title="hay")
    with use_scope(tenant):
        found = await store.list_sessions(ListFilter(search="needle"))
        assert [s.id for s in found] == [mine.id]
        assert await store.count_sessions(ListFilter(search="needle")) == 1


async def test_tenant_search_runs_on_the_shards_trigram_index(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """The search function's own query, as installed, is one task served by the tenant's trigram index.

    50,000 sessions in the tenant, five matching: the shard's planner takes
    the tenant-led trigram indexes by itself (no planner setting forced). At
    5,000 it still reads the tenant's rows, which cost less there.
    """
    await owner_conn.execute(
        """
        INSERT INTO sessions (
            tenant_id, id, agent_id, scope, scope_depth, title, last_message, created_at, updated_at
        )
        SELECT $1, gen_random_uuid(), 'bot', $1, 1,
               CASE WHEN g % 10000 = 0 THEN 'a zanzibar trip ' ELSE 'hay stack ' END || g,
               'the last thing said, number ' || g,
               now(), now()
        FROM generate_series(1, 50000) AS g
        """,
        tenant,
    )
    await owner_conn.execute("ANALYZE sessions")
    source = await owner_conn.fetchval(
        "SELECT prosrc FROM pg_proc WHERE oid = 'cortex_tenant_search(text, text)'::regprocedure"
    )
    inner = source[source.index("ARRAY(") + len("ARRAY(") : source.rindex(")")]
    query = re.sub(r"\btenant\b", "$1", re.sub(r"\bpattern\b", "$2", inner))
    async with owner_conn.transaction():
        await owner_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
        explained = await owner_conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + query, tenant, "%zanzibar%"
        )
    plan = plans.parsed(explained)
    assert '"Task Count": 1' in json.dumps(plan)
    indexes = [str(node["Index Name"]) for node in plans.nodes(plan) if "Index Name" in node]
    assert any(name.startswith("ix_sessions_tenant_title_trgm_") for name in indexes), json.dumps(
        plan
    )[:2500]
    with use_scope(tenant):
        found = await store.list_sessions(ListFilter(search="ZANZIBAR", limit=10))
        assert len(found) == 5
        assert await store.count_sessions(ListFilter(search="zanzibar")) == 5


async def _every_public_call(store: cortex.Store, tenant: str) -> None:
    """Each store method once or more, with the statement shapes that differ by input."""
    from cortex.ids import SESSION_PREFIX, format_id

    bot = agent()
    with use_scope(f"{tenant}/team/user"):
        made = await store.create_session(bot, title="needle in a title", key="k1", data={"a": 1})
        chosen = format_id(SESSION_PREFIX, uuid.uuid4())
        await store.mark_interrupted(chosen, "parked before it exists")
        await store.create_session(bot, session_id=chosen, metadata={"m": 1})
        await store.create_session(bot, session_id=chosen, metadata={"m": 1})  # a retry
        default = await store.resolve_session(bot)
        await store.resolve_session(bot)
        await store.resolve_session(bot, key="k2")
        await store.set_default_session(made.id)
        await store.get_session(made.id)
        await store.get_session_by_key(bot, "k1")
        got = await store.get_session(default.id)
        await store.update_session(got.model_copy(update={"title": "renamed"}))
        await store.append_message(made.id, NewMessage("user", "one"))
        await store.append_messages(made.id, [NewMessage("user", f"m{i}") for i in range(5)])
        await store.append_messages(made.id, [NewMessage("user", f"b{i}") for i in range(40)])
        await store.append_messages(
            made.id, [NewMessage("user", "x")], data={"b": 2}, scope_data={tenant: {"u": 1}}
        )
        await store.append_messages(made.id, [NewMessage("user", "y")], expected_count=47)
        asked = cortex.RequestedInput(interrupt_id="q1", message="ok?")
        await store.append_message(made.id, NewMessage("assistant", "ok?", requested_input=asked))
        await store.inspect_session(made.id)
        await store.resume(made.id, "q1", {"ok": True})
        await store.append_message(
            made.id,
            NewMessage(
                "assistant",
                "again?",
                requested_input=asked.model_copy(update={"interrupt_id": "q2"}),
            ),
        )
        await store.pop_message(made.id)
        both = [asked.model_copy(update={"interrupt_id": i}) for i in ("q3", "q4")]
        await store.append_message(made.id, NewMessage("assistant", requested_inputs=both))
        answers = [cortex.FunctionResponse(id=i) for i in ("q3", "q4")]
        await store.append_message(made.id, NewMessage("user", function_responses=answers))
        count = (await store.get_session(made.id)).message_count
        await store.fork_session(made.id)  # q3 and q4 asked and answered
        await store.fork_session(made.id, through_seq=count - 1, title="q3, q4 open")
        await store.fork_session(made.id, through_seq=0)
        await store.rewind_session(made.id, to_seq=count - 1)  # re-opens q3 and q4
        await store.rewind_session(made.id, to_seq=count - 2)  # removes their question
        await store.list_messages(made.id, after_seq=3, limit=10)
        since = (await store.list_messages(made.id, limit=1))[0].created_at
        await store.list_messages(made.id, since=since)
        await store.recent_messages(made.id, limit=5)
        await store.get_session_with_messages(made.id, limit=5)
        await store.get_scope_data()
        await store.abort_session(default.id, "stop")
        await store.clear_interrupted(chosen)
        await store.clear_messages(chosen)
        await store.delete_session(chosen)
    for scope in (tenant, f"{tenant}/team", f"{tenant}/team/user"):
        with use_scope(scope):
            for flt in (
                ListFilter(),
                ListFilter(agent_id=bot, exact=True),
                ListFilter(default_only=True),
                ListFilter(search="needle"),
                ListFilter(agent_id=bot, search="needle", default_only=True),
                ListFilter(state=cortex.SessionState.PAUSED),
                ListFilter(limit=1, offset=1),
                ListFilter(metadata={"k": [1, {"a": None}], "n": 1}, agent_id=bot),
                ListFilter(created_after=since, updated_before=since + timedelta(days=1)),
            ):
                await store.list_sessions(flt)
                await store.count_sessions(flt)
            _ = [s async for s in store.iter_sessions(ListFilter(limit=1))]
            await store.erase_scope(dry_run=True)
            await store.list_erasures()
            _ = [r async for r in store.export_scope()]
    # A scope's lifecycle at each depth class: export, erase, import (twice: the compare).
    for scope in (f"{tenant}/team/user", f"{tenant}/team", tenant):
        with use_scope(scope):
            records = [r async for r in store.export_scope()]
            await store.erase_scope()
            await store.import_scope(records)
            await store.import_scope(records)


def _plan_problems(plan: object) -> list[str]:
    """What in a Citus plan is not a single-shard router query."""
    problems: list[str] = []
    for node in plans.nodes(plan):
        provider = node.get("Custom Plan Provider")
        if provider is not None and provider != "Citus Adaptive":
            problems.append(f"executed by {provider}")
        method = node.get("INSERT/SELECT method")
        if method is not None:
            problems.append(f"INSERT ... SELECT by {method}")
        if "Subplans" in node:
            problems.append("distributed subplans (run through the coordinator)")
        tasks = node.get("Task Count")
        if tasks is not None and tasks != 1:
            problems.append(f"{tasks} tasks")
    return problems


async def test_every_statement_is_a_single_shard_router_query(
    database: Database, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXPLAIN of every statement the store sends: one task, run by Citus's router, nothing via the coordinator.

    The store runs without its routines, so each statement is sent (and
    captured) as itself: a routine's body is the same statement. The strict
    lane already refuses fan-out; this also refuses the single-shard plans
    that go through the coordinator (``INSERT ... SELECT`` pulled there,
    distributed subplans).
    """
    from cortex._db import executor as _executor

    seen: dict[str, list[Any]] = {}
    original = _executor.Tx.execute

    async def capture(self: _executor.Tx, stmt: Any, params: Any = None) -> _executor.Result:
        compiled = _executor.compile_statement(stmt)
        given = params or {}
        args = [given[n] if n in given else compiled.fixed[n] for n in compiled.order]
        seen.setdefault(compiled.sql, args)
        return await original(self, stmt, params)

    monkeypatch.setattr(_executor.Tx, "execute", capture)
    async with cortex.connect(store_url(database)) as store:
        store._routines.clear()
        await _every_public_call(store, tenant)
    assert len(seen) > 40
    conn = await asyncpg.connect(asyncpg_dsn(database.app_url))
    problems: dict[str, list[str]] = {}
    try:
        for sql, args in seen.items():
            async with conn.transaction():
                await conn.execute(
                    "SET LOCAL citus.propagate_set_commands = 'local';"
                    f" SET LOCAL cortex.tenant = '{tenant}'"
                )
                explained = await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)
            found = _plan_problems(plans.parsed(explained))
            if found:
                problems[sql[:300]] = found
    finally:
        await conn.close()
    assert problems == {}


def test_downgrade_to_the_floor_and_back_and_no_further(server_url: str) -> None:
    """Every revision's downgrade runs on the cluster down to CITUS_FLOOR, and upgrade comes back.

    Below the floor the CLI refuses before any step runs (the schema there
    cannot be distributed by tenant), and the database stays where it was.
    """
    from cortex._db.engine import SCHEMA_REVISION
    from cortex.migrate import CITUS_FLOOR

    db = create_database(server_url)
    try:
        owner = db.owner_url
        assert main(["--database-url", owner, "db", "downgrade", "20260824000003"]) != 0
        assert asyncio.run(_revision(owner)) == SCHEMA_REVISION
        assert main(["--database-url", owner, "db", "downgrade", CITUS_FLOOR]) == 0
        assert asyncio.run(_revision(owner)) == CITUS_FLOOR
        assert main(["--database-url", owner, "db", "upgrade"]) == 0
        assert asyncio.run(_revision(owner)) == SCHEMA_REVISION
        assert asyncio.run(_distribution(owner)) == {(t, "distributed") for t in _TABLES}
    finally:
        drop_database(server_url, db)


async def _value(url: str, sql: str) -> object:
    """The one value ``sql`` reads, on a connection of its own."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def _revision(url: str) -> str:
    return str(await _value(url, "SELECT version_num FROM alembic_version"))


async def _distribution(url: str) -> set[tuple[str, str]]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT table_name::text, citus_table_type FROM citus_tables")
    finally:
        await conn.close()
    return {(r[0], r[1]) for r in rows}


async def test_small_and_large_batches_number_exactly(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    # Up to 32 messages append as two router statements, larger batches as one
    # statement through the coordinator: both number gap-free.
    with use_scope(tenant):
        session = await store.create_session(agent())
        small = await store.append_messages(session.id, [NewMessage("user", "a")] * 3)
        large = await store.append_messages(session.id, [NewMessage("user", "b")] * 40)
        again = await store.append_messages(session.id, [NewMessage("user", "c")])
    assert [m.seq for m in small + large + again] == list(range(1, 45))
    count = await owner_conn.fetchval(
        "SELECT message_count FROM sessions WHERE tenant_id = $1", tenant
    )
    assert count == 44


def _unmigrated_citus_database(server_url: str, *, citus: bool = True) -> Database:
    """A database on every node with the extension and the workers, and no revision applied.

    With ``citus=False`` the extension is left out (``conftest.make_citus`` adds it later).
    """
    import tests.conftest as conftest

    suffix = uuid.uuid4().hex[:10]
    name, role = f"cortex_t_{suffix}", f"cortex_app_{suffix}"
    nodes = [server_url] + [
        make_url(server_url).set(host=host, port=port).render_as_string(hide_password=False)
        for host, port in citus_workers()
    ]
    for node in nodes:
        asyncio.run(admin(node, f'CREATE DATABASE "{name}"', f'CREATE ROLE "{role}" LOGIN'))
    if citus:
        asyncio.run(conftest.make_citus(server_url, name))
    return Database(
        name,
        conftest.with_database(server_url, name),
        conftest.with_database(server_url, name, user=role),
        role,
    )


def _revisions() -> list[str]:
    """Every revision id, oldest first."""
    from alembic.script import ScriptDirectory

    from cortex.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def _db(url: str, *args: str) -> None:
    assert main(["--database-url", url, "db", *args]) == 0, args


def _legacy_conversations(tenants: list[str]) -> dict[tuple[str, str], list[str]]:
    """What the legacy release writes: (agent, scope) -> contents, a few per conversation."""
    return {
        ("bot", f"{tenant}/u{user}"): [f"{tenant} u{user} #{i}" for i in range(3)]
        for tenant in tenants
        for user in range(2)
    }


async def _conversations(url: str, tenants: list[str]) -> dict[tuple[str, str], list[str]]:
    """Each default session of the tenants, by (agent, scope): its messages' contents in seq order."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT s.agent_id, s.scope, s.message_count,"
            " array_agg(m.content ORDER BY m.seq) AS contents,"
            " array_agg(m.seq ORDER BY m.seq) AS seqs"
            " FROM sessions s JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id"
            " WHERE s.tenant_id = ANY($1::text[]) AND s.is_default"
            " GROUP BY s.tenant_id, s.id, s.agent_id, s.scope, s.message_count",
            tenants,
        )
        unsessioned = await conn.fetchval(
            "SELECT count(*) FROM messages WHERE tenant_id = ANY($1::text[]) AND session_id IS NULL",
            tenants,
        )
    finally:
        await conn.close()
    assert unsessioned == 0
    for row in rows:
        assert row["message_count"] == len(row["contents"])
        assert list(row["seqs"]) == list(range(1, len(row["seqs"]) + 1))
    return {(r["agent_id"], r["scope"]): list(r["contents"]) for r in rows}


async def _store_works(db: Database, legacy: dict[tuple[str, str], list[str]]) -> None:
    """As the application role, refusing fan-out: the legacy conversations read, new ones written."""
    from cortex.migrate import grant_sql

    await admin(db.owner_url, *grant_sql(db.app_role))
    async with cortex.connect(store_url(db)) as store:
        assert store.distributed
        for (bot, scope), contents in legacy.items():
            with use_scope(scope):
                default = await store.resolve_session(bot)
                assert [m.content for m in await store.list_messages(default.id)] == contents
                created = await store.create_session(agent())
                await store.append_messages(created.id, [NewMessage("user", "after the upgrade")])
                assert [m.content for m in await store.list_messages(created.id)] == [
                    "after the upgrade"
                ]
                listed = await store.list_sessions(ListFilter(exact=True))
                assert {s.id for s in listed} == {default.id, created.id}


@pytest.mark.parametrize("stepwise", [True, False], ids=["one-revision-at-a-time", "all-at-once"])
def test_a_legacy_database_upgrades_on_citus(server_url: str, stepwise: bool) -> None:
    """A fresh Citus database at the legacy schema, written by the legacy release, upgraded to head.

    The legacy release writes at 20260801000001 and, one revision at a time,
    at every revision below CITUS_FLOOR too (the revision's trigger fills
    the tenant), where nothing is distributed; one revision at a time, the
    pipeline also rolls back to the legacy schema and forward again there.
    At the head every cortex table is distributed and co-located, every
    legacy message is in its conversation's default session, and a store
    works.
    """
    from cortex._db.engine import SCHEMA_REVISION
    from cortex.migrate import CITUS_FLOOR
    from tests.migrations.legacy import insert_legacy

    tenants = [f"t{uuid.uuid4().hex[:12]}" for _ in range(3)]
    conversations = _legacy_conversations(tenants)
    rows = [
        (bot, scope, "user", text)
        for (bot, scope), texts in conversations.items()
        for text in texts
    ]
    db = _unmigrated_citus_database(server_url)
    try:
        revisions = _revisions()
        _db(db.owner_url, "upgrade", revisions[0])
        if stepwise:
            # Each conversation's first message at the legacy schema, the next
            # ones at each later revision below the floor.
            parts = [rows[k::3] for k in range(3)]
            insert_legacy(db.owner_url, parts[0])
            written = 1
            below = [rev for rev in revisions if rev < CITUS_FLOOR]
            for step in revisions[1:]:
                _db(db.owner_url, "upgrade", step)
                if step < CITUS_FLOOR:
                    assert asyncio.run(_distribution(db.owner_url)) == set()
                    insert_legacy(db.owner_url, parts[written], start=len(rows) * written)
                    written += 1
                if step == below[-1]:
                    for back in reversed(below[:-1]):
                        _db(db.owner_url, "downgrade", back)
                        assert asyncio.run(_distribution(db.owner_url)) == set()
                    for again in below[1:]:
                        _db(db.owner_url, "upgrade", again)
            assert written == len(parts)
        else:
            insert_legacy(db.owner_url, rows)
            _db(db.owner_url, "upgrade", "head")
        assert asyncio.run(_revision(db.owner_url)) == SCHEMA_REVISION
        _assert_distributed_and_intact(db, tenants, conversations)
    finally:
        drop_database(server_url, db)


def _assert_distributed_and_intact(
    db: Database, tenants: list[str], conversations: dict[tuple[str, str], list[str]]
) -> None:
    """Every table distributed in one co-location group, the legacy rows kept, the store working."""
    assert asyncio.run(_distribution(db.owner_url)) == {(t, "distributed") for t in _TABLES}
    assert asyncio.run(_colocation_groups(db.owner_url)) == 1
    assert asyncio.run(_conversations(db.owner_url, tenants)) == conversations
    asyncio.run(_store_works(db, conversations))


async def _colocation_groups(url: str) -> int:
    groups = await _value(url, "SELECT count(DISTINCT colocation_id) FROM citus_tables")
    assert isinstance(groups, int)
    return groups


def test_downgrade_and_upgrade_one_revision_at_a_time(server_url: str) -> None:
    """From the head down to CITUS_FLOOR and back up, one revision per run, on a distributed database."""
    from cortex.migrate import CITUS_FLOOR, grant_sql

    revisions = _revisions()
    floor = revisions.index(CITUS_FLOOR)
    tenant = f"t{uuid.uuid4().hex[:12]}"
    bot = agent()

    async def write() -> str:
        async with cortex.connect(store_url(db)) as store:
            with use_scope(f"{tenant}/u"):
                session = await store.create_session(bot, title="kept")
                await store.append_messages(session.id, [NewMessage("user", "one")])
                await store.append_messages(session.id, [NewMessage("assistant", "two")])
                return session.id

    async def read_and_write(session_id: str) -> None:
        await admin(db.owner_url, *grant_sql(db.app_role))
        async with cortex.connect(store_url(db)) as store:
            with use_scope(f"{tenant}/u"):
                contents = [m.content for m in await store.list_messages(session_id)]
                assert contents == ["one", "two"]
                await store.append_messages(session_id, [NewMessage("user", "three")])
                created = await store.create_session(bot)
                listed = await store.list_sessions(ListFilter(exact=True))
                assert {s.id for s in listed} == {session_id, created.id}
                assert (await store.get_session(session_id)).message_count == 3

    db = create_database(server_url)
    try:
        session_id = asyncio.run(write())
        for step in reversed(revisions[floor:-1]):
            _db(db.owner_url, "downgrade", step)
            assert asyncio.run(_revision(db.owner_url)) == step
        assert asyncio.run(_distribution(db.owner_url)) == {
            ("messages", "distributed"),
            ("sessions", "distributed"),
        }
        for step in revisions[floor + 1 :]:
            _db(db.owner_url, "upgrade", step)
        assert asyncio.run(_distribution(db.owner_url)) == {(t, "distributed") for t in _TABLES}
        assert asyncio.run(_colocation_groups(db.owner_url)) == 1
        asyncio.run(read_and_write(session_id))
    finally:
        drop_database(server_url, db)


@pytest.mark.parametrize("migrated_to", ["20260901000005", "20261201000010", "head"])
def test_citus_added_to_a_migrated_database_then_upgraded(
    server_url: str, migrated_to: str
) -> None:
    """Migrated as plain PostgreSQL, holding legacy rows, then made a Citus database and upgraded.

    The revisions that create a table co-locate it with a ``sessions`` that
    a plain migration left local, and the shards call functions made before
    the extension.
    """
    import tests.conftest as conftest
    from cortex.migrate import upgrade
    from tests.migrations.legacy import insert_legacy

    tenants = [f"t{uuid.uuid4().hex[:12]}"]
    conversations = _legacy_conversations(tenants)
    rows = [(b, s, "user", text) for (b, s), texts in conversations.items() for text in texts]
    db = _unmigrated_citus_database(server_url, citus=False)
    try:
        upgrade(db.owner_url, "20260801000001")
        insert_legacy(db.owner_url, rows)
        upgrade(db.owner_url, migrated_to)
        asyncio.run(conftest.make_citus(server_url, db.name))
        _db(db.owner_url, "upgrade")
        _assert_distributed_and_intact(db, tenants, conversations)
    finally:
        drop_database(server_url, db)


def test_backfill_refuses_a_distributed_database(
    server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Legacy rows are sessioned before the tables are distributed; later, nothing can add any."""
    from cortex.migrate import backfill

    db = _unmigrated_citus_database(server_url)
    try:
        _db(db.owner_url, "upgrade")
        with pytest.raises(cortex.InvalidInput, match="distributed"):
            backfill(db.owner_url)
        assert main(["--database-url", db.owner_url, "db", "backfill"]) != 0
        assert "distributed" in capsys.readouterr().err
    finally:
        drop_database(server_url, db)
