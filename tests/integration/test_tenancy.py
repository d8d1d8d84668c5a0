"""Tenant isolation in two walls: the store's predicate, and row-level security.

These run as the plain application role the store uses (superusers bypass RLS),
and every write commits for real.
"""

from __future__ import annotations

import random

import anyio
import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, NotFound, use_scope
from cortex._db.transaction import begin_sql
from cortex.scope import Scope
from tests.conftest import CITUS_URL
from tests.figures import record

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20, pytest.mark.reliability]


def _binding(tenant: str) -> str:
    """The tenant binding cortex sends after BEGIN (cortex._db.transaction.begin_sql), for raw SQL."""
    return begin_sql(Scope.parse(tenant), custom_plans=False).split(";", 1)[1]


async def _seed(store: cortex.Store, tenant: str) -> str:
    with use_scope(f"{tenant}/u"):
        s = await store.create_session("bot", title=f"secret of {tenant}")
        await store.append_message(s.id, NewMessage("user", f"private to {tenant}"))
        return s.id


async def test_app_role_is_plain(app_conn: asyncpg.Connection) -> None:
    row = await app_conn.fetchrow(
        "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
    )
    assert row is not None
    assert not row["rolsuper"]
    assert not row["rolbypassrls"]


async def test_no_tenant_bound_sees_nothing(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    await _seed(store, tenant)
    assert await app_conn.fetchval("SELECT count(*) FROM sessions") == 0
    assert await app_conn.fetchval("SELECT count(*) FROM messages") == 0
    # Updates and deletes that forget the predicate touch nothing.
    assert await app_conn.execute("UPDATE sessions SET title = 'pwned'") == "UPDATE 0"
    assert await app_conn.execute("DELETE FROM messages") == "DELETE 0"
    record("isolation attacks: raw SQL as the application role", 4)


async def test_bound_tenant_sees_only_itself(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    await _seed(store, tenant)
    await _seed(store, other_tenant)
    async with app_conn.transaction():
        await app_conn.execute(_binding(tenant))
        rows = await app_conn.fetch("SELECT tenant_id, title FROM sessions")  # no predicate at all
        msgs = await app_conn.fetch("SELECT tenant_id FROM messages")
        assert {r["tenant_id"] for r in rows} == {tenant}
        assert {r["tenant_id"] for r in msgs} == {tenant}
        # Writing another tenant's row is refused by the policy's WITH CHECK.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app_conn.execute(
                "INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth) "
                "VALUES ($1, gen_random_uuid(), 'bot', $1, 1)",
                other_tenant,
            )
    # The setting was transaction-local: after COMMIT the connection sees nothing again.
    assert await app_conn.fetchval("SELECT count(*) FROM sessions") == 0


async def test_every_method_refuses_another_tenant(
    store: cortex.Store, tenant: str, other_tenant: str, owner_conn: asyncpg.Connection
) -> None:
    victim = await _seed(store, tenant)
    before = await owner_conn.fetchrow(
        "SELECT title, message_count, is_default FROM sessions WHERE tenant_id = $1", tenant
    )
    with use_scope(other_tenant):
        got = await store.create_session("bot")
        forged = got.model_copy(update={"id": victim})
        attacks = [
            store.get_session(victim),
            store.update_session(forged),
            store.delete_session(victim),
            store.append_message(victim, NewMessage("user", "injected")),
            store.list_messages(victim),
            store.resolve_session("bot", victim),
            store.set_default_session(victim),
            store.inspect_session(victim),
            store.abort_session(victim, "not yours"),
            store.resume(victim, "any", {}),
        ]
        for attack in attacks:
            with pytest.raises(NotFound):
                await attack
            record("isolation attacks: store calls on another tenant's session")
        assert all(s.id != victim for s in await store.list_sessions(ListFilter(limit=1000)))
        assert await store.count_sessions(ListFilter(search="secret")) == 0
    after = await owner_conn.fetchrow(
        "SELECT title, message_count, is_default FROM sessions WHERE tenant_id = $1", tenant
    )
    assert after == before
    # An interrupt marker for the victim's id only parks in the attacker's own
    # scope: the victim's session never shows it.
    with use_scope(other_tenant):
        await store.mark_interrupted(victim, "attack")
    with use_scope(f"{tenant}/u"):
        assert (await store.inspect_session(victim)).interrupt_reason is None
    record("isolation attacks: store calls on another tenant's session")


async def test_same_session_id_in_two_tenants_is_two_sessions(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    # Ids are unique per tenant, so a taken id never reveals another tenant's session.
    sid = await _seed(store, tenant)
    with use_scope(other_tenant):
        mine = await store.create_session("bot", session_id=sid, title="mine")
        assert mine.id == sid
        assert (await store.get_session(sid)).title == "mine"
    with use_scope(f"{tenant}/u"):
        assert (await store.get_session(sid)).title == f"secret of {tenant}"


async def test_concurrent_requests_never_cross(store: cortex.Store) -> None:
    tenants = [f"iso{random.getrandbits(40):x}" for _ in range(6)]
    leaks: list[str] = []

    async def request(t: str) -> None:
        with use_scope(t):
            s = await store.create_session("bot", title=t)
            for _ in range(5):
                await store.append_message(s.id, NewMessage("user", t))
                for seen in await store.list_sessions(ListFilter(limit=1000)):
                    record("isolation: rows checked under concurrent tenants")
                    if seen.title != t or seen.scope.tenant != t:
                        leaks.append(f"{t} saw {seen.title}")
                for m in await store.list_messages(s.id):
                    if m.content != t:
                        leaks.append(f"{t} read {m.content}")

    async with anyio.create_task_group() as tg:
        for t in tenants * 3:
            tg.start_soon(request, t)
    assert leaks == []


@pytest.mark.skipif(
    CITUS_URL is not None,
    reason="plain PostgreSQL's cortex_search_ids; on Citus: cortex_tenant_search, tested below",
)
async def test_search_function_sees_only_the_bound_tenant(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    mine = await _seed(store, tenant)
    await _seed(store, other_tenant)
    # No tenant bound: nothing, even though the function bypasses the policy.
    assert await app_conn.fetch("SELECT * FROM cortex_search_ids('%secret%')") == []
    async with app_conn.transaction():
        await app_conn.execute(_binding(tenant))
        rows = await app_conn.fetch("SELECT * FROM cortex_search_ids('%secret%')")
    from cortex.ids import format_id

    assert [format_id("ses", r[0]) for r in rows] == [mine]
    with use_scope(tenant):
        found = await store.list_sessions(ListFilter(search="SECRET OF"))
    assert [s.id for s in found] == [mine]


async def test_tenant_search_by_key_answers_only_for_the_bound_tenant(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    """cortex_tenant_search (revision …12; what Citus routes) bypasses the policy, never the binding."""
    from cortex.ids import format_id

    mine = await _seed(store, tenant)
    theirs = await _seed(store, other_tenant)
    search = "SELECT cortex_tenant_search($1, '%secret%')"
    # No tenant bound: nothing, whichever tenant is asked for.
    assert await app_conn.fetchval(search, tenant) == []
    async with app_conn.transaction():
        await app_conn.execute(_binding(tenant))
        assert [format_id("ses", i) for i in await app_conn.fetchval(search, tenant)] == [mine]
        # Another tenant's name while bound to mine: nothing (not their ids).
        assert await app_conn.fetchval(search, other_tenant) == []
        assert await app_conn.fetchval(search, "") == []
    with use_scope(other_tenant):
        found = await store.list_sessions(ListFilter(search="secret"))
        assert [s.id for s in found] == [theirs]
        assert await store.count_sessions(ListFilter(search="secret")) == 1
        # A term with LIKE's own characters is matched literally.
        assert await store.list_sessions(ListFilter(search="secret_of%")) == []
    record("isolation attacks: raw SQL as the application role", 2)
