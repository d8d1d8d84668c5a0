"""The operator surface: paused, aborted, interrupted; resume; markers; state by index."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

import cortex
from cortex import (
    AlreadyAborted,
    Conflict,
    FunctionResponse,
    InvalidInput,
    ListFilter,
    NewMessage,
    NotFound,
    RequestedInput,
    SessionAborted,
    SessionState,
    use_scope,
)
from cortex.ids import format_id, new_uuid
from cortex.models import MAX_INPUTS_PER_MESSAGE

pytestmark = [pytest.mark.citus, pytest.mark.sqlalchemy20]

SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "amount": {"type": "integer", "maximum": 100}},
    "required": ["approved"],
}


def ask(interrupt_id: str, *, schema: dict[str, object] | None = SCHEMA) -> NewMessage:
    return NewMessage(
        "assistant",
        f"asking {interrupt_id}",
        author="agent",
        requested_input=RequestedInput(
            interrupt_id=interrupt_id,
            message=f"Approve {interrupt_id}?",
            response_schema=schema,
            payload={"ticket": interrupt_id},
        ),
    )


def answer(interrupt_id: str) -> NewMessage:
    return NewMessage(
        "user", function_response=FunctionResponse(id=interrupt_id, response={"approved": True})
    )


async def test_pending_inputs_and_detail(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/ops"):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [NewMessage("user", "hi"), ask("i1"), ask("i2")])
        detail = await store.inspect_session(s.id)
        assert detail.state is SessionState.PAUSED
        assert detail.session.pending_count == 2
        assert [p.interrupt_id for p in detail.pending] == ["i1", "i2"]
        first = detail.pending[0]
        assert first.message == "Approve i1?"
        assert first.author == "agent"
        assert first.response_schema == SCHEMA
        assert first.payload == {"ticket": "i1"}
        assert first.raised_seq == 2
        assert first.raised_at.tzinfo is not None
        assert detail.abort_reason is None
        # Two pending inputs need two answers.
        await store.resume(s.id, "i1", {"approved": True}, author="ann")
        assert (await store.inspect_session(s.id)).state is SessionState.PAUSED
        msg = await store.resume(s.id, "i2", {"approved": False, "amount": 5})
        assert msg.function_response is not None
        assert msg.function_response.id == "i2"
        done = await store.inspect_session(s.id)
        assert done.state is SessionState.IDLE
        assert done.pending == []


async def test_answer_before_question_does_not_resolve(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [answer("x"), ask("x")])
        assert (await store.inspect_session(s.id)).state is SessionState.PAUSED
        # An answer in the same batch after the question resolves it.
        await store.append_messages(s.id, [ask("y"), answer("y")])
        pending = (await store.inspect_session(s.id)).pending
        assert [p.interrupt_id for p in pending] == ["x"]
        await store.append_message(s.id, answer("x"))
        assert (await store.get_session(s.id)).state is SessionState.IDLE


async def test_resume_refusals(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_message(s.id, ask("q"))
        with pytest.raises(NotFound):
            await store.resume(s.id, "never-asked", {"approved": True})
        with pytest.raises(InvalidInput, match=r"response: at amount: .*100"):
            await store.resume(s.id, "q", {"approved": True, "amount": 500})
        with pytest.raises(InvalidInput, match=r'at \(root\): "approved" is a required'):
            await store.resume(s.id, "q", {})
        assert (await store.get_session(s.id)).message_count == 1  # nothing written
        await store.resume(s.id, "q", {"approved": True})
        with pytest.raises(Conflict, match="already answered"):
            await store.resume(s.id, "q", {"approved": True})
        with pytest.raises(InvalidInput):
            await store.resume(s.id, "bad id", {})
    with use_scope(f"{tenant}-other"), pytest.raises(NotFound):
        await store.resume(s.id, "q", {"approved": True})


async def test_invalid_schema_refused_when_asked(store: cortex.Store, tenant: str) -> None:
    with pytest.raises(InvalidInput, match="response_schema"):
        ask("bad", schema={"type": "object", "properties": {"a": {"type": 12}}})


async def test_concurrent_resumes_exactly_one_wins(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_message(s.id, ask("race"))
    outcomes: list[str] = []

    async def resumer(i: int) -> None:
        with use_scope(tenant):
            try:
                await store.resume(s.id, "race", {"approved": True}, author=f"op{i}")
                outcomes.append("won")
            except Conflict:
                outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(resumer, i)
    assert sorted(outcomes) == ["conflict"] * 9 + ["won"]
    with use_scope(tenant):
        assert (await store.get_session(s.id)).message_count == 2


async def test_abort(store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection) -> None:
    with use_scope(tenant):
        s = await store.create_session("bot")
        await store.append_messages(s.id, [ask("a1"), ask("a2")])
        aborted = await store.abort_session(s.id, "operator stopped it")
        assert aborted.state is SessionState.ABORTED
        detail = await store.inspect_session(s.id)
        assert detail.state is SessionState.ABORTED
        assert detail.pending == []
        assert detail.abort_reason == "operator stopped it"
        with pytest.raises(AlreadyAborted):
            await store.abort_session(s.id, "again")
        with pytest.raises(SessionAborted):
            await store.resume(s.id, "a1", {"approved": True})
        with pytest.raises(InvalidInput):
            await store.abort_session(s.id, "x" * 1001)
        # A durable marker, not preemption: an in-flight turn may still write.
        await store.append_message(s.id, NewMessage("assistant", "late output"))
        assert (await store.inspect_session(s.id)).state is SessionState.ABORTED
    with use_scope(f"{tenant}-x"), pytest.raises(NotFound):
        await store.abort_session(s.id, "not yours")
    with use_scope(tenant):
        await store.delete_session(s.id)
    markers = await owner_conn.fetchval(
        "SELECT count(*) FROM session_markers WHERE tenant_id = $1", tenant
    )
    assert markers == 0


async def test_interrupt_markers(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/d"):
        s = await store.create_session("bot")
        await store.mark_interrupted(s.id, "draining for deploy")
        detail = await store.inspect_session(s.id)
        assert detail.state is SessionState.INTERRUPTED
        assert detail.interrupt_reason == "draining for deploy"
        await store.mark_interrupted(s.id, "second drain")  # overwrites
        assert (await store.inspect_session(s.id)).interrupt_reason == "second drain"
        # Precedence: paused beats interrupted; aborted beats both.
        await store.append_message(s.id, ask("p"))
        assert (await store.get_session(s.id)).state is SessionState.PAUSED
        await store.clear_interrupted(s.id)
        await store.clear_interrupted(s.id)  # no-op
        assert (await store.inspect_session(s.id)).interrupt_reason is None
        await store.mark_interrupted(s.id, "again")
        await store.append_message(s.id, answer("p"))
        assert (await store.get_session(s.id)).state is SessionState.INTERRUPTED
        await store.abort_session(s.id, "stop")
        assert (await store.get_session(s.id)).state is SessionState.ABORTED
        unmarked = await store.create_session("bot")
        await store.clear_interrupted(unmarked.id)
        assert (await store.get_session(unmarked.id)).state is SessionState.IDLE


async def test_parked_marker_waits_for_its_session(store: cortex.Store, tenant: str) -> None:
    sid = format_id("ses", new_uuid())
    other = format_id("ses", new_uuid())
    with use_scope(f"{tenant}/w1"):
        await store.mark_interrupted(sid, "turn in flight at shutdown")
        await store.mark_interrupted(other, "parked elsewhere")
    with use_scope(f"{tenant}/w2"):  # same id, another scope: the marker does not show
        s_other = await store.create_session("bot", session_id=other)
        assert s_other.state is SessionState.IDLE
    with use_scope(f"{tenant}/w1"):
        s = await store.create_session("bot", session_id=sid)
        assert s.state is SessionState.INTERRUPTED
        assert (await store.inspect_session(sid)).interrupt_reason == "turn in flight at shutdown"
        await store.delete_session(sid)
        again = await store.create_session("bot", session_id=sid)
        assert again.state is SessionState.IDLE  # markers went with the deleted session


async def test_state_filter_lists_and_counts(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/a"):
        paused = await store.create_session("bot")
        await store.append_message(paused.id, ask("z"))
        aborted = await store.create_session("bot")
        await store.abort_session(aborted.id, "r")
        interrupted = await store.create_session("bot")
        await store.mark_interrupted(interrupted.id, "r")
        idle = await store.create_session("bot")
    with use_scope(f"{tenant}/b"):
        elsewhere = await store.create_session("bot")
        await store.append_message(elsewhere.id, ask("z"))
    expected = {
        SessionState.PAUSED: {paused.id},
        SessionState.ABORTED: {aborted.id},
        SessionState.INTERRUPTED: {interrupted.id},
        SessionState.IDLE: {idle.id},
    }
    with use_scope(f"{tenant}/a"):
        for state, ids in expected.items():
            listed = await store.list_sessions(ListFilter(state=state))
            assert {s.id for s in listed} == ids, state
            assert {s.state for s in listed} == {state}
            assert await store.count_sessions(ListFilter(state=state)) == len(ids)
    with use_scope(tenant):
        assert await store.count_sessions(ListFilter(state=SessionState.PAUSED)) == 2


# --- several questions (and answers) in one message ------------------------------------


def _question(interrupt_id: str) -> RequestedInput:
    return RequestedInput(interrupt_id=interrupt_id, message=f"Approve {interrupt_id}?")


async def _pending(store: cortex.Store, sid: str) -> list[str]:
    detail = await store.inspect_session(sid)
    assert detail.session.pending_count == len(detail.pending)
    return [p.interrupt_id for p in detail.pending]


async def test_one_message_asks_several_questions(store: cortex.Store, tenant: str) -> None:
    """Each question of a message is pending until its own answer; the message reads back whole."""
    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        asked = await store.append_message(
            sid,
            NewMessage(
                "assistant",
                "two calls wait",
                requested_inputs=[_question("b-call"), _question("a-call"), _question("c-call")],
            ),
        )
        assert asked.requested_input is not None
        assert asked.requested_input.interrupt_id == "b-call"
        assert [q.interrupt_id for q in asked.requested_inputs] == ["b-call", "a-call", "c-call"]
        (stored,) = await store.list_messages(sid)
        assert stored.requested_inputs == asked.requested_inputs
        assert stored.requested_input == asked.requested_input
        assert await _pending(store, sid) == ["a-call", "b-call", "c-call"]
        assert (await store.get_session(sid)).state is SessionState.PAUSED

        await store.resume(sid, "a-call", {"approved": True})
        assert await _pending(store, sid) == ["b-call", "c-call"]
        # One message answering the other two.
        answer = await store.append_message(
            sid,
            NewMessage(
                "user",
                function_responses=[
                    FunctionResponse(id="c-call", response={"ok": 1}),
                    FunctionResponse(id="b-call", response={"ok": 2}),
                ],
            ),
        )
        assert [a.id for a in answer.function_responses] == ["c-call", "b-call"]
        assert await _pending(store, sid) == []
        assert (await store.get_session(sid)).state is SessionState.IDLE
        listed = await store.list_sessions(ListFilter(state=SessionState.PAUSED, limit=1000))
        assert sid not in {s.id for s in listed}

        # Popping the double answer re-opens both of its questions.
        popped = await store.pop_message(sid)
        assert popped is not None
        assert [a.id for a in popped.function_responses] == ["c-call", "b-call"]
        assert await _pending(store, sid) == ["b-call", "c-call"]


async def test_questions_answered_in_the_same_append(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        await store.append_messages(
            sid,
            [
                NewMessage("assistant", requested_inputs=[_question("x"), _question("y")]),
                NewMessage("user", function_response=FunctionResponse(id="y")),
            ],
        )
        assert await _pending(store, sid) == ["x"]


async def test_several_inputs_refused_when_malformed(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        with pytest.raises(InvalidInput, match="twice"):
            NewMessage("assistant", requested_inputs=[_question("x"), _question("x")])
        with pytest.raises(InvalidInput, match="twice"):
            NewMessage("user", function_responses=[FunctionResponse(id="x")] * 2)
        with pytest.raises(InvalidInput, match="not both"):
            NewMessage(
                "assistant", requested_input=_question("a"), requested_inputs=[_question("b")]
            )
        with pytest.raises(InvalidInput):
            NewMessage(
                "assistant",
                requested_inputs=[_question(f"q{i}") for i in range(MAX_INPUTS_PER_MESSAGE + 1)],
            )
        with pytest.raises(InvalidInput):
            await store.append_messages(
                sid,
                [{"role": "user", "requested_inputs": [{"interrupt_id": 5}]}],  # type: ignore[list-item]
            )
        assert (await store.get_session(sid)).message_count == 0


async def test_a_keyed_retry_with_other_questions_is_a_conflict(
    store: cortex.Store, tenant: str
) -> None:
    mid = format_id("msg", new_uuid())
    with use_scope(tenant):
        sid = (await store.create_session("bot")).id
        first = NewMessage("assistant", id=mid, requested_inputs=[_question("a"), _question("b")])
        await store.append_message(sid, first)
        assert (await store.append_message(sid, first)).seq == 1  # the same: a replay
        other = NewMessage("assistant", id=mid, requested_inputs=[_question("a"), _question("c")])
        with pytest.raises(Conflict):
            await store.append_message(sid, other)
        assert await _pending(store, sid) == ["a", "b"]
