"""Maintained operator state equals a from-scratch derivation over random histories.

Hypothesis draws message sequences (questions, answers and plain messages
over a small set of interrupt ids), split into random append batches, with
interrupt and abort markers at random points. After each history, the state,
pending inputs and the indexed state filter must equal what a plain Python
reading of the whole history says (contract section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cortex
from cortex import FunctionResponse, ListFilter, NewMessage, RequestedInput, SessionState, use_scope

pytestmark = pytest.mark.reliability

IDS = ["a", "b", "c"]


@dataclass(frozen=True)
class Step:
    kind: str  # "ask" | "answer" | "say" | "mark" | "clear" | "abort"
    interrupt_id: str = ""
    batch_break: bool = False


steps = st.lists(
    st.builds(
        Step,
        kind=st.sampled_from(["ask", "ask", "answer", "answer", "say", "mark", "clear", "abort"]),
        interrupt_id=st.sampled_from(IDS),
        batch_break=st.booleans(),
    ),
    max_size=14,
)


def derive(history: list[Step]) -> tuple[SessionState, list[str]]:
    """The contract, read off the whole history."""
    messages = [s for s in history if s.kind in ("ask", "answer", "say")]
    pending = [
        step.interrupt_id
        for i, step in enumerate(messages)
        if step.kind == "ask"
        and not any(
            later.kind == "answer" and later.interrupt_id == step.interrupt_id
            for later in messages[i + 1 :]
        )
    ]
    aborted = any(s.kind == "abort" for s in history)
    interrupted = False
    for s in history:
        if s.kind == "mark":
            interrupted = True
        elif s.kind == "clear":
            interrupted = False
    if aborted:
        return SessionState.ABORTED, []
    if pending:
        return SessionState.PAUSED, pending
    return (SessionState.INTERRUPTED if interrupted else SessionState.IDLE), []


def message(step: Step) -> NewMessage:
    if step.kind == "ask":
        return NewMessage(
            "assistant", requested_input=RequestedInput(interrupt_id=step.interrupt_id)
        )
    if step.kind == "answer":
        return NewMessage("user", function_response=FunctionResponse(id=step.interrupt_id))
    return NewMessage("user", "plain")


async def replay(store: cortex.Store, history: list[Step]) -> None:
    with use_scope("model/t"):
        session = await store.create_session("bot")
        batch: list[NewMessage] = []

        async def flush() -> None:
            if batch:
                await store.append_messages(session.id, list(batch))
                batch.clear()

        aborted = False
        for step in history:
            if step.kind in ("ask", "answer", "say"):
                batch.append(message(step))
                if step.batch_break:
                    await flush()
                continue
            await flush()
            if step.kind == "mark":
                await store.mark_interrupted(session.id, "drain")
            elif step.kind == "clear":
                await store.clear_interrupted(session.id)
            elif step.kind == "abort" and not aborted:
                await store.abort_session(session.id, "stop")
                aborted = True
        await flush()
        want_state, want_pending = derive(history)
        detail = await store.inspect_session(session.id)
        assert detail.state is want_state, history
        assert [p.interrupt_id for p in detail.pending] == want_pending, history
        if want_state is not SessionState.ABORTED:
            assert detail.session.pending_count == len(want_pending)
        listed = {s.id for s in await store.list_sessions(ListFilter(state=want_state, limit=1000))}
        assert session.id in listed
        for other in SessionState:
            if other is not want_state:
                found = await store.list_sessions(ListFilter(state=other, limit=1000))
                assert session.id not in {s.id for s in found}
        await store.delete_session(session.id)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=steps)
def test_maintained_state_equals_derivation(
    portal_store: cortex.Store, portal: anyio.from_thread.BlockingPortal, history: list[Step]
) -> None:
    portal.call(replay, portal_store, history)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=steps)
def test_router_forms_keep_the_same_state(
    portal_router_store: cortex.Store, portal: anyio.from_thread.BlockingPortal, history: list[Step]
) -> None:
    """The statements a Citus store sends (conftest.portal_router_store) maintain the same state."""
    portal.call(replay, portal_router_store, history)
