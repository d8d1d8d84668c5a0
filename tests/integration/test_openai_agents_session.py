"""cortex's own tests of every behaviour the Agents SDK's session tests check, on CortexSession.

Written for cortex, on real PostgreSQL as the application role; none of the
SDK's code is copied. Each test names the tests of openai/openai-agents-python
(tag v0.22.0) ``tests/extensions/memory/test_sqlalchemy_session.py`` (SA) and
``tests/memory/test_session.py`` (MEM) whose behaviour it checks:

===============================================  ================================================
cortex test                                      Agents SDK test
===============================================  ================================================
test_add_get_pop_clear                           SA test_sqlalchemy_session_direct_ops,
                                                 MEM test_sqlite_session_memory_direct / pop_item
test_items_round_trip_identically                SA test_sqlalchemy_session_can_store_non_ascii_*,
                                                 SA test_sqlalchemy_session_defaults_to_escaped_*
test_runner_sees_the_history                     SA test_runner_integration, MEM *_with_runner
test_sessions_are_isolated                       SA test_session_isolation, MEM *_isolation
test_ids_are_case_sensitive_and_not_padded       SA test_session_ids_are_case_sensitive,
                                                 SA test_mysql_session_id_rejects_trailing_space,
                                                 SA test_session_ids_keep_trailing_spaces_on_sqlite
test_limits                                      SA test_get_items_with_limit,
                                                 SA test_get_items_limit_returns_fewer_when_*
test_pop_from_empty                              SA test_pop_from_empty_session
test_concurrent_pops_take_each_item_once         SA test_concurrent_pop_item_returns_each_row_once
test_add_nothing                                 SA test_add_empty_items_list
test_concurrent_first_writes                     SA test_add_items_concurrent_first_access_*,
                                                 SA test_add_items_concurrent_first_write_*
test_first_writes_from_two_event_loops           SA *_cross_loop (two tests)
test_insertion_order_wins_ties                   SA test_get_items_same_timestamp_consistent_order,
                                                 SA test_pop_item_same_timestamp_returns_latest,
                                                 SA test_get_items_orders_by_id_for_ties
test_session_settings                            SA test_session_settings_default / _from_url /
                                                 test_get_items_uses_session_settings_limit /
                                                 test_get_items_explicit_limit_overrides_*
test_run_config_overrides_the_limit              SA test_runner_with_session_settings_override
test_cancelled_writes_are_whole_or_absent        SA test_mutation_cancellation_waits_for_*
test_built_from_a_url_and_from_a_store           SA test_engine_property_from_url /
                                                 _from_external_engine
===============================================  ================================================

SA tests of SQLite/MySQL specifics (PRAGMAs, BEGIN IMMEDIATE, corrupt rows,
table creation locks) have no counterpart: cortex's schema comes from its
migrations, and payloads are checked JSON before they are stored.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, TResponseInputItem, set_tracing_disabled
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message

import cortex
from cortex import use_scope
from cortex.integrations.openai_agents import CortexSession
from tests.conftest import Database

set_tracing_disabled(True)


def item(role: str, content: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": role, "content": content})


def contents(items: list[TResponseInputItem]) -> list[Any]:
    return [cast(dict[str, Any], i).get("content") for i in items]


@pytest.fixture
async def session(store: cortex.Store, tenant: str) -> AsyncIterator[CortexSession]:
    s = CortexSession("conversation", store, scope=tenant)
    yield s
    await s.close()


async def test_add_get_pop_clear(session: CortexSession) -> None:
    assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
    await session.add_items([item("user", "Hello"), item("assistant", "Hi there!")])
    assert contents(await session.get_items()) == ["Hello", "Hi there!"]
    popped = await session.pop_item()
    assert popped == item("assistant", "Hi there!")
    assert contents(await session.get_items()) == ["Hello"]
    await session.clear_session()
    assert await session.get_items() == []
    await session.add_items([item("user", "again")])
    assert contents(await session.get_items()) == ["again"]


async def test_items_round_trip_identically(session: CortexSession) -> None:
    items: list[TResponseInputItem] = [
        item("user", "café 你好 \u2028"),
        cast(
            TResponseInputItem,
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "x", "annotations": [], "logprobs": []}
                ],
            },
        ),
        cast(
            TResponseInputItem,
            {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "…"}]},
        ),
        cast(
            TResponseInputItem,
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"n": 1e16}'},
        ),
        cast(TResponseInputItem, {"type": "function_call_output", "call_id": "c1", "output": "2"}),
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    with use_scope(str(session._backing.base())):
        stored = await session.store.get_session_by_key("openai-agents", "conversation")
    assert stored.last_message == "2"


async def test_runner_sees_the_history(session: CortexSession) -> None:
    model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("California")]])
    agent = Agent(name="test", model=model)
    first = await Runner.run(agent, "What city is the Golden Gate Bridge in?", session=session)
    assert first.final_output == "San Francisco"
    second = await Runner.run(agent, "What state is it in?", session=session)
    assert second.final_output == "California"
    last_input = model.calls[-1].input
    assert isinstance(last_input, list)
    assert len(last_input) > 1
    assert any("Golden Gate Bridge" in str(i.get("content", "")) for i in last_input)
    assert len(await session.get_items()) == 4


async def test_sessions_are_isolated(store: cortex.Store, tenant: str) -> None:
    one = CortexSession("session_1", store, scope=tenant)
    two = CortexSession("session_2", store, scope=tenant)
    model = ScriptedModel(
        [
            [assistant_message("I like cats.")],
            [assistant_message("I like dogs.")],
            [assistant_message("You said you like cats.")],
        ]
    )
    agent = Agent(name="test", model=model)
    await Runner.run(agent, "I like cats.", session=one)
    await Runner.run(agent, "I like dogs.", session=two)
    await Runner.run(agent, "What animal did I say I like?", session=one)
    history = str(model.calls[-1].input)
    assert "cats" in history
    assert "dogs" not in history


async def test_ids_are_case_sensitive_and_not_padded(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    upper = CortexSession("Foo", store, scope=tenant)
    lower = CortexSession("foo", store, scope=tenant)
    await upper.add_items([item("user", "upper")])
    await lower.add_items([item("user", "lower")])
    assert await upper.get_items() == [item("user", "upper")]
    assert await lower.get_items() == [item("user", "lower")]
    for padded in ("Foo ", " Foo", "", "Foo\n"):
        with pytest.raises(cortex.InvalidInput, match="whitespace"):
            CortexSession(padded, store, scope=tenant)
    spaced = CortexSession("mid dle", store, scope=tenant)
    await spaced.add_items([item("user", "spaces inside are fine")])
    assert len(await spaced.get_items()) == 1
    elsewhere = CortexSession("Foo", store, scope=other_tenant)
    assert await elsewhere.get_items() == []


async def test_limits(session: CortexSession) -> None:
    await session.add_items([item("user", str(i)) for i in range(1, 5)])
    assert contents(await session.get_items(limit=2)) == ["3", "4"]
    assert len(await session.get_items()) == 4
    assert len(await session.get_items(limit=10)) == 4
    assert await session.get_items(limit=0) == []


async def test_long_histories_page(session: CortexSession) -> None:
    await session.add_items([item("user", str(i)) for i in range(2_500)])  # three chunks
    everything = await session.get_items()
    assert contents(everything) == [str(i) for i in range(2_500)]
    assert contents(await session.get_items(limit=1_200)) == [str(i) for i in range(1_300, 2_500)]


async def test_pop_from_empty(session: CortexSession) -> None:
    assert await session.pop_item() is None
    await session.clear_session()  # never written: nothing to clear, nothing created
    with use_scope(str(session._backing.base())):
        assert await session.store.count_sessions() == 0


async def test_concurrent_pops_take_each_item_once(store: cortex.Store, tenant: str) -> None:
    writer = CortexSession("pops", store, scope=tenant)
    other = CortexSession("pops", store, scope=tenant)
    await writer.add_items([item("user", "first"), item("assistant", "second")])
    popped = await asyncio.gather(writer.pop_item(), other.pop_item(), writer.pop_item())
    assert sorted(str(contents([p])[0]) for p in popped if p is not None) == ["first", "second"]
    assert popped.count(None) == 1


async def test_add_nothing(session: CortexSession) -> None:
    await session.add_items([])
    assert await session.get_items() == []


async def test_concurrent_first_writes(store: cortex.Store, tenant: str) -> None:
    shared = CortexSession("first", store, scope=tenant)
    submitted = [f"msg-{i}" for i in range(25)]
    results = await asyncio.gather(
        *(shared.add_items([item("user", c)]) for c in submitted), return_exceptions=True
    )
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert sorted(contents(await shared.get_items())) == sorted(submitted)
    # Separate session objects, as separate workers would hold.
    many = [CortexSession("second", store, scope=tenant) for _ in range(10)]
    await asyncio.gather(*(s.add_items([item("user", str(i))]) for i, s in enumerate(many)))
    assert len(await many[0].get_items()) == 10
    with use_scope(tenant):
        assert await store.count_sessions() == 2


def test_first_writes_from_two_event_loops(database: Database, tenant: str) -> None:
    barrier = threading.Barrier(2)
    results: list[tuple[str, list[Any]]] = []

    def worker(key: str, text: str) -> None:
        async def run() -> list[Any]:
            session = CortexSession(key, database.app_url, scope=tenant, pool_size=1)
            try:
                barrier.wait()
                await asyncio.wait_for(session.add_items([item("user", text)]), timeout=30)
                return contents(await session.get_items())
            finally:
                await session.close()

        results.append((text, asyncio.run(run())))

    threads = [
        threading.Thread(target=worker, args=("shared", "one")),
        threading.Thread(target=worker, args=("shared", "two")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    assert all(text in seen for text, seen in results)  # each read its own item back
    assert max(len(seen) for _, seen in results) == 2  # the later writer read the other's too

    async def read() -> list[Any]:
        session = CortexSession("shared", database.app_url, scope=tenant)
        try:
            return contents(await session.get_items())
        finally:
            await session.close()

    assert sorted(asyncio.run(read())) == ["one", "two"]


async def test_insertion_order_wins_ties(session: CortexSession) -> None:
    await session.add_items([item("user", "older")])
    await session.add_items([item("assistant", "rs"), item("assistant", "msg")])  # one instant
    assert contents(await session.get_items()) == ["older", "rs", "msg"]
    assert contents(await session.get_items(limit=2)) == ["rs", "msg"]
    popped = await session.pop_item()
    assert contents([popped] if popped else []) == ["msg"]
    assert contents(await session.get_items()) == ["older", "rs"]


async def test_session_settings(store: cortex.Store, tenant: str) -> None:
    plain = CortexSession("s", store, scope=tenant)
    assert isinstance(plain.session_settings, SessionSettings)
    assert plain.session_settings.limit is None
    for given in ({"limit": 3}, SessionSettings(limit=3)):
        configured = CortexSession("s", store, scope=tenant, session_settings=given)
        assert configured.session_settings is not None
        assert configured.session_settings.limit == 3
    await plain.add_items([item("user", f"Message {i}") for i in range(10)])
    limited = CortexSession("s", store, scope=tenant, session_settings=SessionSettings(limit=3))
    assert contents(await limited.get_items()) == ["Message 7", "Message 8", "Message 9"]
    assert contents(await limited.get_items(limit=2)) == ["Message 8", "Message 9"]


async def test_run_config_overrides_the_limit(store: cortex.Store, tenant: str) -> None:
    session = CortexSession(
        "override", store, scope=tenant, session_settings=SessionSettings(limit=100)
    )
    await session.add_items([item("user", f"Turn {i}") for i in range(10)])
    model = ScriptedModel([[assistant_message("Got it")]])
    await Runner.run(
        Agent(name="test", model=model),
        "New question",
        session=session,
        run_config=RunConfig(session_settings=SessionSettings(limit=2)),
    )
    last_input = model.calls[-1].input
    assert isinstance(last_input, list)
    history = [i for i in last_input if i.get("content") != "New question"]
    assert len(history) == 2


async def test_cancelled_writes_are_whole_or_absent(session: CortexSession) -> None:
    await session.add_items([item("user", "start")])
    batch = [item("user", "x" * 10_000) for _ in range(200)]
    for _ in range(5):
        task = asyncio.create_task(session.add_items(batch))
        await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(await session.get_items()) % 200 == 1  # each batch whole, or not at all
    for _ in range(3):
        pop = asyncio.create_task(session.pop_item())
        await asyncio.sleep(0)
        pop.cancel()
        await asyncio.gather(pop, return_exceptions=True)
    with use_scope(str(session._backing.base())):
        stored = await session.store.get_session_by_key("openai-agents", "conversation")
        assert stored.message_count == len(await session.get_items())


async def test_built_from_a_url_and_from_a_store(
    database: Database, store: cortex.Store, tenant: str
) -> None:
    owned = CortexSession("url", database.app_url, pool_size=1)
    with use_scope(tenant):  # no construction scope: the caller's scope is the base
        await owned.add_items([item("user", "from a url")])
    await owned.close()
    borrowed = CortexSession("url", store)
    assert borrowed.store is store
    with use_scope(tenant):
        assert contents(await borrowed.get_items()) == ["from a url"]
    await borrowed.close()  # a borrowed store stays open
    with use_scope(tenant):
        assert await store.count_sessions() == 1
    with pytest.raises(cortex.ScopeMissing):
        await borrowed.get_items()


async def test_a_session_recreated_elsewhere_is_found(store: cortex.Store, tenant: str) -> None:
    one = CortexSession("again", store, scope=tenant)
    await one.add_items([item("user", "first life")])
    assert len(await one.get_items()) == 1
    with use_scope(tenant):
        stored = await store.get_session_by_key("openai-agents", "again")
        await store.delete_session(stored.id)
    other = CortexSession("again", store, scope=tenant)
    await other.add_items([item("user", "second life")])
    assert contents(await one.get_items()) == ["second life"]  # one's cached id was stale


async def _recreate(store: cortex.Store, tenant: str, key: str, *texts: str) -> None:
    """What another worker does: delete the session under ``key`` and write it anew."""
    with use_scope(tenant):
        stored = await store.get_session_by_key("openai-agents", key)
        await store.delete_session(stored.id)
    await CortexSession(key, store, scope=tenant).add_items([item("user", t) for t in texts])


async def test_every_operation_follows_a_session_recreated_elsewhere(
    store: cortex.Store, tenant: str
) -> None:
    one = CortexSession("again", store, scope=tenant)
    await one.add_items([item("user", "first life")])
    await _recreate(store, tenant, "again", "a", "b", "c")
    assert await one.pop_item() == item("user", "c")  # one's cached id was stale
    await _recreate(store, tenant, "again", "d", "e")
    await one.clear_session()
    fresh = CortexSession("again", store, scope=tenant)
    assert await fresh.get_items() == []
    await _recreate(store, tenant, "again", "f")
    await one.add_items([item("user", "g")])
    assert contents(await fresh.get_items()) == ["f", "g"]
    with use_scope(tenant):
        assert await store.count_sessions() == 1


async def test_reading_follows_a_session_recreated_between_pages(
    store: cortex.Store, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = CortexSession("paged", store, scope=tenant)
    await one.add_items([item("user", str(i)) for i in range(1_200)])  # two pages
    read_page = store.recent_messages
    pages = 0

    async def page_then_recreate(*args: Any, **kwargs: Any) -> list[cortex.Message]:
        nonlocal pages
        pages += 1
        if pages == 2:  # between the first page and the second
            await _recreate(store, tenant, "paged", "new life")
        return await read_page(*args, **kwargs)

    monkeypatch.setattr(store, "recent_messages", page_then_recreate)
    assert contents(await one.get_items()) == ["new life"]


async def test_one_object_keeps_each_scope_to_its_own_session(
    store: cortex.Store, tenant: str
) -> None:
    roaming = CortexSession("conversation", store)  # no construction scope
    with use_scope(f"{tenant}/user-1"):
        await roaming.add_items([item("user", "user-1's")])
        assert contents(await roaming.get_items()) == ["user-1's"]
    with use_scope(tenant):
        assert await roaming.get_items() == []
        assert await roaming.pop_item() is None
        await roaming.clear_session()
        await roaming.add_items([item("user", "the tenant's")])
        assert contents(await roaming.get_items()) == ["the tenant's"]
        assert contents(await CortexSession("conversation", store).get_items()) == ["the tenant's"]
    with use_scope(f"{tenant}/user-1"):
        assert contents(await roaming.get_items()) == ["user-1's"]
        assert await roaming.pop_item() == item("user", "user-1's")
    with use_scope(tenant):
        assert contents(await roaming.get_items()) == ["the tenant's"]


async def test_inputs_of_the_wrong_type_are_refused(
    session: CortexSession, store: cortex.Store
) -> None:
    await session.add_items([item("user", "kept")])
    bad_items: list[Any] = [["hello"], [None], [5], [item("user", "ok"), 3.5], "abc", None, {}]
    for bad in bad_items:
        with pytest.raises(cortex.InvalidInput, match="items"):
            await session.add_items(bad)
    for limit in ("3", True, 2.5):
        with pytest.raises(cortex.InvalidInput, match="limit"):
            await session.get_items(limit=cast(Any, limit))
    with pytest.raises(cortex.InvalidInput, match="session_id"):
        CortexSession(cast(Any, 5), store)
    for settings in ({"limit": "x"}, {"unknown": 1}, 5):
        with pytest.raises(cortex.InvalidInput, match="session_settings"):
            CortexSession("s", store, session_settings=cast(Any, settings))
    assert contents(await session.get_items()) == ["kept"]


async def test_messages_written_without_an_item_read_as_items(
    session: CortexSession, store: cortex.Store
) -> None:
    await session.add_items([item("user", "hello")])
    with use_scope(str(session._backing.base())):
        stored = await store.get_session_by_key("openai-agents", "conversation")
        await store.append_message(stored.id, cortex.NewMessage("assistant", "operator note"))
        await store.append_message(stored.id, cortex.NewMessage("user", "a list", payload=[1]))
    assert await session.get_items() == [
        item("user", "hello"),
        item("assistant", "operator note"),
        item("user", "a list"),
    ]


def test_the_cli_names_the_tools_called_and_answered(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cortex.cli import main

    long = "x" * 500

    async def seed() -> str:
        session = CortexSession("conversation", database.app_url, scope=tenant)
        try:
            await session.add_items(
                [
                    item("user", "Weather in Paris?"),
                    cast(
                        TResponseInputItem,
                        {
                            "type": "function_call",
                            "call_id": "call_1",
                            "name": "get_weather",
                            "arguments": '{"city": "Paris\x1b[2J"}',
                        },
                    ),
                    cast(
                        TResponseInputItem,
                        {"type": "function_call_output", "call_id": "call_1", "output": long},
                    ),
                ]
            )
        finally:
            await session.close()
        async with cortex.connect(database.app_url) as store:
            with use_scope(tenant):
                return (await store.get_session_by_key("openai-agents", "conversation")).id

    sid = asyncio.run(seed())
    argv = ["--database-url", database.owner_url, "sessions", "messages", sid, "--scope", tenant]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert '[calls get_weather: {"city": "Paris\\x1b[2J"}]' in out  # named, escaped
    assert "[answers get_weather]" in out  # the output is the content already, not repeated
    assert "…" not in out
