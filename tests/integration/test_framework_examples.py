"""The example agents of examples/ run against the test database (as the application role)."""

from __future__ import annotations

import pytest

from tests.conftest import Database


async def test_adk_example(database: Database, tenant: str) -> None:
    pytest.importorskip("google.adk")
    from examples.adk_agent import main

    seen = await main(database.app_url, tenant)
    assert seen["replies"] == [["Welcome! Visit 1."], ["Welcome! Visit 2."], ["Welcome! Visit 1."]]
    assert seen["paused"] == ["chat-2"]
    assert seen["pending"] == ["approve_refund"]
    assert seen["ada"] == {"visits": 2}


async def test_openai_agents_example(database: Database, tenant: str) -> None:
    pytest.importorskip("agents")
    from examples.openai_agents_agent import main

    seen = await main(database.app_url, tenant)
    assert seen == {
        "answers": ["San Francisco.", "California."],
        "second_turn_saw_first": True,
        "items": 4,
        "message_count": 4,
    }
