"""A session's state document is measured where it is written, never read back by an update that leaves it alone.

Revision 20261202000017. Before it, a CHECK constraint printed the whole
document as text on every UPDATE of the session's row: each append to a
session with a large state fetched its TOAST chunks. The tests count the
TOAST blocks a transaction fetched (``pg_stat_get_xact_blocks_fetched``), so
they fail on the old constraint without timing anything.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

import cortex
from cortex import NewMessage, use_scope
from cortex._calls.messages import append_messages, encode_batch
from cortex._db.executor import Tx
from cortex._db.transaction import begin_sql
from cortex.ids import parse_id
from cortex.scope import Scope
from tests.measured import counted

pytestmark = [pytest.mark.anyio, pytest.mark.citus]


def _big() -> dict[str, str]:
    """600 KB of hex, incompressible enough that TOAST stores it out of line (about 300 chunks)."""
    return {f"k{i}": secrets.token_hex(15_000) for i in range(20)}


_TOAST_FETCHED = """
SELECT pg_stat_get_xact_blocks_fetched(reltoastrelid) FROM pg_class
WHERE oid = 'sessions'::regclass
"""


async def _toast_blocks(
    app_conn: asyncpg.Connection, scope: Scope, call: Callable[[Tx], Awaitable[Any]]
) -> int:
    """TOAST blocks of ``sessions`` one cortex statement fetched, run as the application role."""
    return await counted(app_conn, scope, call, _TOAST_FETCHED)


async def test_an_append_never_fetches_an_unchanged_state_document(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    if store.distributed:
        # The shards' TOAST is read on the workers, whose counters this
        # transaction on the coordinator cannot see.
        pytest.skip("TOAST reads happen on the workers")
    scope = Scope.parse(f"{tenant}/team/user")
    with use_scope(scope):
        big = await store.create_session("bot", data=_big())
    sid = parse_id("ses", big.id)
    one = encode_batch([NewMessage("user", "hello")])

    async def append(tx: Tx) -> Any:
        return await append_messages(tx, scope, sid, one)

    async def append_with_delta(tx: Tx) -> Any:
        return await append_messages(tx, scope, sid, one, data_delta='{"n": "1"}')

    assert await _toast_blocks(app_conn, scope, append) == 0
    # The measure sees a fetch: merging a delta reads the document, as it must.
    assert await _toast_blocks(app_conn, scope, append_with_delta) > 50


async def test_the_exact_limit_holds_where_cortex_writes_the_document(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot", data={"a": "x" * 700_000})
        with pytest.raises(cortex.InvalidInput, match="at most 1048576 bytes"):
            await store.append_messages(
                session.id, [NewMessage("user", "x")], data={"b": "y" * 400_000}
            )
        with pytest.raises(cortex.InvalidInput, match="at most 1048576 bytes"):
            await store.create_session("bot", data={"a": "x" * 1_048_576})
        near = await store.create_session("bot", data={"a": "x" * 1_000_000})
        after = await store.get_session(session.id)
    assert after.message_count == 0
    assert set(after.data) == {"a"}
    assert len(near.data["a"]) == 1_000_000


async def _raw_write(app_conn: asyncpg.Connection, tenant: str, session_id: str, n: int) -> str:
    """As the application role, bypassing cortex: the session's document set to ``n`` random bytes, as hex."""
    async with app_conn.transaction():
        # cortex's own binding (SET LOCAL), which Citus carries to the workers.
        await app_conn.execute(
            begin_sql(Scope.parse(tenant), custom_plans=False).removeprefix("BEGIN; ")
        )
        done: str = await app_conn.execute(
            "UPDATE sessions SET data = jsonb_build_object('a', $2::text) WHERE id = $1",
            parse_id("ses", session_id),
            secrets.token_hex(n),
        )
        return done


async def test_a_raw_writer_is_held_by_the_stored_size_backstop(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
    # 2 MiB of text gets past no cortex call, but the backstop is about what
    # bypasses cortex: it holds the stored size to 8 MiB.
    assert await _raw_write(app_conn, tenant, session.id, 1_048_576) == "UPDATE 1"
    with pytest.raises(asyncpg.CheckViolationError, match="ck_sessions_data_stored_size"):
        await _raw_write(app_conn, tenant, session.id, 4_500_000)
