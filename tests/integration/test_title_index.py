"""The title search index holds titled sessions only (revision 20261203000018).

No update of a session's row is HOT, so before the revision every append
gave the title's trigram index an entry for the row's new version, titled
or not. The tests count what a transaction did to the index with its own
statistics (``pg_stat_get_xact_blocks_fetched``): nothing is timed. The
search functions' own queries, as installed, are explained on a tenant of
50,000 sessions: the title's arm must still be served by the partial index
(it is not, if the arm lacks ``title <> ''``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from cortex._calls.messages import append_messages, encode_batch
from cortex._db.executor import Tx
from cortex.ids import parse_id
from cortex.scope import Scope
from tests import plans
from tests.measured import counted

pytestmark = [pytest.mark.anyio, pytest.mark.citus]

INDEX = "ix_sessions_tenant_title_trgm"


async def _counted(
    app_conn: asyncpg.Connection, scope: Scope, call: Callable[[Tx], Awaitable[Any]], stat: str
) -> int:
    """What one cortex statement, run as the application role, did to the title index."""
    return await counted(app_conn, scope, call, f"SELECT {stat}('{INDEX}'::regclass)")


async def test_an_append_to_an_untitled_session_leaves_the_title_index_alone(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    if store.distributed:
        pytest.skip("the shards' indexes are written on the workers")
    scope = Scope.parse(f"{tenant}/team/user")
    with use_scope(scope):
        untitled = await store.create_session("bot")
        titled = await store.create_session("bot", title="Quarterly invoices")
    one = encode_batch([NewMessage("user", "hello")])

    def append(session_id: str) -> Callable[[Tx], Awaitable[Any]]:
        async def run(tx: Tx) -> Any:
            return await append_messages(tx, scope, parse_id("ses", session_id), one)

        return run

    fetched = "pg_stat_get_xact_blocks_fetched"
    assert await _counted(app_conn, scope, append(untitled.id), fetched) == 0
    # The measure sees the index: a titled session's new row version is entered there.
    assert await _counted(app_conn, scope, append(titled.id), fetched) > 0


async def test_a_whole_tenant_search_still_finds_titles_and_previews(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        by_title = await store.create_session("bot", title="Zanzibar, the trip")
        by_preview = await store.create_session("bot")
        await store.append_message(by_preview.id, NewMessage("user", "pack for ZANZIBAR"))
        untitled = await store.create_session("bot")
        await store.append_message(untitled.id, NewMessage("user", "nothing to see"))
        for term, wanted in (
            ("zanzibar", {by_title.id, by_preview.id}),
            ("the trip", {by_title.id}),
        ):
            found = {s.id for s in await store.list_sessions(ListFilter(search=term))}
            assert found == wanted, term
            assert await store.count_sessions(ListFilter(search=term)) == len(wanted)


_FUNCTION_SOURCE = "SELECT prosrc FROM pg_proc WHERE oid = $1::regprocedure"


async def test_the_search_functions_read_the_partial_title_index(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    """Each whole-tenant search function's query, as installed, can be served by the partial index.

    The planner takes a partial index only where the query implies its
    predicate. Explained here with the pattern known (a plan of its own,
    as a custom plan would be), on 50,000 sessions in the tenant, half of
    them titled and five matching, the trigram indexes are the planner's own
    choice, no setting forced; without ``title <> ''`` in the title's arm
    the title index cannot serve it at all. (Inside the SQL function the
    pattern is a parameter: with one large tenant in the database the
    planner may still read the tenant's rows.) On Citus, test_citus
    explains the routed function on a shard.
    """
    if store.distributed:
        pytest.skip("test_citus explains the function on the shards")
    await owner_conn.execute(
        """
        INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, title, last_message)
        SELECT $1, gen_random_uuid(), 'bot', $1, 1,
               CASE WHEN g % 10000 = 0 THEN 'a zanzibar trip ' || g
                    WHEN g % 2 = 0 THEN 'hay stack ' || g ELSE '' END,
               'the last thing said, number ' || g
        FROM generate_series(1, 50000) AS g
        """,
        tenant,
    )
    await owner_conn.execute("ANALYZE sessions")
    try:
        await _explain_both(owner_conn, tenant)
    finally:
        # The shared test database keeps its other tests' plans.
        await owner_conn.execute("DELETE FROM sessions WHERE tenant_id = $1", tenant)


async def _explain_both(owner_conn: asyncpg.Connection, tenant: str) -> None:
    ids_source = await owner_conn.fetchval(_FUNCTION_SOURCE, "cortex_search_ids(text)")
    array_source = await owner_conn.fetchval(_FUNCTION_SOURCE, "cortex_tenant_search(text, text)")
    queries = {
        "cortex_search_ids": re.sub(r"\bpattern\b", "$1", ids_source),
        "cortex_tenant_search": re.sub(
            r"\btenant\b",
            f"'{tenant}'",
            re.sub(
                r"\bpattern\b",
                "$1",
                array_source[array_source.index("ARRAY(") + 6 : array_source.rindex(")")],
            ),
        ),
    }
    for name, query in queries.items():
        async with owner_conn.transaction():
            await owner_conn.execute(f"SET LOCAL cortex.tenant = '{tenant}'")
            explained = await owner_conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + query, "%zanzibar%"
            )
        plan = plans.parsed(explained)
        used = {str(node["Index Name"]) for node in plans.nodes(plan) if "Index Name" in node}
        assert used == {
            "ix_sessions_tenant_title_trgm",
            "ix_sessions_tenant_last_message_trgm",
        }, (name, used)
        assert plan[0]["Plan"]["Actual Rows"] == 5, name
