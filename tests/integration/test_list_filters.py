"""Listing by metadata and by time: ListFilter's ``metadata`` and its four time bounds.

A metadata filter holds a session whose metadata has every given top-level
key with exactly that JSON value: objects equal whatever their key order,
numbers equal by value, ``true`` never ``1``, ``null`` never a missing key,
and an array or object never "contains" its way to a match. The time bounds
are exclusive and timezone-aware. Both combine with every other filter, in
``list_sessions``, ``count_sessions`` and ``iter_sessions`` alike, and never
show a session of another tenant or scope, also to raw SQL as the plain
application role. In the Citus lane every call here is a single-shard router
query (the lane's store refuses fan-out), and each filtered shape's plan is
checked to be one.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import InvalidInput, ListFilter, NewMessage, SessionState, use_scope
from cortex._db.executor import compile_statement
from cortex._sql.predicates import filter_params, filter_shape
from cortex._sql.sessions import count_statement, page_statement
from cortex.models import MAX_METADATA_FILTER_KEYS
from cortex.scope import Scope
from tests import plans
from tests.conftest import CITUS_URL, Database


@pytest.fixture(scope="module")
def database(module_database: Database) -> Database:
    # The planner's choices here follow the statistics of every session in the database.
    return module_database


pytestmark = [pytest.mark.anyio, pytest.mark.citus]

# Key names a careless statement builder would splice into SQL or a JSON path.
HOSTILE_KEYS = [
    "'; DROP TABLE sessions; --",
    "a') OR true --",
    'channel" : "web',
    "{a,b}",
    "a.b",
    "$.channel",
    "",
    " ",
    "ключ",
    "\\",
    "%",
]


async def _ids(store: cortex.Store, flt: ListFilter) -> list[str]:
    return [s.id for s in await store.list_sessions(flt)]


async def _walked(store: cortex.Store, flt: ListFilter) -> list[str]:
    return [s.id async for s in store.iter_sessions(flt)]


async def _every_way(store: cortex.Store, flt: ListFilter) -> set[str]:
    """The sessions a filter finds, checked to agree across list, count and iter."""
    listed = await _ids(store, flt.model_copy(update={"limit": 1000}))
    walked = await _walked(store, flt.model_copy(update={"limit": 2}))
    assert walked == listed
    assert await store.count_sessions(flt) == len(listed)
    return set(listed)


async def test_metadata_matches_json_values_key_by_key(store: cortex.Store, tenant: str) -> None:
    stored: dict[str, dict[str, Any]] = {
        "web": {"channel": "web", "n": 1},
        "web-float": {"channel": "web", "n": 1.0},
        "web-space": {"channel": "web "},
        "email": {"channel": "email"},
        "none": {},
        "null": {"channel": None},
        "true": {"flag": True},
        "one": {"flag": 1},
        "zero": {"flag": 0},
        "false": {"flag": False},
        "list": {"tags": [1, 2]},
        "list-reversed": {"tags": [2, 1]},
        "object": {"customer": {"tier": "gold", "region": {"eu": [1, {"a": None}]}}},
        "object-more": {"customer": {"tier": "gold", "region": {"eu": [1, {"a": None}]}, "x": 1}},
        "big": {"n": 10**30},
        "unicode": {"name": "café ☕"},
        "string-one": {"n": "1"},
    }
    ids: dict[str, str] = {}
    with use_scope(f"{tenant}/app"):
        for name, metadata in stored.items():
            ids[name] = (await store.create_session("bot", title=name, metadata=metadata)).id

        async def found(metadata: dict[str, Any]) -> set[str]:
            got = await _every_way(store, ListFilter(metadata=metadata))
            by_id = {v: k for k, v in ids.items()}
            return {by_id[i] for i in got}

        assert await found({"channel": "web"}) == {"web", "web-float"}
        assert await found({"channel": "web", "n": 1}) == {"web", "web-float"}
        assert await found({"channel": "web", "n": 1.0}) == {"web", "web-float"}
        assert await found({"n": 1}) == {"web", "web-float"}
        assert await found({"n": 1e30}) == {"big"}
        assert await found({"n": 10**30}) == {"big"}
        assert await found({"n": "1"}) == {"string-one"}
        # true is not 1, false is not 0, and neither is null.
        assert await found({"flag": True}) == {"true"}
        assert await found({"flag": 1}) == {"one"}
        assert await found({"flag": False}) == {"false"}
        assert await found({"flag": 0}) == {"zero"}
        # null matches a key holding null, never a missing key.
        assert await found({"channel": None}) == {"null"}
        # Arrays are equal element by element, in order; never "contained".
        assert await found({"tags": [1, 2]}) == {"list"}
        assert await found({"tags": [2, 1]}) == {"list-reversed"}
        assert await found({"tags": [1]}) == set()
        assert await found({"tags": 1}) == set()
        # Objects are equal whatever their key order, at every depth; a part is no match.
        reordered = {"region": {"eu": [1, {"a": None}]}, "tier": "gold"}
        assert await found({"customer": reordered}) == {"object"}
        assert await found({"customer": {"tier": "gold"}}) == set()
        assert await found({"customer": {"region": {"eu": [1]}, "tier": "gold"}}) == set()
        assert await found({"name": "café ☕"}) == {"unicode"}
        assert await found({"channel": "web", "flag": True}) == set()
        assert await found({"missing": None}) == set()
        assert await found({}) == set(stored)


async def test_hostile_keys_are_keys(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        made = {
            key: (await store.create_session("bot", metadata={key: "v", "other": key})).id
            for key in HOSTILE_KEYS
        }
        plain = await store.create_session("bot", metadata={"a": {"b": "v"}, "channel": "web"})
        for key, sid in made.items():
            assert await _every_way(store, ListFilter(metadata={key: "v"})) == {sid}, key
            assert await _every_way(store, ListFilter(metadata={"other": key})) == {sid}, key
        # No path syntax: "a.b" and "{a,b}" are keys, not a way into {"a": {"b": ...}}.
        assert await _every_way(store, ListFilter(metadata={"a": {"b": "v"}})) == {plain.id}
        assert await store.count_sessions() == len(HOSTILE_KEYS) + 1


async def test_a_large_value_within_the_limit_matches(store: cortex.Store, tenant: str) -> None:
    big = {"blob": "x" * 60_000, "list": list(range(500))}
    with use_scope(tenant):
        session = await store.create_session("bot", metadata=big)
        await store.create_session("bot", metadata={"blob": "x" * 59_999})
        assert await _every_way(store, ListFilter(metadata=big)) == {session.id}
        assert await _every_way(store, ListFilter(metadata={"blob": big["blob"]})) == {session.id}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata", ["channel", "web"]),
        ("metadata", "channel=web"),
        ("metadata", {1: "web"}),
        ("metadata", {"k": {1: "nested key not a string"}}),
        ("metadata", {"k": float("nan")}),
        ("metadata", {"k": math.inf}),
        ("metadata", {"k": {1, 2}}),
        ("metadata", {"k": object()}),
        ("metadata", {"k": b"bytes"}),
        ("metadata", {"k": "\x00"}),
        ("metadata", {"\x00": 1}),
        ("metadata", {"a\x00b": 1}),
        ("metadata", {"k": "\ud800"}),
        ("metadata", {"k": "x" * (64 * 1024)}),
        ("metadata", {f"k{i}": i for i in range(MAX_METADATA_FILTER_KEYS + 1)}),
        ("created_after", datetime(2026, 1, 1)),  # noqa: DTZ001  # naive on purpose
        ("created_before", datetime(2026, 1, 1)),  # noqa: DTZ001
        ("updated_after", datetime.now()),  # noqa: DTZ005
        ("updated_before", datetime.utcnow()),  # noqa: DTZ003
        ("updated_after", "2026-01-01T00:00:00+00:00"),
        ("updated_after", date(2026, 1, 1)),
        ("created_after", 1_700_000_000),
        ("created_after", datetime.min.replace(tzinfo=timezone(timedelta(hours=1)))),
        ("created_before", datetime.max.replace(tzinfo=timezone(timedelta(hours=-1)))),
    ],
)
async def test_bad_input_is_invalid_before_any_sql(
    store: cortex.Store, tenant: str, field: str, value: Any
) -> None:
    with pytest.raises(InvalidInput, match=field):
        ListFilter(**{field: value})
    # A filter forged past its own validation is refused at the store's boundary
    # (tests/unit/test_refused_before_sql.py: before any SQL).
    forged = ListFilter.model_construct(**{field: value})
    with use_scope(tenant):
        for call in (store.list_sessions, store.count_sessions):
            with pytest.raises(InvalidInput, match=field):
                await call(forged)
        with pytest.raises(InvalidInput, match=field):
            store.iter_sessions(forged)


async def test_a_filter_changed_after_validation_is_checked_again(
    store: cortex.Store, tenant: str
) -> None:
    flt = ListFilter(metadata={"k": "v"})
    assert flt.metadata is not None
    flt.metadata["k"] = "x" * (64 * 1024)
    with use_scope(tenant), pytest.raises(InvalidInput, match="metadata"):
        await store.list_sessions(flt)


async def test_legacy_metadata_is_filtered_as_it_reads(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """A row written before the verbatim column reads its jsonb; a row with both reads the json."""
    with use_scope(tenant):
        legacy = await store.create_session("bot", title="legacy")
        newer = await store.create_session("bot", title="newer", metadata={"channel": "web"})
    await owner_conn.execute(
        'UPDATE sessions SET metadata_json = NULL, metadata = \'{"channel": "web", "n": 1.0}\''
        " WHERE tenant_id = $1 AND title = 'legacy'",
        tenant,
    )
    # A stale jsonb copy beside the verbatim text, both written at once (the
    # trigger forgets the text only when a write changes the jsonb alone, as
    # an older release's does): the text is what the session shows.
    await owner_conn.execute(
        'UPDATE sessions SET metadata = \'{"channel": "email", "stale": true}\','
        " metadata_json = '{\"channel\": \"web\"}' WHERE tenant_id = $1 AND title = 'newer'",
        tenant,
    )
    with use_scope(tenant):
        assert (await store.get_session(legacy.id)).metadata == {"channel": "web", "n": 1.0}
        assert (await store.get_session(newer.id)).metadata == {"channel": "web"}
        web = await _every_way(store, ListFilter(metadata={"channel": "web"}))
        assert web == {legacy.id, newer.id}
        assert await _every_way(store, ListFilter(metadata={"n": 1})) == {legacy.id}
        assert await _every_way(store, ListFilter(metadata={"channel": "email"})) == set()
        assert await _every_way(store, ListFilter(metadata={"stale": True})) == set()


async def _at(
    owner_conn: asyncpg.Connection, tenant: str, sid: str, created: Any, updated: Any
) -> None:
    from cortex.ids import SESSION_PREFIX, parse_id

    await owner_conn.execute(
        "UPDATE sessions SET created_at = $3, updated_at = $4 WHERE tenant_id = $1 AND id = $2",
        tenant,
        parse_id(SESSION_PREFIX, sid),
        created,
        updated,
    )


async def test_time_bounds_are_exclusive_and_combine(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    t0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
    hour = timedelta(hours=1)
    ids = []
    with use_scope(tenant):
        for i in range(5):
            ids.append((await store.create_session("bot", title=f"s{i}")).id)
    # Session i: created at t0 + i h, last active at t0 + (10 + i) h.
    for i, sid in enumerate(ids):
        await _at(owner_conn, tenant, sid, t0 + i * hour, t0 + (10 + i) * hour)
    # The same instant at another offset is the same bound.
    plus_two = timezone(timedelta(hours=2))
    with use_scope(tenant):

        async def found(**bounds: Any) -> list[int]:
            got = await _every_way(store, ListFilter(**bounds))
            return sorted(ids.index(i) for i in got)

        assert await found(created_after=t0 + hour) == [2, 3, 4]
        assert await found(created_after=(t0 + hour).astimezone(plus_two)) == [2, 3, 4]
        assert await found(created_before=t0 + 3 * hour) == [0, 1, 2]
        assert await found(created_after=t0, created_before=t0 + 4 * hour) == [1, 2, 3]
        assert await found(updated_after=t0 + 12 * hour) == [3, 4]
        assert await found(updated_before=t0 + 12 * hour) == [0, 1]
        assert await found(updated_after=t0 + 10 * hour, updated_before=t0 + 14 * hour) == [
            1,
            2,
            3,
        ]
        assert await found(created_after=t0 + hour, updated_before=t0 + 14 * hour) == [2, 3]
        # One microsecond either side of a session's own instant.
        tick = timedelta(microseconds=1)
        assert await found(
            created_after=t0 + 2 * hour - tick, created_before=t0 + 2 * hour + tick
        ) == [2]
        # A window whose after is not before its before is allowed and empty.
        assert await found(created_after=t0 + 2 * hour, created_before=t0 + 2 * hour) == []
        assert await found(updated_after=t0 + 20 * hour, updated_before=t0) == []
        # Listed newest activity first, as ever.
        listed = await _ids(store, ListFilter(created_after=t0))
        assert listed == [ids[4], ids[3], ids[2], ids[1]]


async def test_filters_combine_with_every_other_filter_and_page_correctly(
    store: cortex.Store, tenant: str
) -> None:
    t_start = datetime.now(UTC)
    expected: dict[str, set[str]] = {}
    with use_scope(tenant):
        for i in range(30):
            scope = f"{tenant}/team{i % 2}/user{i % 3}"
            agent = f"bot{i % 2}"
            channel = "web" if i % 3 else "email"
            with use_scope(scope):
                s = await store.create_session(
                    agent,
                    title=("needle " if i % 4 == 0 else "") + f"s{i}",
                    metadata={"channel": channel, "i": i, "even": i % 2 == 0},
                    is_default=i in (0, 2, 4),
                )
                if i % 5 == 0:
                    await store.append_message(s.id, NewMessage("user", "needle in the message"))
            expected.setdefault(channel, set()).add(s.id)
        mid = datetime.now(UTC)
        # A second wave, active after ``mid``.
        late = set()
        for _ in range(6):
            with use_scope(f"{tenant}/team0/user0"):
                s = await store.create_session("bot0", metadata={"channel": "web", "late": True})
                late.add(s.id)
        web = await _every_way(store, ListFilter(metadata={"channel": "web"}))
        assert web == expected["web"] | late
        assert (
            await _every_way(store, ListFilter(metadata={"channel": "web"}, updated_after=mid))
            == late
        )
        assert (
            await _every_way(store, ListFilter(metadata={"channel": "web"}, updated_before=mid))
            == expected["web"]
        )
        assert await _every_way(store, ListFilter(created_after=t_start, created_before=mid)) == (
            expected["web"] | expected["email"]
        )
        everyone = await store.list_sessions(ListFilter(limit=1000))
        by_id = {s.id: s for s in everyone}

        def want(pred: Any) -> set[str]:
            return {s.id for s in everyone if pred(s)}

        combos: list[tuple[ListFilter, Any]] = [
            (
                ListFilter(metadata={"channel": "web"}, agent_id="bot1"),
                lambda s: s.metadata.get("channel") == "web" and s.agent_id == "bot1",
            ),
            (
                ListFilter(metadata={"channel": "web", "even": True}, default_only=True),
                lambda s: (
                    s.metadata.get("channel") == "web"
                    and s.metadata.get("even") is True
                    and s.is_default
                ),
            ),
            (
                ListFilter(metadata={"channel": "email"}, search="needle"),
                lambda s: (
                    s.metadata.get("channel") == "email"
                    and ("needle" in s.title or "needle" in s.last_message)
                ),
            ),
            (
                ListFilter(
                    metadata={"even": False}, state=SessionState.IDLE, updated_after=t_start
                ),
                lambda s: s.metadata.get("even") is False,
            ),
        ]
        for flt, pred in combos:
            assert await _every_way(store, flt) == want(pred), flt
        # Narrower scopes: a subtree and an exact scope.
        for scope, exact in ((f"{tenant}/team1", False), (f"{tenant}/team0/user0", True)):
            with use_scope(scope):
                visible = {
                    i
                    for i, s in by_id.items()
                    if str(s.scope) == scope or (not exact and str(s.scope).startswith(scope + "/"))
                }
                flt = ListFilter(metadata={"channel": "web"}, exact=exact)
                assert await _every_way(store, flt) == visible & (expected["web"] | late)
                with_search = ListFilter(metadata={"channel": "web"}, exact=exact, search="needle")
                assert await _every_way(store, with_search) == {
                    i
                    for i in visible & (expected["web"] | late)
                    if "needle" in by_id[i].title or "needle" in by_id[i].last_message
                }
        # Offset pages of a filtered listing tile it exactly.
        flt = ListFilter(metadata={"channel": "web"}, limit=4)
        full = await _ids(store, flt.model_copy(update={"limit": 1000}))
        paged: list[str] = []
        for offset in range(0, len(full) + 4, 4):
            paged += await _ids(store, flt.model_copy(update={"offset": offset}))
        assert paged == full


async def test_iter_sessions_with_filters_pages_by_cursor(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """Many sessions share one updated_at: the cursor's id tie-break keeps each exactly once."""
    with use_scope(tenant):
        made = [(await store.create_session("bot", metadata={"k": i % 3})).id for i in range(40)]
    same = datetime(2026, 3, 1, tzinfo=UTC)
    for sid in made:
        await _at(owner_conn, tenant, sid, same - timedelta(days=1), same)
    with use_scope(tenant):
        for limit in (1, 3, 7, 1000):
            flt = ListFilter(
                metadata={"k": 1}, updated_after=same - timedelta(seconds=1), limit=limit
            )
            walked = await _walked(store, flt)
            assert len(walked) == len(set(walked)) == len(made[1::3])
            assert set(walked) == set(made[1::3])
            # The walk is in listing order (updated_at, then id, descending).
            assert walked == sorted(walked, reverse=True)


async def test_no_session_of_another_tenant_or_scope_appears(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    both = {"channel": "web", "secret": True}
    with use_scope(f"{other_tenant}/team"):
        theirs = await store.create_session("bot", title="needle", metadata=both)
    with use_scope(f"{tenant}/team/b"):
        sibling = await store.create_session("bot", title="needle", metadata=both)
    with use_scope(f"{tenant}/team/a"):
        mine = await store.create_session("bot", title="needle", metadata=both)
        for flt in (
            ListFilter(metadata=both),
            ListFilter(metadata={"channel": "web"}, search="needle"),
            ListFilter(metadata={"secret": True}, created_after=datetime(2000, 1, 1, tzinfo=UTC)),
            ListFilter(updated_before=datetime(3000, 1, 1, tzinfo=UTC)),
        ):
            assert await _every_way(store, flt) == {mine.id}
    with use_scope(f"{tenant}/team"):
        assert await _every_way(store, ListFilter(metadata=both)) == {mine.id, sibling.id}
    assert theirs.id not in {mine.id, sibling.id}


def _statement(scope: Scope, flt: ListFilter, *, count: bool = False) -> tuple[str, list[Any]]:
    shape = filter_shape(scope, flt)
    stmt = count_statement(shape) if count else page_statement(shape, cursor=False, offset=False)
    compiled = compile_statement(stmt)
    values = {**filter_params(scope, flt), "limit": flt.page_size}
    return compiled.sql, [
        values[name] if name in values else compiled.fixed[name] for name in compiled.order
    ]


async def test_row_level_security_holds_for_the_filtered_statements(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    """As the application role, a filtered statement naming another tenant reads nothing of it.

    The statement's own predicate names ``other_tenant``; the transaction is
    bound to ``tenant``: row-level security leaves nothing to read. Unbound,
    nothing either.
    """
    flt = ListFilter(
        metadata={"channel": "web"},
        created_after=datetime(2000, 1, 1, tzinfo=UTC),
        updated_before=datetime(3000, 1, 1, tzinfo=UTC),
    )
    for name in (tenant, other_tenant):
        with use_scope(name):
            await store.create_session("bot", metadata={"channel": "web"})
    for count in (False, True):
        sql, args = _statement(Scope.parse(other_tenant), flt, count=count)
        async with app_conn.transaction():
            await app_conn.execute(
                "SET LOCAL citus.propagate_set_commands = 'local';"
                f" SET LOCAL cortex.tenant = '{tenant}'"
            )
            rows = await app_conn.fetch(sql, *args)
        unbound = await app_conn.fetch(sql, *args)
        if count:
            assert rows[0][0] == unbound[0][0] == 0
        else:
            assert rows == unbound == []
        # Bound to the tenant it names, it finds that tenant's one session.
        async with app_conn.transaction():
            await app_conn.execute(
                "SET LOCAL citus.propagate_set_commands = 'local';"
                f" SET LOCAL cortex.tenant = '{other_tenant}'"
            )
            rows = await app_conn.fetch(sql, *args)
        assert (rows[0][0] if count else len(rows)) == 1


async def test_an_updated_window_bounds_the_index_walk(
    tenant: str, owner_conn: asyncpg.Connection, app_conn: asyncpg.Connection
) -> None:
    """``updated_*`` is an index condition: a page of a narrow window reads that window's rows only.

    5,000 sessions a minute apart, under the plan the store runs.
    """
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    await owner_conn.execute(
        "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, created_at, updated_at)"
        " SELECT $1, gen_random_uuid(), 'bot', $1, 1, $2::timestamptz,"
        " $2::timestamptz + g * interval '1 minute'"
        " FROM generate_series(0, 4999) AS g",
        tenant,
        t0,
    )
    await owner_conn.execute("ANALYZE sessions")
    flt = ListFilter(
        updated_after=t0 + timedelta(minutes=2009, seconds=30),
        updated_before=t0 + timedelta(minutes=2014, seconds=30),
        metadata={},
    )
    rows, parsed = await plans.explain_page(app_conn, Scope.parse(tenant), flt)
    assert len(rows) == 5
    scans = plans.scans(parsed, "sessions")
    assert scans
    assert all("Index" in str(scan.get("Node Type")) for scan in scans), scans
    assert plans.rows_read(parsed, "sessions") == 5


def _plan_problems(plan: object) -> list[str]:
    """What in a Citus plan is not a single-shard router query (as tests/integration/test_citus.py)."""
    problems: list[str] = []
    for node in plans.nodes(plan):
        provider = node.get("Custom Plan Provider")
        if provider is not None and provider != "Citus Adaptive":
            problems.append(f"executed by {provider}")
        if "Subplans" in node:
            problems.append("distributed subplans (run through the coordinator)")
        tasks = node.get("Task Count")
        if tasks is not None and tasks != 1:
            problems.append(f"{tasks} tasks")
    return problems


@pytest.mark.skipif(CITUS_URL is None, reason="the Citus lane only (CORTEX_TEST_CITUS)")
async def test_on_citus_each_filtered_listing_routes_to_one_shard(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    web = {"channel": "web", "nested": {"b": [1, 2], "a": None}}
    t = datetime(2000, 1, 1, tzinfo=UTC)
    with use_scope(f"{tenant}/team/user"):
        await store.create_session("bot", title="needle", metadata=web)
    filters = [
        ListFilter(metadata=web),
        ListFilter(metadata={"channel": "web"}, created_after=t, updated_before=datetime.now(UTC)),
        ListFilter(metadata={"channel": "web"}, search="needle", agent_id="bot"),
        ListFilter(metadata={"channel": "web"}, default_only=True, exact=True),
        ListFilter(created_before=datetime.now(UTC), updated_after=t, limit=1, offset=1),
    ]
    problems: dict[str, list[str]] = {}
    for path in (tenant, f"{tenant}/team", f"{tenant}/team/user"):
        scope = Scope.parse(path)
        with use_scope(scope):
            for flt in filters:
                # The lane's store errors on any statement sent to more than one shard.
                await store.list_sessions(flt)
                await store.count_sessions(flt)
                _ = [s async for s in store.iter_sessions(flt.model_copy(update={"offset": 0}))]
                if flt.search:
                    continue  # its tenant-wide candidates come from a statement of their own
                for count in (False, True):
                    sql, args = _statement(scope, flt, count=count)
                    async with app_conn.transaction():
                        await app_conn.execute(
                            "SET LOCAL citus.propagate_set_commands = 'local';"
                            f" SET LOCAL cortex.tenant = '{tenant}'"
                        )
                        explained = await app_conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args)
                    found = _plan_problems(plans.parsed(explained))
                    if found:
                        problems[sql[:200]] = found
    assert problems == {}
