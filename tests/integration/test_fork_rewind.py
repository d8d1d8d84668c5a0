"""fork_session and rewind_session: exact counters, pending inputs, scopes, and races.

Every test runs as the plain application role the store connects as (row-level
security applies), on real PostgreSQL (and on Citus in the citus lane, where
any statement that would reach more than one shard is an error).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

import cortex
from cortex import (
    ForkedFrom,
    FunctionResponse,
    InvalidInput,
    ListFilter,
    Message,
    NewMessage,
    NotFound,
    RequestedInput,
    SessionAborted,
    SessionState,
    use_scope,
)
from cortex._calls import messages as message_calls
from cortex._db.executor import compile_statement
from cortex._sql import messages as message_sql
from cortex._sql.params import COPY_BASE, COPY_IDS, SCOPE_TENANT, SOURCE_ID, TARGET_ID, THROUGH_SEQ
from cortex.ids import format_id, new_uuid
from cortex.models import PREVIEW_LENGTH
from tests.conftest import Database, store_url

pytestmark = pytest.mark.citus


def _ask(interrupt_id: str, text: str = "") -> NewMessage:
    return NewMessage(
        "assistant",
        text or f"asks {interrupt_id}",
        requested_input=RequestedInput(
            interrupt_id=interrupt_id,
            message=f"Approve {interrupt_id}?",
            response_schema={"type": "object"},
            payload={"amount": 140, "big": 1e16},
        ),
    )


def _answer(*interrupt_ids: str) -> NewMessage:
    return NewMessage(
        "user",
        f"answers {' '.join(interrupt_ids)}",
        function_responses=[FunctionResponse(id=i, response={"ok": True}) for i in interrupt_ids],
    )


async def _all(store: cortex.Store, sid: str) -> list[Message]:
    out: list[Message] = []
    while True:
        page = await store.list_messages(sid, after_seq=out[-1].seq if out else 0, limit=1000)
        if not page:
            return out
        out += page


async def _consistent(store: cortex.Store, sid: str) -> cortex.Session:
    """The session, checked: its counters equal its rows, seq runs 1..n, pending equals inspect."""
    detail = await store.inspect_session(sid)
    session = detail.session
    rows = await _all(store, sid)
    assert [m.seq for m in rows] == list(range(1, session.message_count + 1))
    assert session.last_message == (rows[-1].content[:PREVIEW_LENGTH] if rows else "")
    if session.state is not SessionState.ABORTED:
        assert session.pending_count == len(detail.pending)
    return session


def _fields(m: Message) -> tuple[Any, ...]:
    return (
        m.seq,
        m.role,
        m.content,
        m.author,
        m.requested_inputs,
        m.function_responses,
        m.metadata,
        m.payload,
        m.created_at,
    )


# --- fork --------------------------------------------------------------------------


async def test_a_fork_copies_a_prefix_with_exact_counters(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/team/u1"):
        source = await store.create_session(
            "bot",
            title="refunds",
            metadata={"ticket": "T-7", "big": 1e16},
            key="order-42",
            is_default=True,
            data={"step": "two"},
        )
        await store.append_messages(
            source.id,
            [
                NewMessage("user", "hello", author="ann", metadata={"lang": "en"}),
                _ask("q1"),
                NewMessage("assistant", "x" * 1000, payload={"type": "event", "n": [1, 2.5]}),
                _answer("q1"),
                _ask("q2"),
            ],
        )
    with use_scope(tenant):  # an ancestor scope forks it
        fork = await store.fork_session(source.id, through_seq=3)
        assert fork.id != source.id
        assert fork.scope == source.scope
        assert (fork.agent_id, fork.title, fork.metadata) == ("bot", "refunds", source.metadata)
        assert fork.data == {"step": "two"}
        assert fork.key is None
        assert not fork.is_default
        assert fork.forked_from == ForkedFrom(session_id=source.id, seq=3)
        assert fork.message_count == 3
        assert fork.last_message == "x" * PREVIEW_LENGTH
        # q1 is asked at 2 and answered at 4, after the copy: pending in the fork.
        assert fork.pending_count == 1
        assert fork.state is SessionState.PAUSED
        assert fork.created_at >= source.created_at
        await _consistent(store, fork.id)
        copied, original = await _all(store, fork.id), await _all(store, source.id)
        assert [_fields(m) for m in copied] == [_fields(m) for m in original[:3]]
        assert all(m.session_id == fork.id for m in copied)
        assert not {m.id for m in copied} & {m.id for m in original}
        # The source is as it was: still the default, still keyed, still paused on q2.
        after = await store.get_session(source.id)
        assert after.forked_from is None
        assert (after.message_count, after.pending_count, after.is_default) == (5, 1, True)
        assert after.updated_at == (await store.get_session(source.id)).updated_at
    with use_scope(f"{tenant}/team/u1"):
        assert (await store.get_session_by_key("bot", "order-42")).id == source.id
        # The fork is the source's agent's session in the source's scope.
        listed = await store.list_sessions(ListFilter(exact=True, agent_id="bot"))
        assert {s.id for s in listed} == {source.id, fork.id}


async def test_a_fork_by_default_copies_everything_and_appends_go_on(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_messages(source.id, [NewMessage("user", f"m{i}") for i in range(1, 6)])
        fork = await store.fork_session(source.id, title="what if")
        assert (fork.message_count, fork.title, fork.last_message) == (5, "what if", "m5")
        assert fork.forked_from == ForkedFrom(session_id=source.id, seq=5)
        nxt = await store.append_message(fork.id, NewMessage("user", "only in the fork"))
        assert nxt.seq == 6
        assert nxt.created_at >= fork.updated_at
        assert (await store.append_message(source.id, NewMessage("user", "m6"))).seq == 6
        assert [m.content for m in await _all(store, fork.id)][-1] == "only in the fork"
        assert (await store.get_session(source.id)).message_count == 6
        await _consistent(store, fork.id)
        await _consistent(store, source.id)


async def test_an_empty_fork_and_a_fork_past_the_end(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot", title="t")
        await store.append_messages(source.id, [_ask("q"), NewMessage("user", "two")])
        empty = await store.fork_session(source.id, through_seq=0)
        assert (empty.message_count, empty.last_message, empty.pending_count) == (0, "", 0)
        assert empty.state is SessionState.IDLE
        assert empty.forked_from == ForkedFrom(session_id=source.id, seq=0)
        assert await _all(store, empty.id) == []
        assert (await store.append_message(empty.id, NewMessage("user", "first"))).seq == 1
        before = await store.count_sessions()
        for past in (3, 2**31 - 1):
            with pytest.raises(InvalidInput, match="through_seq"):
                await store.fork_session(source.id, through_seq=past)
        assert await store.count_sessions() == before


async def test_hostile_arguments_are_refused_before_anything_is_written(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_message(source.id, NewMessage("user", "one"))
        loose: Any = store  # wrong types, past the type checker
        calls: list[tuple[str, Any]] = [
            ("through_seq", lambda: store.fork_session(source.id, through_seq=-1)),
            ("through_seq", lambda: store.fork_session(source.id, through_seq=2**31)),
            ("through_seq", lambda: store.fork_session(source.id, through_seq=True)),
            ("through_seq", lambda: loose.fork_session(source.id, through_seq=1.0)),
            ("through_seq", lambda: loose.fork_session(source.id, through_seq="1")),
            ("title", lambda: store.fork_session(source.id, title="t" * 1001)),
            ("title", lambda: store.fork_session(source.id, title="a\x00b")),
            ("title", lambda: loose.fork_session(source.id, title=b"t")),
            ("session_id", lambda: store.fork_session("ses_")),
            ("session_id", lambda: store.fork_session(format_id("msg", new_uuid()))),
            ("session_id", lambda: loose.fork_session(None)),
            ("to_seq", lambda: store.rewind_session(source.id, to_seq=-1)),
            ("to_seq", lambda: store.rewind_session(source.id, to_seq=2**31)),
            ("to_seq", lambda: store.rewind_session(source.id, to_seq=False)),
            ("to_seq", lambda: loose.rewind_session(source.id, to_seq="0")),
            ("to_seq", lambda: loose.rewind_session(source.id)),
            ("to_seq", lambda: store.rewind_session(source.id, to_seq=2)),
            ("session_id", lambda: store.rewind_session("x", to_seq=0)),
        ]
        for name, call in calls:
            with pytest.raises(InvalidInput, match=name):
                await call()
        assert await store.count_sessions() == 1
        assert (await _consistent(store, source.id)).message_count == 1


async def test_a_fork_keeps_each_question_as_the_copied_range_leaves_it(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_messages(
            source.id,
            [
                _ask("a"),  # 1: answered at 3
                NewMessage(  # 2: two questions at once; c is answered at 4
                    "assistant",
                    "two at once",
                    requested_inputs=[
                        RequestedInput(interrupt_id="b", message="B?"),
                        RequestedInput(interrupt_id="c", message="C?"),
                    ],
                ),
                _answer("a"),  # 3
                _answer("c"),  # 4
                _answer("zz"),  # 5: answers nothing asked
                _ask("a", "asked again"),  # 6: a second "a", never answered
            ],
        )
        raised = {
            (p.raised_seq, p.interrupt_id): p
            for p in (await store.inspect_session(source.id)).pending
        }
        assert set(raised) == {(2, "b"), (6, "a")}
        expected = {
            0: set(),
            1: {(1, "a")},
            2: {(1, "a"), (2, "b"), (2, "c")},
            3: {(2, "b"), (2, "c")},
            4: {(2, "b")},
            6: {(2, "b"), (6, "a")},
        }
        for through, pending in expected.items():
            fork = await store.fork_session(source.id, through_seq=through)
            detail = await store.inspect_session(fork.id)
            assert {(p.raised_seq, p.interrupt_id) for p in detail.pending} == pending, through
            assert fork.pending_count == len(pending)
            assert fork.state is (SessionState.PAUSED if pending else SessionState.IDLE)
            for p in detail.pending:
                if (p.raised_seq, p.interrupt_id) in raised:  # still pending in the source
                    assert p == raised[(p.raised_seq, p.interrupt_id)]
                else:  # answered later in the source: raised when its message was appended
                    asked = (await store.list_messages(source.id, after_seq=p.raised_seq - 1))[0]
                    assert p.raised_at == asked.created_at
                    (question,) = [
                        q for q in asked.requested_inputs if q.interrupt_id == p.interrupt_id
                    ]
                    assert (p.message, p.payload) == (question.message, question.payload)
            await _consistent(store, fork.id)
        # A question pending in a fork is answered there, and only there.
        fork = await store.fork_session(source.id, through_seq=1)
        await store.resume(fork.id, "a", {"ok": True}, author="ops")
        assert (await _consistent(store, fork.id)).pending_count == 0
        assert (await _consistent(store, source.id)).pending_count == 2


async def test_an_aborted_or_interrupted_session_forks_into_a_plain_one(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_messages(source.id, [NewMessage("user", "hi"), _ask("q")])
        await store.mark_interrupted(source.id, "draining")
        interrupted = await store.fork_session(source.id)
        detail = await store.inspect_session(interrupted.id)
        assert detail.interrupt_reason is None
        assert detail.state is SessionState.PAUSED
        assert [p.interrupt_id for p in detail.pending] == ["q"]
        await store.abort_session(source.id, "withdrawn")
        fork = await store.fork_session(source.id)
        detail = await store.inspect_session(fork.id)
        # The abort cleared the source's pending inputs; the fork has the question back.
        assert (detail.abort_reason, detail.interrupt_reason) == (None, None)
        assert detail.state is SessionState.PAUSED
        assert [p.interrupt_id for p in detail.pending] == ["q"]
        await store.resume(fork.id, "q", {"ok": True})
        assert (await store.get_session(fork.id)).state is SessionState.IDLE
        assert (await store.get_session(source.id)).state is SessionState.ABORTED


async def test_forks_of_forks_and_of_deleted_sources(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_messages(source.id, [NewMessage("user", f"m{i}") for i in range(4)])
        child = await store.fork_session(source.id, through_seq=3)
        grandchild = await store.fork_session(child.id, through_seq=2)
        assert grandchild.forked_from == ForkedFrom(session_id=child.id, seq=2)
        await store.delete_session(source.id)
        # The lineage outlives its source.
        assert (await store.get_session(child.id)).forked_from == ForkedFrom(
            session_id=source.id, seq=3
        )
        with pytest.raises(NotFound):
            await store.fork_session(source.id)
        assert [m.content for m in await _all(store, grandchild.id)] == ["m0", "m1"]
        listed = {s.id: s.forked_from for s in await store.list_sessions()}
        assert listed == {
            child.id: ForkedFrom(session_id=source.id, seq=3),
            grandchild.id: ForkedFrom(session_id=child.id, seq=2),
        }


async def test_a_long_session_forks_in_chunks(
    store: cortex.Store, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(message_calls, "FORK_CHUNK", 7)
    with use_scope(tenant):
        source = await store.create_session("bot")
        await store.append_messages(source.id, [NewMessage("user", f"m{i}") for i in range(1, 31)])
        for through in (6, 7, 8, 14, 30):
            fork = await store.fork_session(source.id, through_seq=through)
            copied = await _all(store, fork.id)
            assert [m.content for m in copied] == [f"m{i}" for i in range(1, through + 1)]
            assert len({m.id for m in copied}) == through
            await _consistent(store, fork.id)


async def test_a_fork_of_more_than_one_chunk(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        source = await store.create_session("bot")
        for start in range(0, 2100, 700):
            batch = [NewMessage("user", f"m{i}") for i in range(start + 1, start + 701)]
            await store.append_messages(source.id, batch)
        fork = await store.fork_session(source.id, through_seq=2050)
        assert fork.message_count == 2050
        copied = await _all(store, fork.id)
        assert [m.content for m in copied] == [f"m{i}" for i in range(1, 2051)]
        await _consistent(store, fork.id)


# --- rewind ------------------------------------------------------------------------


async def test_a_rewind_removes_the_tail_with_exact_counters(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot", data={"step": 5})
        stored = await store.append_messages(
            s.id, [NewMessage("user", f"m{i}" + "y" * 300) for i in range(1, 6)]
        )
        before = await store.get_session(s.id)
        rewound = await store.rewind_session(s.id, to_seq=3)
        assert rewound.message_count == 3
        assert rewound.last_message == ("m3" + "y" * 300)[:PREVIEW_LENGTH]
        assert rewound.updated_at >= before.updated_at
        assert rewound.data == {"step": 5}  # state documents stay
        assert [m.id for m in await _all(store, s.id)] == [m.id for m in stored[:3]]
        # seq restarts after to_seq, under a new id and a later time.
        again = await store.append_message(s.id, NewMessage("user", "new four"))
        assert again.seq == 4
        assert again.id not in {m.id for m in stored}
        assert again.created_at >= stored[-1].created_at
        await _consistent(store, s.id)
        # Rewinding to the end changes nothing, not even updated_at.
        same = await store.get_session(s.id)
        assert await store.rewind_session(s.id, to_seq=4) == same
        emptied = await store.rewind_session(s.id, to_seq=0)
        assert (emptied.message_count, emptied.last_message) == (0, "")
        assert (await store.append_message(s.id, NewMessage("user", "first"))).seq == 1
        await _consistent(store, s.id)


async def test_a_rewind_past_the_end_or_of_an_aborted_session_changes_nothing(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "a"), _ask("q")])
        before = await store.get_session(s.id)
        with pytest.raises(InvalidInput, match="to_seq"):
            await store.rewind_session(s.id, to_seq=3)
        assert await store.get_session(s.id) == before
        await store.abort_session(s.id, "stop")
        aborted = await store.get_session(s.id)
        for to_seq in (0, 1, 2, 3):
            with pytest.raises(SessionAborted):
                await store.rewind_session(s.id, to_seq=to_seq)
        assert await store.get_session(s.id) == aborted
        assert len(await _all(store, s.id)) == 2


async def test_a_rewind_takes_back_questions_and_answers(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(
            s.id,
            [
                _ask("a"),  # 1: answered at 2, before every cut below
                _answer("a"),  # 2
                NewMessage(  # 3: b and c at once, both answered at 5
                    "assistant",
                    "two",
                    requested_inputs=[
                        RequestedInput(interrupt_id="b", message="B?", payload=[1e16]),
                        RequestedInput(interrupt_id="c"),
                    ],
                ),
                _ask("d"),  # 4: never answered
                _answer("b", "c"),  # 5
                _ask("e"),  # 6: never answered
            ],
        )
        asked = {m.seq: m for m in await _all(store, s.id)}
        assert [p.interrupt_id for p in (await store.inspect_session(s.id)).pending] == ["d", "e"]
        d_before = (await store.inspect_session(s.id)).pending[0]

        rewound = await store.rewind_session(s.id, to_seq=5)  # e is gone
        assert rewound.pending_count == 1
        assert rewound.state is SessionState.PAUSED

        rewound = await store.rewind_session(s.id, to_seq=4)  # b and c are pending again
        detail = await store.inspect_session(s.id)
        assert [(p.raised_seq, p.interrupt_id) for p in detail.pending] == [
            (3, "b"),
            (3, "c"),
            (4, "d"),
        ]
        assert rewound.pending_count == 3
        assert detail.pending[2] == d_before  # a question that stayed pending keeps its row
        b = detail.pending[0]
        assert (b.message, b.payload, b.raised_at) == ("B?", [1e16], asked[3].created_at)
        await _consistent(store, s.id)

        await store.resume(s.id, "c", {"ok": True}, author="ops")  # seq 5 again, a new message
        assert [p.interrupt_id for p in (await store.inspect_session(s.id)).pending] == ["b", "d"]
        rewound = await store.rewind_session(s.id, to_seq=2)  # a stays answered
        assert (rewound.pending_count, rewound.state) == (0, SessionState.IDLE)
        await _consistent(store, s.id)
        with pytest.raises(cortex.Conflict):
            await store.resume(s.id, "a", {"ok": True})


async def test_a_rewind_leaves_the_markers_alone(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "a"), NewMessage("user", "b")])
        await store.mark_interrupted(s.id, "draining")
        rewound = await store.rewind_session(s.id, to_seq=1)
        assert rewound.state is SessionState.INTERRUPTED
        assert (await store.inspect_session(s.id)).interrupt_reason == "draining"
        await store.clear_interrupted(s.id)
        assert (await store.get_session(s.id)).state is SessionState.IDLE


async def test_a_reader_s_cursor_sees_that_the_transcript_was_rewound(
    store: cortex.Store, tenant: str
) -> None:
    """seq restarts after to_seq: a reader keeps the id at its cursor and compares it."""
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", f"m{i}") for i in range(1, 6)])
        page = await store.list_messages(s.id, after_seq=0)
        cursor = page[-1]  # the reader has read up to seq 5
        await store.rewind_session(s.id, to_seq=3)
        await store.append_messages(s.id, [NewMessage("user", f"n{i}") for i in (4, 5, 6)])
        # A reader that followed seq alone would take n6 as the next message and
        # never see n4, n5: its own last message is checked first.
        check = await store.list_messages(s.id, after_seq=cursor.seq - 1, limit=1)
        assert check[0].seq == cursor.seq
        assert check[0].id != cursor.id
        # Message ids are never reused, and appends after the rewind are later
        # than everything it removed: since= finds them all.
        tail = await store.list_messages(s.id, since=cursor.created_at)
        assert [m.content for m in tail] == ["n4", "n5", "n6"]
        assert {m.id for m in tail}.isdisjoint(m.id for m in page)


# --- scopes --------------------------------------------------------------------------


async def test_other_scopes_and_tenants_cannot_fork_or_rewind(
    store: cortex.Store, database: Database, tenant: str, other_tenant: str
) -> None:
    with use_scope(f"{tenant}/a/u1"):
        s = await store.create_session("bot", title="secret")
        await store.append_messages(s.id, [NewMessage("user", "private"), _ask("q")])
        before = await store.get_session(s.id)
    async with cortex.connect(database.owner_url) as superuser:
        assert superuser.bypasses_row_level_security
        for store_ in (store, superuser):
            for scope in (f"{tenant}/b", f"{tenant}/a/u1x", f"{tenant}/a/u1/deeper", other_tenant):
                with use_scope(scope):
                    with pytest.raises(NotFound):
                        await store_.fork_session(s.id)
                    with pytest.raises(NotFound):
                        await store_.fork_session(s.id, through_seq=0)
                    with pytest.raises(NotFound):
                        await store_.rewind_session(s.id, to_seq=0)
                    assert await store_.count_sessions() == 0
    with use_scope(tenant):
        assert await store.count_sessions() == 1
        assert await store.get_session(s.id) == before
        await _consistent(store, s.id)


async def test_row_level_security_alone_stops_a_copy_naming_another_tenant(
    store: cortex.Store, tenant: str, other_tenant: str, app_conn: asyncpg.Connection
) -> None:
    from tests.integration.test_tenancy import _binding

    with use_scope(tenant):
        victim = await store.create_session("bot")
        await store.append_messages(victim.id, [NewMessage("user", "private")])
    with use_scope(other_tenant):
        mine = await store.create_session("bot")
    # The copy statement as the store sends it, its own predicate naming the
    # victim's tenant, on a connection bound to the other one.
    copy = compile_statement(message_sql.copy_statement())
    values = {
        SCOPE_TENANT: tenant,
        TARGET_ID: _uuid(mine.id),
        SOURCE_ID: _uuid(victim.id),
        COPY_BASE: 0,
        COPY_IDS: [new_uuid()],
        THROUGH_SEQ: 1,
    }
    async with app_conn.transaction():
        await app_conn.execute(_binding(other_tenant))
        assert await app_conn.fetch(copy.sql, *[values[n] for n in copy.order]) == []
    with use_scope(other_tenant):
        assert (await store.get_session(mine.id)).message_count == 0
        assert await _all(store, mine.id) == []


def _uuid(sid: str) -> uuid.UUID:
    from cortex.models import session_uuid

    return session_uuid(sid)


# --- races ---------------------------------------------------------------------------


@pytest.fixture
async def racing_store(database: Database) -> AsyncIterator[cortex.Store]:
    """A store with a connection per racing task."""
    async with cortex.connect(store_url(database), pool_size=12, max_overflow=0) as s:
        yield s


async def test_rewinds_racing_appends_keep_counters_equal_to_rows(
    racing_store: cortex.Store, tenant: str
) -> None:
    store = racing_store
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "seed")] * 5)
        appended: list[Message] = []
        rewound: list[cortex.Session] = []

        async def append(worker: int) -> None:
            for i in range(25):
                batch = [NewMessage("user", f"w{worker}-{i}-{j}") for j in range(1 + i % 3)]
                appended.extend(await store.append_messages(s.id, batch))

        async def rewind() -> None:
            for i in range(12):
                current = await store.get_session(s.id)
                # InvalidInput: a concurrent rewind went below it, and nothing happened.
                with contextlib.suppress(InvalidInput):
                    to_seq = current.message_count // 2 + i % 2
                    rewound.append(await store.rewind_session(s.id, to_seq=to_seq))

        async with anyio.create_task_group() as tg:
            for worker in range(6):
                tg.start_soon(append, worker)
            tg.start_soon(rewind)
            tg.start_soon(rewind)
        assert len(rewound) > 10
        final = await _consistent(store, s.id)
        rows = await _all(store, s.id)
        # Every row is the seed or an append whose seq it still holds.
        survivors = {m.id: m.seq for m in appended}
        assert all(m.content == "seed" or survivors[m.id] == m.seq for m in rows)
        assert len({m.id for m in rows}) == final.message_count
        nxt = await store.append_message(s.id, NewMessage("user", "next"))
        assert nxt.seq == final.message_count + 1


async def test_forks_racing_appends_are_prefixes_the_source_held(
    racing_store: cortex.Store, tenant: str
) -> None:
    store = racing_store
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "seed"), _ask("q")])
        forks: list[tuple[int, cortex.Session]] = []
        stop = anyio.Event()

        async def append(worker: int) -> None:
            i = 0
            while not stop.is_set():
                batch = [NewMessage("user", f"w{worker}-{i}-{j}") for j in range(1 + i % 4)]
                if i % 5 == 0:
                    batch.append(_answer("q") if i % 10 == 0 else _ask("q"))
                await store.append_messages(s.id, batch)
                i += 1

        async def fork() -> None:
            for _ in range(8):
                floor = (await store.get_session(s.id)).message_count
                forks.append((floor, await store.fork_session(s.id)))
            stop.set()

        async with anyio.create_task_group() as tg:
            for worker in range(5):
                tg.start_soon(append, worker)
            tg.start_soon(fork)
        source = await _all(store, s.id)
        grew = 0
        for floor, made in forks:
            assert made.message_count >= floor
            grew += made.message_count > floor
            copied = await _all(store, made.id)
            assert [_fields(m) for m in copied] == [_fields(m) for m in source[: len(copied)]]
            fork_session = await _consistent(store, made.id)
            assert fork_session.message_count == len(copied)
            # Pending as the prefix leaves it: an ask no later copied message answers.
            asks = [m.seq for m in copied if m.requested_inputs]
            answers = [m.seq for m in copied if m.function_responses]
            assert fork_session.pending_count == sum(
                1 for a in asks if not any(x > a for x in answers)
            )


async def test_a_fork_racing_a_rewind_copies_one_side_of_it(
    racing_store: cortex.Store, tenant: str
) -> None:
    store = racing_store
    with use_scope(tenant):
        for _ in range(6):
            s = await store.create_session("bot")
            stored = await store.append_messages(
                s.id, [NewMessage("user", f"m{i}") for i in range(40)]
            )
            made: list[cortex.Session] = []

            async def fork(sid: str = s.id, made: list[cortex.Session] = made) -> None:
                made.append(await store.fork_session(sid))

            async def rewind(sid: str = s.id) -> None:
                await store.rewind_session(sid, to_seq=10)

            async with anyio.create_task_group() as tg:
                tg.start_soon(fork)
                tg.start_soon(rewind)
            (fork_session,) = made
            assert fork_session.message_count in (10, 40)
            copied = await _all(store, fork_session.id)
            assert [m.content for m in copied] == [m.content for m in stored[: len(copied)]]
            await _consistent(store, fork_session.id)
            assert (await _consistent(store, s.id)).message_count == 10
