"""An OpenAI Agents SDK agent whose history lives in cortex: a scripted model, no API call.

Run it with ``CORTEX_DATABASE_URL=postgresql://app@db/app python -m
examples.openai_agents_agent`` (after ``cortex db upgrade``).
tests/integration/test_framework_examples.py runs it against the test database.
"""

from __future__ import annotations

import asyncio
import os

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message

import cortex
from cortex.integrations.openai_agents import CortexSession


async def main(url: str, tenant: str = "acme") -> dict[str, object]:
    """Two turns of one conversation in ``tenant``; the second sees the first."""
    set_tracing_disabled(True)  # the example sends nothing anywhere
    model = ScriptedModel(
        [[assistant_message("San Francisco.")], [assistant_message("California.")]]
    )
    agent = Agent(name="guide", instructions="Answer briefly.", model=model)
    async with cortex.connect(url) as store:
        # One line to switch: SQLAlchemySession("user-123", ...) becomes this.
        session = CortexSession("user-123", store, scope=tenant)
        first = await Runner.run(agent, "Where is the Golden Gate Bridge?", session=session)
        second = await Runner.run(agent, "Which state is that in?", session=session)
        seen = model.calls[-1].input
        with cortex.use_scope(tenant):
            stored = await store.get_session_by_key("openai-agents", "user-123")
        return {
            "answers": [first.final_output, second.final_output],
            "second_turn_saw_first": "Golden Gate" in str(seen),
            "items": len(await session.get_items()),
            "message_count": stored.message_count,
        }


if __name__ == "__main__":
    print(asyncio.run(main(os.environ["CORTEX_DATABASE_URL"])))
