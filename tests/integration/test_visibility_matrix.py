"""Visibility, scope by scope: fifteen scopes that share prefixes, every pair checked.

A session is visible from its own scope and from every ancestor of it, and
from nowhere else. The scopes below share byte prefixes without being
ancestors (``a`` and ``ab``, ``a/b`` and ``a/bb``, ``a/b/c`` and ``a/b/c-d``
(``-`` and ``.`` sort before the separator), the tenants ``T`` and
``Tx``), and sit at every depth the listing reads differently: the tenant
(depth 1), ``scope_l2`` (2), ``scope_l3`` (3) and the byte range (4 and
deeper). Each viewer scope reads and writes every session, through every
listing form (subtree, exact, agent, default-only, search, count, the keyset
walk) and every single-session call, on the store as it runs (routines), in
its three-round-trip form, and with the statements a Citus store sends.
Every write a viewer may not make must be refused with NotFound and write
nothing: the message counts at the end prove it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, NotFound, Scope, use_scope
from tests.conftest import CITUS_URL, Database, store_url
from tests.figures import record

pytestmark = pytest.mark.citus

# Relative to a fresh tenant T; "x" and "x/a" are the tenant Tx, whose name
# starts with T's.
_PATHS = (
    "",
    "/a",
    "/ab",
    "/a-b",
    "/a/b",
    "/a/bb",
    "/ab/b",
    "/a/b/c",
    "/a/b/c-d",
    "/a/bb/c",
    "/a/b/c/d",
    "/a/b/c/dd",
    "/a/b/c.d/e",
    "x",
    "x/a",
)


def _visible(viewer: str, owner: str) -> bool:
    return owner == viewer or owner.startswith(viewer + "/")


def _ids(sessions: list[cortex.Session]) -> set[str]:
    return {s.id for s in sessions}


async def _check(store: cortex.Store, tenant: str) -> None:
    scopes = [tenant + path for path in _PATHS]
    assert len(set(scopes)) == 15
    # Two sessions per scope: the bot's default and a helper's plain one.
    owner: dict[str, str] = {}
    agent: dict[str, str] = {}
    made: dict[str, cortex.Session] = {}
    for scope in scopes:
        with use_scope(scope):
            default = await store.resolve_session("bot")
            plain = await store.create_session("helper", title=f"needle in {scope}")
            default = await store.update_session(
                default.model_copy(update={"title": f"needle by default in {scope}"})
            )
        made.update({default.id: default, plain.id: plain})
        owner.update({default.id: scope, plain.id: scope})
        agent.update({default.id: "bot", plain.id: "helper"})
    appended = dict.fromkeys(owner, 0)

    for viewer in scopes:
        seen = {sid for sid, where in owner.items() if _visible(viewer, where)}
        own = {sid for sid, where in owner.items() if where == viewer}
        bots = {sid for sid in seen if agent[sid] == "bot"}
        with use_scope(viewer):
            pages: dict[str, tuple[ListFilter, set[str]]] = {
                "subtree": (ListFilter(limit=1000), seen),
                "exact": (ListFilter(limit=1000, exact=True), own),
                "agent": (ListFilter(limit=1000, agent_id="bot"), bots),
                "exact agent": (ListFilter(limit=1000, exact=True, agent_id="helper"), own - bots),
                "default only": (ListFilter(limit=1000, default_only=True), bots),
                "search": (ListFilter(limit=1000, search="NEEDLE"), seen),
                "search by default": (ListFilter(limit=1000, search="by default"), bots),
            }
            for name, (flt, want) in pages.items():
                assert _ids(await store.list_sessions(flt)) == want, (viewer, name)
                assert await store.count_sessions(flt) == len(want), (viewer, name)
            # A small page size: the keyset walk crosses several pages.
            walked = [s.id async for s in store.iter_sessions(ListFilter(limit=3))]
            assert len(walked) == len(seen), viewer
            assert set(walked) == seen, viewer

            for sid in owner:
                if sid in seen:
                    assert (await store.get_session(sid)).id == sid
                    stored = await store.append_message(sid, NewMessage("user", f"from {viewer}"))
                    appended[sid] += 1
                    assert stored.seq == appended[sid]
                    assert len(await store.list_messages(sid, limit=1000)) == appended[sid]
                    continue
                calls: list[Callable[[], Awaitable[object]]] = [
                    partial(store.get_session, sid),
                    partial(store.append_message, sid, NewMessage("user", "intruder")),
                    partial(store.list_messages, sid),
                    partial(store.update_session, made[sid].model_copy(update={"title": "x"})),
                    partial(store.delete_session, sid),
                    partial(store.set_default_session, sid),
                    partial(store.fork_session, sid),
                    partial(store.rewind_session, sid, to_seq=0),
                ]
                for call in calls:
                    with pytest.raises(NotFound):
                        await call()
                record("isolation attacks: the 15-scope visibility matrix", len(calls))

    # Nothing refused was written: each session holds exactly the messages
    # of the viewers that could see it, and still its own title and default.
    for scope in scopes:
        with use_scope(scope):
            for s in await store.list_sessions(ListFilter(limit=1000, exact=True)):
                assert s.message_count == appended[s.id]
                assert s.title.startswith("needle")
                assert s.is_default == (agent[s.id] == "bot")
    assert all(appended[sid] == sum(_visible(v, owner[sid]) for v in scopes) for sid in owner)


async def _forms(
    database: Database, tenant: str, check: Callable[[cortex.Store, str], Awaitable[None]]
) -> None:
    """``check`` on each form of the store: routines, three round trips, Citus statements."""
    forms = (
        [("as is", None), ("transactions", None)]
        if CITUS_URL
        else [("as is", False), ("transactions", False), ("citus statements", True)]
    )
    for n, (form, distributed) in enumerate(forms):
        async with cortex.connect(store_url(database)) as store:
            if distributed is not None:
                store._distributed = distributed
            if form == "transactions":
                store._routines.clear()
            await check(store, f"{tenant}{n}")


async def test_every_scope_sees_exactly_itself_and_beneath(database: Database, tenant: str) -> None:
    await _forms(database, tenant, _check)


async def test_raw_sql_of_a_tenant_never_reads_a_prefix_sharing_tenant(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    # The row-level security wall compares the whole tenant: T bound never
    # reads Tx's rows, nor Tx T's.
    from tests.integration.test_tenancy import _binding

    for name in (tenant, tenant + "x"):
        with use_scope(name):
            s = await store.create_session("bot")
            await store.append_message(s.id, NewMessage("user", "mine"))
    for name in (tenant, tenant + "x"):
        async with app_conn.transaction():
            await app_conn.execute(_binding(name))
            assert {r[0] for r in await app_conn.fetch("SELECT tenant_id FROM sessions")} == {name}
            assert {r[0] for r in await app_conn.fetch("SELECT tenant_id FROM messages")} == {name}
            assert (
                await app_conn.fetchval(
                    "SELECT count(*) FROM sessions WHERE scope LIKE $1", tenant + "%"
                )
                == 1
            )
    assert Scope.parse(tenant + "x").tenant != Scope.parse(tenant).tenant
