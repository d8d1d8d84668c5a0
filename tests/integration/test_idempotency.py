"""Retrying an ambiguous commit stores nothing twice, and what a taken id reveals.

A proxy forwards COMMIT and then drops the client's socket: the server
commits, the caller gets DatabaseUnavailable. The retry with the same
client-chosen ids returns what was stored.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

import cortex
from cortex import Conflict, DatabaseUnavailable, NewMessage, NotFound, use_scope
from cortex.ids import format_id, new_uuid
from tests.conftest import Database
from tests.figures import record
from tests.proxy import CommitDropProxy, commit_drop_proxy

pytestmark = pytest.mark.reliability

ROUNDS = int(os.environ.get("CORTEX_AMBIGUOUS_ROUNDS", "5"))


def message_id() -> str:
    return format_id("msg", new_uuid())


def session_id() -> str:
    return format_id("ses", new_uuid())


@pytest.fixture
async def proxy(database: Database) -> AsyncIterator[CommitDropProxy]:
    async with commit_drop_proxy(database.app_url) as p:
        yield p


@pytest.fixture
async def proxied(database: Database, proxy: CommitDropProxy) -> AsyncIterator[cortex.Store]:
    url = proxy.client_url(database.app_url)
    async with cortex.connect(url, connect_args={"ssl": False}) as store:
        yield store


async def _rows(owner_conn: asyncpg.Connection, tenant: str, sid: str) -> tuple[int, int]:
    row = await owner_conn.fetchrow(
        "SELECT (SELECT count(*) FROM messages WHERE tenant_id = $1),"
        " (SELECT coalesce(sum(message_count), 0) FROM sessions WHERE tenant_id = $1)",
        tenant,
    )
    assert row is not None
    return int(row[0]), int(row[1])


async def test_retried_append_after_ambiguous_commit_is_stored_once(
    proxied: cortex.Store, proxy: CommitDropProxy, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    with use_scope(tenant):
        session = await proxied.create_session("bot")
        for _ in range(ROUNDS):
            batch = [
                NewMessage("user", "hello", id=message_id(), metadata={"n": 1e16}),
                NewMessage("assistant", "hi", id=message_id()),
            ]
            proxy.arm()
            with pytest.raises(DatabaseUnavailable):
                await proxied.append_messages(session.id, batch)
            record("ambiguous commits: appends committed, then the connection dropped")
            retried = await proxied.append_messages(session.id, batch)
            record("ambiguous commits: retries answered with the stored messages")
            assert [m.id for m in retried] == [m.id for m in batch]
            assert [m.content for m in retried] == ["hello", "hi"]
            assert retried[0].metadata == {"n": 1e16}
            again = await proxied.append_messages(session.id, batch)
            assert [(m.id, m.seq) for m in again] == [(m.id, m.seq) for m in retried]
        stored = await proxied.get_session(session.id)
        listed = await proxied.list_messages(session.id, limit=1000)
    assert stored.message_count == len(listed) == 2 * ROUNDS
    assert [m.seq for m in listed] == list(range(1, 2 * ROUNDS + 1))
    assert await _rows(owner_conn, tenant, session.id) == (2 * ROUNDS, 2 * ROUNDS)
    record("ambiguous commits: messages stored twice", 0)


async def test_retried_create_after_ambiguous_commit_returns_the_session(
    proxied: cortex.Store, proxy: CommitDropProxy, tenant: str
) -> None:
    with use_scope(f"{tenant}/u1"):
        for _ in range(ROUNDS):
            sid = session_id()
            proxy.arm()
            with pytest.raises(DatabaseUnavailable):
                await proxied.create_session("bot", title="t", metadata={"k": -0.0}, session_id=sid)
            record("ambiguous commits: creates committed, then the connection dropped")
            session = await proxied.create_session(
                "bot", title="t", metadata={"k": -0.0}, session_id=sid
            )
            assert session.id == sid
            assert session.title == "t"
            assert str(session.metadata["k"]) == "-0.0"
        assert await proxied.count_sessions() == ROUNDS


async def test_key_reused_with_different_content_is_conflict(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    with use_scope(tenant):
        session = await store.create_session("bot")
        other = await store.create_session("bot")
        mid = message_id()
        (first,) = await store.append_messages(session.id, [NewMessage("user", "a", id=mid)])
        assert first.id == mid
        for changed in (
            NewMessage("user", "b", id=mid),
            NewMessage("assistant", "a", id=mid),
            NewMessage("user", "a", id=mid, author="x"),
            NewMessage("user", "a", id=mid, metadata={"k": 1}),
        ):
            with pytest.raises(Conflict):
                await store.append_messages(session.id, [changed])
        with pytest.raises(Conflict):  # the same message, another session
            await store.append_messages(other.id, [NewMessage("user", "a", id=mid)])
        with pytest.raises(Conflict):  # half of the batch was stored before
            await store.append_messages(
                session.id,
                [NewMessage("user", "a", id=mid), NewMessage("user", "c", id=message_id())],
            )
        with pytest.raises(cortex.InvalidInput):  # one key twice in a batch
            await store.append_messages(
                session.id, [NewMessage("user", "a", id=mid), NewMessage("user", "a", id=mid)]
            )
        assert (await store.get_session(session.id)).message_count == 1
        assert (await store.get_session(other.id)).message_count == 0


async def test_create_retry_with_other_attributes_is_conflict(
    store: cortex.Store, tenant: str
) -> None:
    sid = session_id()
    with use_scope(f"{tenant}/u1"):
        created = await store.create_session("bot", title="t", session_id=sid)
        assert (await store.create_session("bot", title="t", session_id=sid)).id == created.id
        with pytest.raises(Conflict):
            await store.create_session("bot", title="other", session_id=sid)
        with pytest.raises(Conflict):
            await store.create_session("bot", title="t", metadata={"a": 1}, session_id=sid)
        with pytest.raises(Conflict):
            await store.create_session("bot", title="t", is_default=True, session_id=sid)
        with pytest.raises(Conflict):
            await store.create_session("bot2", title="t", session_id=sid)


async def test_a_taken_id_seen_from_a_sibling_scope_reveals_only_that_it_is_taken(
    store: cortex.Store, tenant: str
) -> None:
    sid = session_id()
    with use_scope(f"{tenant}/user-1"):
        await store.create_session("secret-agent", title="secret title", session_id=sid)
    with use_scope(f"{tenant}/user-2"):
        with pytest.raises(NotFound):
            await store.get_session(sid)
        # Identical attributes from another scope are still someone else's session.
        with pytest.raises(Conflict) as info:
            await store.create_session("secret-agent", title="secret title", session_id=sid)
        message = str(info.value)
        assert "user-1" not in message
        assert "secret" not in message
        assert message == f"session id {sid} is already taken"
        assert await store.count_sessions() == 0
    # The parent sees the session but did not create it there.
    with use_scope(tenant), pytest.raises(Conflict):
        await store.create_session("secret-agent", title="secret title", session_id=sid)


STORM_CALLS = int(os.environ.get("CORTEX_AMBIGUOUS_STORM", "60"))


async def test_ambiguous_commit_storm(
    proxied: cortex.Store, proxy: CommitDropProxy, owner_conn: asyncpg.Connection, tenant: str
) -> None:
    """Concurrent keyed appends, a third of them losing their COMMIT reply, each retried until answered."""
    with use_scope(tenant):
        sessions = [(await proxied.create_session("bot")).id for _ in range(4)]
    sent: dict[str, int] = dict.fromkeys(sessions, 0)
    ambiguous = 0

    async def caller(worker: int) -> None:
        nonlocal ambiguous
        for i in range(STORM_CALLS // 4):
            sid = sessions[(worker + i) % len(sessions)]
            batch = [NewMessage("user", f"{worker}:{i}:{k}", id=message_id()) for k in range(3)]
            if random.random() < 1 / 3:
                proxy.arm()
            with use_scope(tenant):
                while True:
                    try:
                        stored = await proxied.append_messages(sid, batch)
                    except DatabaseUnavailable:
                        ambiguous += 1
                        continue  # the safe retry: the same batch, the same ids
                    break
            assert [m.id for m in stored] == [m.id for m in batch]
            sent[sid] += len(batch)

    async with anyio.create_task_group() as tg:
        for worker in range(4):
            tg.start_soon(caller, worker)
    rows = await owner_conn.fetch(
        "SELECT s.id, s.message_count, count(m.id) AS n, count(DISTINCT m.content) AS distinct_n,"
        " coalesce(max(m.seq), 0) AS max_seq FROM sessions s"
        " LEFT JOIN messages m ON m.tenant_id = s.tenant_id AND m.session_id = s.id"
        " WHERE s.tenant_id = $1 GROUP BY s.id, s.message_count",
        tenant,
    )
    for row in rows:
        assert row["message_count"] == row["n"] == row["distinct_n"] == row["max_seq"]
    assert sum(row["n"] for row in rows) == sum(sent.values())
    record("ambiguous-commit storm: keyed appends", sum(sent.values()) // 3)
    record("ambiguous-commit storm: COMMIT replies dropped", proxy.dropped)
    record("ambiguous-commit storm: DatabaseUnavailable, then retried", ambiguous)
    record("ambiguous-commit storm: messages stored twice", 0)
