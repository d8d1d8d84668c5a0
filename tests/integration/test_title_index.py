"""The title search index holds titled sessions only (revision 20261203000018).

No update of a session's row is HOT, so before the revision every append
gave the title's trigram index an entry for the row's new version, titled
or not. The tests count what a transaction did to the index with its own
statistics (``pg_stat_get_xact_blocks_fetched``): nothing is timed. That a
whole-tenant search still reads the index is a matter of the planner's
estimates on the data; docs/query-plans.md shows its plan at 1,000,000
sessions, and the migration test holds the functions to the form it needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, use_scope
from cortex._db import begin_sql
from cortex._executor import Tx
from cortex._messages import append_messages, encode_batch
from cortex.ids import parse_id
from cortex.scope import Scope

pytestmark = pytest.mark.anyio

INDEX = "ix_sessions_tenant_title_trgm"


async def _counted(
    app_conn: asyncpg.Connection, scope: Scope, call: Callable[[Tx], Awaitable[Any]], stat: str
) -> int:
    """What one cortex statement, run as the application role, did to the title index."""
    await app_conn.execute(begin_sql(scope, custom_plans=False))
    try:
        await call(Tx(app_conn))
        return int(await app_conn.fetchval(f"SELECT {stat}('{INDEX}'::regclass)"))
    finally:
        await app_conn.execute("ROLLBACK")


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
