"""The append limits add up: the largest batch cortex accepts goes through."""

from __future__ import annotations

import asyncpg
import pytest

import cortex
from cortex import InvalidInput, NewMessage, use_scope
from cortex.models import MAX_APPEND_BATCH, MAX_APPEND_BYTES, MAX_CONTENT_BYTES

pytestmark = pytest.mark.slow


async def test_the_largest_accepted_batch_is_stored(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    # 64 messages of just under 1 MiB and their "{}" metadata: the byte limit, exactly.
    count = MAX_APPEND_BYTES // MAX_CONTENT_BYTES
    size = MAX_APPEND_BYTES // count - len("{}")
    batch = [NewMessage("user", chr(ord("a") + i % 26) * size) for i in range(count)]
    with use_scope(tenant):
        session = await store.create_session("bot")
        with pytest.raises(InvalidInput, match="bytes in one append"):
            await store.append_messages(session.id, [*batch, NewMessage("user", "x")])
        stored = await store.append_messages(session.id, batch)
        assert [m.seq for m in stored] == list(range(1, count + 1))
        assert stored[-1].content == batch[-1].content
        assert (await store.get_session(session.id)).message_count == count
    total = await owner_conn.fetchval(
        "SELECT sum(octet_length(content)) FROM messages WHERE tenant_id = $1", tenant
    )
    assert total == count * size


async def test_the_most_messages_in_one_batch_are_stored(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        stored = await store.append_messages(
            session.id, [NewMessage("user", f"m{i}") for i in range(MAX_APPEND_BATCH)]
        )
        assert len(stored) == MAX_APPEND_BATCH
        assert [m.content for m in await store.list_messages(session.id, after_seq=998)] == [
            "m998",
            "m999",
        ]
