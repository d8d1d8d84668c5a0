from __future__ import annotations

import gc
import json
import secrets
import tracemalloc
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import Conflict, InvalidInput, ListFilter, NewMessage, NotFound, Scope, use_scope
from cortex.ids import format_id, new_uuid
from tests.factories import agent

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20]


async def test_create_get_round_trip(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/support/u1"):
        created = await store.create_session(
            "bot", title="Refund", metadata={"k": [1, "x", None], "nested": {"a": True}}
        )
        got = await store.get_session(created.id)
    assert got == created
    assert got.scope == Scope(tenant, "support", "u1")
    assert got.message_count == 0
    assert got.last_message == ""
    assert not got.is_default
    assert got.backfilled_by == ""
    assert got.created_at.tzinfo is not None
    assert got.created_at == got.updated_at
    assert got.id.startswith("ses_")


async def test_caller_chosen_id_is_idempotent_key(store: cortex.Store, tenant: str) -> None:
    sid = format_id("ses", new_uuid())
    with use_scope(tenant):
        s = await store.create_session("bot", session_id=sid)
        assert s.id == sid
        # A retry of the same create returns the session ...
        assert (await store.create_session("bot", session_id=sid)).id == sid
        # ... another create with the id is refused.
        with pytest.raises(Conflict, match="taken"):
            await store.create_session("bot", title="other", session_id=sid)


async def test_visibility_is_scope_and_beneath(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/a/b"):
        deep = await store.create_session("bot")
    with use_scope(tenant):
        assert (await store.get_session(deep.id)).id == deep.id
    with use_scope(f"{tenant}/a"):
        assert (await store.get_session(deep.id)).id == deep.id
    for elsewhere in (f"{tenant}/a/b/c", f"{tenant}/a/bb", f"{tenant}/x", f"{tenant}-corp"):
        with use_scope(elsewhere), pytest.raises(NotFound) as info:
            await store.get_session(deep.id)
        assert str(info.value) == f"session {deep.id} not found"


async def test_missing_is_not_found(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant), pytest.raises(NotFound):
        await store.get_session(format_id("ses", new_uuid()))


async def test_update_writes_exactly_the_host_owned_columns(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{tenant}/x"):
        s = await store.create_session("bot", title="old", is_default=True)
        await store.append_message(s.id, NewMessage("user", "hello"))
        before = await store.get_session(s.id)
        forged = before.model_copy(
            update={
                "title": "new",
                "metadata": {"v": 2},
                "message_count": 999,
                "last_message": "forged",
                "is_default": False,
                "backfilled_by": "forged",
                "agent_id": "other",
                "scope": Scope(tenant, "elsewhere"),
                "created_at": before.created_at.replace(year=2000),
            }
        )
        after = await store.update_session(forged)
    assert after.title == "new"
    assert after.metadata == {"v": 2}
    assert after.updated_at > before.updated_at
    unchanged = (
        "id",
        "agent_id",
        "scope",
        "message_count",
        "last_message",
        "is_default",
        "backfilled_by",
        "created_at",
    )
    for field in unchanged:
        assert getattr(after, field) == getattr(before, field), field
    row = await owner_conn.fetchrow(
        "SELECT agent_id, scope, message_count, last_message, is_default, backfilled_by "
        "FROM sessions WHERE tenant_id = $1",
        tenant,
    )
    assert row is not None
    assert dict(row) == {
        "agent_id": "bot",
        "scope": f"{tenant}/x",
        "message_count": 1,
        "last_message": "hello",
        "is_default": True,
        "backfilled_by": "",
    }


async def test_update_and_delete_not_visible(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/a"):
        s = await store.create_session("bot")
    with use_scope(f"{tenant}/b"):
        with pytest.raises(NotFound):
            await store.update_session(s)
        with pytest.raises(NotFound):
            await store.delete_session(s.id)
    with use_scope(f"{tenant}/a"):
        assert (await store.get_session(s.id)).title == ""


async def test_delete_removes_messages(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "1"), NewMessage("user", "2")])
        await store.delete_session(s.id)
        with pytest.raises(NotFound):
            await store.get_session(s.id)
        with pytest.raises(NotFound):
            await store.delete_session(s.id)
    assert (
        await owner_conn.fetchval("SELECT count(*) FROM messages WHERE tenant_id = $1", tenant) == 0
    )


async def _seed_tree(store: cortex.Store, tenant: str) -> dict[str, list[str]]:
    """Sessions at several depths and agents; returns ids by scope path."""
    made: dict[str, list[str]] = {}
    layout = {
        tenant: ["a1", "a2"],
        f"{tenant}/p1": ["a1"],
        f"{tenant}/p1/u1": ["a1", "a2", "a1"],
        f"{tenant}/p1/u1/x": ["a1"],
        f"{tenant}/p1/u10": ["a1"],
        f"{tenant}/p2/u1": ["a2"],
        f"{tenant}-corp/p1": ["a1"],
        f"{tenant}_x": ["a1"],
    }
    for path, agents in layout.items():
        with use_scope(path):
            for agent_id in agents:
                s = await store.create_session(agent_id, title=f"title {path}")
                made.setdefault(path, []).append(s.id)
    return made


async def test_subtree_exact_agent_filters_and_counts(store: cortex.Store, tenant: str) -> None:
    made = await _seed_tree(store, tenant)

    def ids_under(prefix: str) -> set[str]:
        return {
            i
            for path, ids in made.items()
            for i in ids
            if path == prefix or path.startswith(prefix + "/")
        }

    cases = [
        (tenant, ListFilter(limit=1000), ids_under(tenant)),
        (f"{tenant}/p1", ListFilter(limit=1000), ids_under(f"{tenant}/p1")),
        (f"{tenant}/p1/u1", ListFilter(limit=1000), ids_under(f"{tenant}/p1/u1")),
        (f"{tenant}/p1/u1", ListFilter(exact=True), set(made[f"{tenant}/p1/u1"])),
        (tenant, ListFilter(exact=True), set(made[tenant])),
    ]
    for path, flt, expected in cases:
        with use_scope(path):
            listed = await store.list_sessions(flt)
            assert {s.id for s in listed} == expected, (path, flt)
            assert await store.count_sessions(flt) == len(expected)
    assert ids_under(tenant).isdisjoint(made[f"{tenant}-corp/p1"] + made[f"{tenant}_x"])
    with use_scope(f"{tenant}/p1"):
        a2 = await store.list_sessions(ListFilter(agent_id="a2"))
        assert {s.agent_id for s in a2} == {"a2"}
        assert len(a2) == 1
        assert await store.count_sessions(ListFilter(agent_id="a2")) == 1


async def test_order_and_paging_stable(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for i in range(12):
            await store.create_session("bot", title=f"s{i}")
        everything = await store.list_sessions(ListFilter(limit=100))
        keys = [(s.updated_at, s.id) for s in everything]
        assert keys == sorted(keys, reverse=True)
        pages = []
        for offset in range(0, 12, 5):
            pages += await store.list_sessions(ListFilter(limit=5, offset=offset))
        assert [s.id for s in pages] == [s.id for s in everything]
        assert await store.count_sessions(ListFilter(limit=5, offset=10)) == 12
        assert len(await store.list_sessions()) == 12  # default page of 50


async def test_iter_sessions_complete_in_list_order(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for _ in range(23):
            await store.create_session("bot")
        listed = await store.list_sessions(ListFilter(limit=1000))
        iterated = [s async for s in store.iter_sessions(ListFilter(limit=4))]
        assert [s.id for s in iterated] == [s.id for s in listed]
        assert len(iterated) == 23
        with pytest.raises(InvalidInput, match="offset"):
            async for _ in store.iter_sessions(ListFilter(offset=1)):
                pass


async def test_search_is_literal_and_case_insensitive(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        pct = await store.create_session("bot", title="Invoice 50%_OFF")
        plain = await store.create_session("bot", title="invoice 50 off")
        slash = await store.create_session("bot", title="path a\\b and a/b")
        msg = await store.create_session("bot", title="nothing")
        await store.append_message(msg.id, NewMessage("user", "Zanzibar trip"))

        async def found(term: str) -> set[str]:
            listed = {s.id for s in await store.list_sessions(ListFilter(search=term))}
            assert await store.count_sessions(ListFilter(search=term)) == len(listed)
            return listed

        assert await found("50%_off") == {pct.id}
        assert await found("%") == {pct.id}
        assert await found("_") == {pct.id}
        assert await found("INVOICE") == {pct.id, plain.id}
        assert await found("\\") == {slash.id}
        assert await found("a/b") == {slash.id}
        assert await found("zanzibar") == {msg.id}
        assert await found("") == {pct.id, plain.id, slash.id, msg.id}


async def test_default_only_and_resolve(store: cortex.Store, tenant: str) -> None:
    bot = agent()
    with use_scope(f"{tenant}/u1"):
        d = await store.resolve_session(bot)
        assert d.is_default
        assert d.scope == Scope(tenant, "u1")
        assert (await store.resolve_session(bot)).id == d.id
        other = await store.create_session(bot)
        assert (await store.resolve_session(bot, other.id)).id == other.id
        with pytest.raises(NotFound):
            await store.resolve_session("someone-else", other.id)
        with pytest.raises(Conflict, match="default"):
            await store.create_session(bot, is_default=True)
    with use_scope(f"{tenant}/u1/deeper"):
        deeper = await store.resolve_session(bot)
        assert deeper.id != d.id
    with use_scope(tenant):
        defaults = await store.list_sessions(ListFilter(default_only=True))
        assert {s.id for s in defaults} == {d.id, deeper.id}
        assert await store.count_sessions(ListFilter(default_only=True)) == 2
        with pytest.raises(NotFound):
            await store.resolve_session(bot, format_id("ses", new_uuid()))


async def test_set_default_switches(store: cortex.Store, tenant: str) -> None:
    bot = agent()
    with use_scope(f"{tenant}/u"):
        first = await store.resolve_session(bot)
        second = await store.create_session(bot)
    with use_scope(tenant):  # from above: the switch applies to the session's own scope
        switched = await store.set_default_session(second.id)
        assert switched.is_default
        assert not (await store.get_session(first.id)).is_default
        assert (await store.set_default_session(second.id)).is_default  # idempotent
    with use_scope(f"{tenant}/u"):
        assert (await store.resolve_session(bot)).id == second.id
    with use_scope(f"{tenant}/v"), pytest.raises(NotFound):
        await store.set_default_session(first.id)


async def test_create_limits_write_nothing(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    bad_calls: list[dict[str, Any]] = [
        {"agent_id": ""},
        {"agent_id": "a b"},
        {"agent_id": "x" * 129},
        {"agent_id": "a", "title": "x" * 1001},
        {"agent_id": "a", "title": "\x00"},
        {"agent_id": "a", "metadata": {"x": "y" * 70_000}},
        {"agent_id": "a", "metadata": ["not", "an", "object"]},
        {"agent_id": "a", "session_id": "ses_nope"},
        {"agent_id": "a", "session_id": format_id("msg", new_uuid())},
    ]
    with use_scope(tenant):
        for kwargs in bad_calls:
            with pytest.raises(InvalidInput):
                await store.create_session(**kwargs)
        for bad_id in ("", "nope", "ses_" + "z" * 26):
            with pytest.raises(InvalidInput):
                await store.get_session(bad_id)
    assert (
        await owner_conn.fetchval("SELECT count(*) FROM sessions WHERE tenant_id = $1", tenant) == 0
    )


async def test_no_scope_no_call(store: cortex.Store) -> None:
    with pytest.raises(cortex.ScopeMissing):
        await store.list_sessions()
    with pytest.raises(cortex.ScopeMissing):
        await store.create_session("bot")


# --- a listing page and its scopes' state documents ----------------------------


def _large_document() -> dict[str, Any]:
    """About 512 KB as stored: 32 keys, each an object holding a 16 KB string."""
    return {f"k{i}": {"blob": secrets.token_hex(8_000)} for i in range(32)}


async def _listing_peak(store: cortex.Store, scope: str, limit: int) -> int:
    """Peak bytes Python allocated while ``list_sessions`` read a page of ``limit`` rows."""
    with use_scope(scope):
        await store.list_sessions(ListFilter(limit=limit))  # statements prepared, pool warm
        gc.collect()
        tracemalloc.start()
        try:
            page = await store.list_sessions(ListFilter(limit=limit))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(page) == limit
    return peak


async def test_a_page_reads_each_scope_document_once(store: cortex.Store, tenant: str) -> None:
    document = _large_document()
    size = len(json.dumps(document))
    with use_scope(f"{tenant}/team/user"):
        await store.create_session("bot", scope_data={tenant: document})
        for _ in range(99):
            await store.create_session("bot")
    ten = await _listing_peak(store, tenant, 10)
    hundred = await _listing_peak(store, tenant, 100)
    # Ten times the rows: the document is still read and decoded once.
    assert hundred < 3 * ten, (ten, hundred)
    # A bound on the page's whole read (socket buffers, texts, decoded values)
    # that the document alone sets, not the row count.
    assert hundred < 32 * size, (size, hundred)


async def test_rows_of_a_page_share_their_scopes_decoded_values(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(f"{tenant}/team/user"):
        for _ in range(3):
            await store.create_session("bot", scope_data={tenant: {"shared": {"a": [1, 2]}}})
    with use_scope(tenant):
        page = await store.list_sessions()
        walked = [s async for s in store.iter_sessions(ListFilter(limit=2))]
    for rows in (page, walked[:2], walked[2:]):
        assert all(s.data == {"shared": {"a": [1, 2]}} for s in rows)
        assert all(s.data["shared"] is rows[0].data["shared"] for s in rows)


async def test_every_listing_merges_scope_state_as_a_single_read_does(
    store: cortex.Store, tenant: str
) -> None:
    """Outer scopes first, the session's own document last, in every listing form."""
    made = []
    with use_scope(tenant):
        made.append(
            await store.create_session(
                "bot", title="root", data={"own": 0}, scope_data={tenant: {"t": 1, "v": "t"}}
            )
        )
    with use_scope(f"{tenant}/a/u"):
        made.append(
            await store.create_session(
                "bot",
                title="deep",
                data={"v": "own"},
                scope_data={f"{tenant}/a": {"a": 1, "v": "a"}, f"{tenant}/a/u": {"u": 1}},
            )
        )
        made.append(await store.create_session("bot", title="deep plain"))
    with use_scope(f"{tenant}/a"):
        made.append(await store.create_session("other", title="mid"))
    with use_scope(f"{tenant}/b"):
        made.append(await store.create_session("bot", title="beside", data={"b": None}))
    with use_scope(tenant):
        expected = {s.id: (await store.get_session(s.id)).data for s in made}
    assert expected[made[1].id] == {"t": 1, "v": "own", "a": 1, "u": 1}
    assert expected[made[4].id] == {"t": 1, "v": "t", "b": None}

    def check(rows: list[cortex.Session]) -> None:
        assert rows
        for row in rows:
            assert row.data == expected[row.id], row.title
            assert list(row.data) == list(expected[row.id]), row.title

    listings = [
        (tenant, ListFilter()),
        (tenant, ListFilter(limit=2, offset=1)),
        (tenant, ListFilter(search="deep")),
        (tenant, ListFilter(agent_id="bot")),
        (f"{tenant}/a", ListFilter()),
        (f"{tenant}/a/u", ListFilter(exact=True, search="plain")),
        (f"{tenant}/b", ListFilter()),
    ]
    for scope, flt in listings:
        with use_scope(scope):
            check(await store.list_sessions(flt))
            check([s async for s in store.iter_sessions(flt.model_copy(update={"offset": 0}))])
    with use_scope(tenant):
        walked = [s async for s in store.iter_sessions(ListFilter(limit=1))]
    check(walked)
    assert len(walked) == len(made)
    with use_scope(f"{tenant}/nobody"):
        assert await store.list_sessions() == []


async def test_a_create_replayed_writes_no_scope_state_and_compares_it(
    store: cortex.Store, tenant: str
) -> None:
    """A caller-chosen id keys the whole create, its ``scope_data`` included."""
    sid = format_id("ses", new_uuid())
    with use_scope(f"{tenant}/team"):
        made = await store.create_session("bot", session_id=sid, scope_data={tenant: {"s": 1}})
        other = await store.create_session("bot")
        await store.append_messages(
            other.id, [NewMessage("user", "x")], scope_data={tenant: {"s": 2}}
        )
        # The same create again: the session as it is now, and nothing merged again.
        again = await store.create_session("bot", session_id=sid, scope_data={tenant: {"s": 1}})
        assert again.id == made.id
        assert again.data == {"s": 2}
        assert await store.get_scope_data(tenant) == {"s": 2}
        for scope_data in ({tenant: {"s": 3}}, None, {f"{tenant}/team": {"s": 1}}):
            with pytest.raises(Conflict, match="taken"):
                await store.create_session("bot", session_id=sid, scope_data=scope_data)
        assert await store.get_scope_data(tenant) == {"s": 2}
        assert await store.get_scope_data(f"{tenant}/team") == {}
        plain = format_id("ses", new_uuid())
        await store.create_session("bot", session_id=plain)
        with pytest.raises(Conflict, match="taken"):
            await store.create_session("bot", session_id=plain, scope_data={tenant: {"s": 4}})
        assert await store.get_scope_data(tenant) == {"s": 2}
