"""A Google ADK agent whose sessions live in cortex: no model call, a scripted "support desk".

The agent counts the user's visits (``user:`` state, shared by all of the
user's sessions), reads a greeting from ``app:`` state (shared by every user
of the app), and asks a human to approve refunds with a long-running
function call, which cortex shows as a pending input: the session is
*paused* until the approval arrives.

Run it with ``CORTEX_DATABASE_URL=postgresql://app@db/app python -m
examples.adk_agent`` (after ``cortex db upgrade``). tests/integration/
test_framework_examples.py runs it against the test database.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.runners import Runner
from google.genai import types

import cortex
from cortex.integrations.adk import CortexSessionService


class SupportDesk(BaseAgent):
    """Replies from state; asks for a human approval when a refund is requested."""

    async def _run_async_impl(self, ctx: InvocationContext) -> AsyncGenerator[Event, None]:
        said = ctx.user_content.parts[0].text if ctx.user_content and ctx.user_content.parts else ""
        visits = int(ctx.session.state.get("user:visits", 0)) + 1
        greeting = ctx.session.state.get("app:greeting", "Hello")
        reply = types.Content(role="model", parts=[types.Part(text=f"{greeting}! Visit {visits}.")])
        yield Event(
            invocation_id=ctx.invocation_id,
            author=self.name,
            content=reply,
            actions=EventActions(state_delta={"user:visits": visits, "last_said": said}),
        )
        if said and "refund" in said:
            call = types.FunctionCall(id=f"approve-{ctx.invocation_id}", name="approve_refund")
            yield Event(
                invocation_id=ctx.invocation_id,
                author=self.name,
                content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                long_running_tool_ids={call.id or ""},
            )


async def talk(runner: Runner, user: str, session_id: str, text: str) -> list[str]:
    """One turn; the texts the agent replied with."""
    message = types.Content(role="user", parts=[types.Part(text=text)])
    out = []
    async for event in runner.run_async(user_id=user, session_id=session_id, new_message=message):
        if event.content and event.content.parts and event.content.parts[0].text:
            out.append(event.content.parts[0].text)
    return out


async def main(url: str, tenant: str = "acme") -> dict[str, object]:
    """Two users talk to the desk in ``tenant``; returns what an operator would see."""
    async with cortex.connect(url) as store:
        # One line to switch: ADK's DatabaseSessionService becomes this.
        service = CortexSessionService(store, scope=tenant)
        runner = Runner(app_name="desk", agent=SupportDesk(name="desk"), session_service=service)
        await service.create_session(
            app_name="desk", user_id="ada", session_id="chat-1", state={"app:greeting": "Welcome"}
        )
        first = await talk(runner, "ada", "chat-1", "hi")
        await service.create_session(app_name="desk", user_id="ada", session_id="chat-2")
        second = await talk(runner, "ada", "chat-2", "I want a refund")
        await service.create_session(app_name="desk", user_id="bob", session_id="chat-1")
        other = await talk(runner, "bob", "chat-1", "hi")
        # The operator surface over ADK sessions: which are waiting for a human?
        with cortex.use_scope(tenant):
            paused = await store.list_sessions(cortex.ListFilter(state=cortex.SessionState.PAUSED))
            pending = [
                p.message for s in paused for p in (await store.inspect_session(s.id)).pending
            ]
        return {
            "replies": [first, second, other],
            "paused": [s.key for s in paused],
            "pending": pending,
            "ada": await service.get_user_state(app_name="desk", user_id="ada"),
        }


if __name__ == "__main__":
    print(asyncio.run(main(os.environ["CORTEX_DATABASE_URL"])))
