"""cortex's own tests of every behaviour ADK's session-service tests check, on CortexSessionService.

Written for cortex, on real PostgreSQL as the application role; none of
ADK's code is copied. Each test names the test of google/adk-python
``tests/unittests/sessions/test_session_service.py`` (commit 11cc0931,
google-adk 2.13.0) whose behaviour it checks:

=====================================================  ==========================================
cortex test                                            ADK test
=====================================================  ==========================================
test_missing_session_is_none                           test_get_empty_session
test_create_get_delete                                 test_create_get_session,
                                                       test_database_session_service_with_db_url
test_create_and_list_with_state                        test_create_and_list_sessions
test_list_orders_least_recently_active_first           test_list_sessions_ordered_by_last_update_time
test_list_one_user_or_all                              test_list_sessions_all_users,
                                                       test_list_sessions_sync_unknown_app_or_user_*
test_app_state_shared_by_the_app                       test_app_state_is_shared_by_all_users_of_app,
                                                       test_app_state_dict_valued_delta_replaces_*
test_user_state_shared_by_the_user_only                test_user_state_is_shared_only_by_user_sessions,
                                                       test_user_state_none_valued_delta_is_stored_*
test_session_state_not_shared                          test_session_state_is_not_shared
test_delta_values_replace_and_null_is_kept             test_dict_valued_state_delta_replaces_*,
                                                       test_none_valued_state_delta_is_stored_*,
                                                       test_boolean_state_survives_unrelated_*
test_temp_state_lives_in_memory_only                   test_temp_state_is_not_persisted_in_state_*,
                                                       test_temp_state_visible_across_sequential_*
test_same_id_for_two_users                             test_get_session_respects_user_id,
                                                       test_delete_session_sync_removes_only_the_*
test_existing_and_padded_ids_are_refused               test_create_session_with_existing_id_*,
                                                       test_create_session_with_padded_duplicate_*
test_padded_id_reads_and_deletes                       test_padded_session_id_reads_and_deletes,
                                                       test_create_session_with_blank_id_generates_one
test_events_round_trip_exactly                         test_append_event_bytes,
                                                       test_append_event_complete,
                                                       test_append_event_with_requested_tool_*
test_unserialisable_state_is_stored_as_text            test_append_event_with_non_serializable_*
test_last_update_time_follows_the_event                test_session_last_update_time_updates_on_event
test_append_to_deleted_session                         test_append_event_to_deleted_session_raises_*
test_stale_session_is_refused                          test_append_event_to_stale_session,
                                                       test_sqlite_append_event_uses_typed_stale_*
test_concurrent_stale_writers                          test_append_event_concurrent_stale_sessions_*
test_markerless_session_appends                        test_append_event_allows_markerless_current_*,
                                                       test_append_event_allows_timestamp_drift_*
test_recent_and_after_timestamp                        test_get_session_with_config
test_partial_events_are_not_stored                     test_partial_events_are_not_persisted
test_user_state_reads                                  test_get_user_state_* (six tests)
test_exact_epochs_in_a_repeated_local_hour             test_get_session_keeps_exact_epoch_across_*
test_tied_timestamps_order_by_event_id                 test_get_session_orders_tied_timestamps_by_id
test_concurrent_creates_of_one_id                      test_concurrent_prepare_tables_no_race_*,
                                                       test_get_or_create_state_handles_race_*
test_built_from_a_url_and_from_a_store                 test_database_session_service_with_db_url,
                                                       test_database_session_service_caller_owned_*
=====================================================  ==========================================

Beyond ADK's tests: tenants are walled apart, a long-running call is a
pending input on cortex's operator surface, and the runner's rewind
(``Runner.rewind_async``, an appended event) is stored like any event.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, cast

import pytest

pytest.importorskip("google.adk")

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

import cortex
from cortex import FunctionResponse, ListFilter, NewMessage, SessionState, use_scope
from cortex.integrations.adk import CortexSessionService
from tests.conftest import Database

APP = "my_app"


@pytest.fixture
async def service(store: cortex.Store, tenant: str) -> AsyncIterator[CortexSessionService]:
    async with CortexSessionService(store, scope=tenant) as svc:
        yield svc


def delta(**state: object) -> EventActions:
    return EventActions(state_delta=dict(state))


async def test_missing_session_is_none(service: CortexSessionService) -> None:
    assert await service.get_session(app_name=APP, user_id="u", session_id="123") is None


async def test_create_get_delete(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", state={"key": "value"})
    assert (session.app_name, session.user_id, session.state) == (APP, "u", {"key": "value"})
    assert session.id
    assert session.last_update_time <= time.time()
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got == session
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
    assert await service.get_session(app_name=APP, user_id="u", session_id=session.id) is None
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)  # no-op


async def test_create_and_list_with_state(service: CortexSessionService) -> None:
    ids = [f"session{i}" for i in range(5)]
    for sid in ids:
        await service.create_session(
            app_name=APP, user_id="u", session_id=sid, state={"key": "value" + sid}
        )
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert {s.id for s in listed} == set(ids)
    for s in listed:
        assert s.state == {"key": "value" + s.id}
        assert s.events == []


async def test_list_orders_least_recently_active_first(service: CortexSessionService) -> None:
    for sid in ("a", "b", "c"):
        await service.create_session(app_name=APP, user_id="u", session_id=sid)
    session_a = await service.get_session(app_name=APP, user_id="u", session_id="a")
    assert session_a is not None
    await service.append_event(session_a, Event(invocation_id="i", author="user"))
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert [s.id for s in listed] == ["b", "c", "a"]


async def test_list_more_sessions_than_a_page(service: CortexSessionService) -> None:
    # A listing is one page (one statement) when it fits; 1,000 or more walk
    # every page from one snapshot: none lost at the page boundary.
    ids = [f"s{i:04d}" for i in range(1001)]
    for sid in ids:
        await service.create_session(app_name=APP, user_id="many", session_id=sid)
    listed = (await service.list_sessions(app_name=APP, user_id="many")).sessions
    assert [s.id for s in listed] == ids


async def test_list_one_user_or_all(service: CortexSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="1a", state={"k": "1a"})
    await service.create_session(app_name=APP, user_id="u1", session_id="1b", state={"k": "1b"})
    await service.create_session(app_name=APP, user_id="u2", session_id="2a", state={"k": "2a"})
    one = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert {s.id: s.state for s in one} == {"1a": {"k": "1a"}, "1b": {"k": "1b"}}
    everyone = (await service.list_sessions(app_name=APP)).sessions
    assert {(s.user_id, s.id) for s in everyone} == {("u1", "1a"), ("u1", "1b"), ("u2", "2a")}
    assert (await service.list_sessions(app_name="unknown")).sessions == []
    assert (await service.list_sessions(app_name=APP, user_id="nobody")).sessions == []


async def test_app_state_shared_by_the_app(service: CortexSessionService) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1", "app:cfg": {"a": 1}}
    )
    await service.append_event(
        s1, Event(invocation_id="i", author="user", actions=delta(**{"app:k2": "v2"}))
    )
    await service.append_event(
        s1, Event(invocation_id="i", author="user", actions=delta(**{"app:cfg": {"b": 2}}))
    )
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert s2.state == {"app:k1": "v1", "app:k2": "v2", "app:cfg": {"b": 2}}
    again = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert again is not None
    assert again.state == s2.state
    assert s1.state["app:cfg"] == {"b": 2}
    other = await service.create_session(app_name="other", user_id="u1")
    assert other.state == {}


async def test_user_state_shared_by_the_user_only(service: CortexSessionService) -> None:
    s1 = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"user:k1": "v1", "user:pref": "x"}
    )
    await service.append_event(
        s1,
        Event(
            invocation_id="i", author="user", actions=delta(**{"user:k2": "v2", "user:pref": None})
        ),
    )
    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {"user:k1": "v1", "user:k2": "v2", "user:pref": None}
    assert "user:pref" in s1.state
    assert s1.state["user:pref"] is None
    s2 = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert s2.state == {}


async def test_session_state_not_shared(service: CortexSessionService) -> None:
    s1 = await service.create_session(app_name=APP, user_id="u1", session_id="s1", state={"sk1": 1})
    await service.append_event(s1, Event(invocation_id="i", author="user", actions=delta(sk2=2)))
    got = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
    assert got is not None
    assert got.state == {"sk1": 1, "sk2": 2}
    s1b = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert s1b.state == {}


async def test_delta_values_replace_and_null_is_kept(service: CortexSessionService) -> None:
    session = await service.create_session(
        app_name=APP,
        user_id="u",
        session_id="s",
        state={"profile": {"name": "ada", "role": "admin"}, "flag": True, "off": False},
    )
    await service.append_event(
        session,
        Event(
            invocation_id="i",
            author="user",
            actions=delta(profile={"name": "bob"}, flag=None, new_flag=True),
        ),
    )
    reloaded = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert reloaded is not None
    expected = {"profile": {"name": "bob"}, "flag": None, "off": False, "new_flag": True}
    assert reloaded.state == expected
    assert session.state == expected
    assert reloaded.state["off"] is False


async def test_temp_state_lives_in_memory_only(service: CortexSessionService) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u", session_id="s", state={"temp:early": 1}
    )
    assert "temp:early" not in session.state
    event = Event(invocation_id="i", author="a1", actions=delta(**{"temp:k": "v1", "sk": "v2"}))
    await service.append_event(session, event)
    assert session.state["temp:k"] == "v1"  # visible to the next agent of this invocation
    assert session.state["sk"] == "v2"
    assert "temp:k" not in event.actions.state_delta
    reloaded = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert reloaded is not None
    assert reloaded.state == {"sk": "v2"}
    assert "temp:k" not in reloaded.events[0].actions.state_delta


async def test_same_id_for_two_users(service: CortexSessionService) -> None:
    s1 = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(s1, Event(invocation_id="i", author="user"))
    await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    got = await service.get_session(app_name=APP, user_id="u2", session_id="s1")
    assert got is not None
    assert (got.user_id, len(got.events)) == ("u2", 0)
    await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
    assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is None
    assert await service.get_session(app_name=APP, user_id="u2", session_id="s1") is not None


async def test_existing_and_padded_ids_are_refused(service: CortexSessionService) -> None:
    await service.create_session(
        app_name=APP, user_id="u", session_id="existing", state={"keep": "original"}
    )
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id="u", session_id="existing")
    with pytest.raises(AlreadyExistsError) as caught:
        await service.create_session(
            app_name=APP, user_id="u", session_id="  existing  ", state={"keep": "clobbered"}
        )
    assert isinstance(caught.value, cortex.Conflict)
    kept = await service.get_session(app_name=APP, user_id="u", session_id="existing")
    assert kept is not None
    assert kept.state == {"keep": "original"}


async def test_padded_id_reads_and_deletes(service: CortexSessionService) -> None:
    created = await service.create_session(
        app_name=APP, user_id="u", session_id="order-42\n", state={"cart": "book"}
    )
    assert created.id == "order-42"
    got = await service.get_session(app_name=APP, user_id="u", session_id="order-42\n")
    assert got is not None
    assert (got.id, got.state) == ("order-42", {"cart": "book"})
    await service.delete_session(app_name=APP, user_id="u", session_id=" order-42 ")
    assert await service.get_session(app_name=APP, user_id="u", session_id="order-42") is None
    blank = await service.create_session(app_name=APP, user_id="u", session_id="   ")
    assert blank.id.strip()


async def test_events_round_trip_exactly(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    image = types.Content(
        role="user", parts=[types.Part.from_bytes(data=b"\x89PNG\x00", mime_type="image/png")]
    )
    grounding = types.GroundingMetadata(
        search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob"), web_search_queries=["q"]
    )
    await service.append_event(
        session,
        Event(invocation_id="i", author="user", content=image, grounding_metadata=grounding),
    )
    complete = Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text="test_text")]),
        turn_complete=True,
        partial=False,
        actions=EventActions(
            artifact_delta={"file": 0},
            transfer_to_agent="agent",
            escalate=True,
            requested_tool_confirmations={
                "call_1": ToolConfirmation(hint="h", confirmed=False, payload={"x": [1, 2.5]})
            },
        ),
        long_running_tool_ids={"tool1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value", "f": 1e16},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=True),
    )
    await service.append_event(session, complete)
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got is not None
    # Events come back in timestamp order (as from ADK's database service);
    # `complete` carries an older timestamp than the image event.
    assert got.events == sorted(session.events, key=lambda e: (e.timestamp, e.id))
    assert got.model_copy(update={"events": []}) == session.model_copy(update={"events": []})
    by_id = {e.id: e for e in got.events}
    assert by_id[complete.id] == complete
    assert by_id[session.events[0].id].content == image
    assert by_id[session.events[0].id].grounding_metadata == grounding


async def test_unserialisable_state_is_stored_as_text(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(
        session, Event(invocation_id="i", author="user", actions=delta(callback=lambda: 1, ok=2))
    )
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got is not None
    assert len(got.events) == 1
    assert got.state["ok"] == 2
    assert isinstance(got.state["callback"], str)


async def test_last_update_time_follows_the_event(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    original = session.last_update_time
    stamp = original + 10
    await service.append_event(session, Event(invocation_id="i", author="user", timestamp=stamp))
    assert session.last_update_time == pytest.approx(stamp, abs=1e-6)
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got is not None
    assert got.last_update_time == pytest.approx(stamp, abs=1e-6)
    assert got.last_update_time > original


async def test_append_to_deleted_session(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, Event(invocation_id="i", author="user"))
    fresh = CortexSessionService(service.store, scope=str(service.app_scope(APP).segments[0]))
    with pytest.raises(SessionNotFoundError) as caught:  # no cached id: the key lookup misses
        await fresh.append_event(session, Event(invocation_id="i", author="user"))
    assert isinstance(caught.value, cortex.NotFound)


async def test_stale_session_is_refused(service: CortexSessionService) -> None:
    now = time.time()
    original = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(
        original,
        Event(invocation_id="inv1", author="user", timestamp=now + 1, actions=delta(sk1=1)),
    )
    updated = await service.get_session(app_name=APP, user_id="u", session_id=original.id)
    assert updated is not None
    await service.append_event(
        updated, Event(invocation_id="inv2", author="user", timestamp=now + 2, actions=delta(sk2=2))
    )
    assert original.last_update_time < updated.last_update_time
    with pytest.raises(StaleSessionError, match="modified in storage") as caught:
        await service.append_event(
            original,
            Event(invocation_id="inv3", author="user", timestamp=now + 3, actions=delta(sk3=3)),
        )
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, cortex.Conflict)
    final = await service.get_session(app_name=APP, user_id="u", session_id=original.id)
    assert final is not None
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert (final.state.get("sk1"), final.state.get("sk2"), final.state.get("sk3")) == (1, 2, None)


async def test_concurrent_stale_writers(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(8):
        latest = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        assert latest is not None
        one, two = latest.model_copy(deep=True), latest.model_copy(deep=True)
        base = latest.last_update_time + 10
        results = await asyncio.gather(
            service.append_event(
                one,
                Event(
                    invocation_id=f"{i}-1",
                    author="user",
                    timestamp=base + 1,
                    actions=delta(**{f"k{i}-1": 1}),
                ),
            ),
            service.append_event(
                two,
                Event(
                    invocation_id=f"{i}-2",
                    author="user",
                    timestamp=base + 2,
                    actions=delta(**{f"k{i}-2": 2}),
                ),
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1
        assert isinstance(errors[0], StaleSessionError)
    final = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert final is not None
    assert len(final.events) == 8
    for i in range(8):
        assert (f"k{i}-1" in final.state) != (f"k{i}-2" in final.state)


async def test_markerless_session_appends(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    await service.append_event(
        session, Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
    )
    session.last_update_time -= 0.0001  # a float round trip does not make it stale
    await service.append_event(
        session, Event(invocation_id="inv2", author="user", timestamp=session.last_update_time + 20)
    )
    session._storage_update_marker = None  # a hand-built session object
    await service.append_event(
        session, Event(invocation_id="inv3", author="user", timestamp=session.last_update_time + 30)
    )
    got = await service.get_session(app_name=APP, user_id="u", session_id="s1")
    assert got is not None
    assert [e.invocation_id for e in got.events] == ["inv1", "inv2", "inv3"]


async def test_markerless_session_behind_storage_is_stale(
    service: CortexSessionService,
) -> None:
    # A hand-built session object (no marker) whose storage another writer
    # moved on: refused as ADK's own service refuses it, nothing written.
    session = await service.create_session(app_name=APP, user_id="u", session_id="s2")
    await service.append_event(
        session, Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 1)
    )
    other = await service.get_session(app_name=APP, user_id="u", session_id="s2")
    assert other is not None
    await service.append_event(
        other, Event(invocation_id="inv2", author="user", timestamp=other.last_update_time + 1)
    )
    session._storage_update_marker = None
    with pytest.raises(StaleSessionError):
        await service.append_event(
            session,
            Event(invocation_id="inv3", author="user", timestamp=session.last_update_time + 5),
        )
    got = await service.get_session(app_name=APP, user_id="u", session_id="s2")
    assert got is not None
    assert [e.invocation_id for e in got.events] == ["inv1", "inv2"]


async def test_recent_and_after_timestamp(service: CortexSessionService) -> None:
    base = int(time.time())
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=base + i))

    async def events(**config: float | int) -> list[float]:
        got = await service.get_session(
            app_name=APP,
            user_id="u",
            session_id=session.id,
            config=GetSessionConfig(**config) if config else None,
        )
        assert got is not None
        return [e.timestamp for e in got.events]

    assert await events() == [base + i for i in range(1, 6)]
    assert await events(num_recent_events=0) == []
    assert await events(num_recent_events=3) == [base + 3, base + 4, base + 5]
    assert await events(after_timestamp=base + 4) == [base + 4, base + 5]
    assert await events(after_timestamp=base + 50) == []
    assert await events(after_timestamp=base + 4, num_recent_events=3) == [base + 4, base + 5]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        GetSessionConfig(num_recent_events=-1)


async def test_partial_events_are_not_stored(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, Event(author="user", partial=True))
    assert session.events == []
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got is not None
    assert got.events == []


async def test_user_state_reads(service: CortexSessionService) -> None:
    assert await service.get_user_state(app_name=APP, user_id="u1") == {}
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(
        session,
        Event(author="system", actions=delta(**{"user:profile": {"name": "Alice"}, "sk": 1})),
    )
    assert await service.get_user_state(app_name=APP, user_id="u1") == {
        "profile": {"name": "Alice"}
    }
    await service.append_event(session, Event(author="system", actions=delta(**{"user:n": 1})))
    await service.append_event(session, Event(author="system", actions=delta(**{"user:n": 2})))
    assert (await service.get_user_state(app_name=APP, user_id="u1"))["n"] == 2
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other_app", user_id="u1") == {}


@pytest.fixture
def new_york() -> Iterator[None]:
    if not hasattr(time, "tzset"):
        yield
        return
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.mark.usefixtures("new_york")
async def test_exact_epochs_in_a_repeated_local_hour(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    epochs = [1730613600.0, 1730615400.0]  # 01:00 and 01:30 EST, the second pass
    for epoch in epochs:
        await service.append_event(session, Event(author="user", timestamp=epoch))
    got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
    assert got is not None
    assert [e.timestamp for e in got.events] == epochs


async def test_tied_timestamps_order_by_event_id(service: CortexSessionService) -> None:
    for order in (["event_a", "event_m", "event_z"], ["event_z", "event_m", "event_a"]):
        session = await service.create_session(app_name=APP, user_id="u")
        for event_id in order:
            await service.append_event(session, Event(author="user", id=event_id, timestamp=100.0))
        got = await service.get_session(app_name=APP, user_id="u", session_id=session.id)
        assert got is not None
        assert [e.id for e in got.events] == ["event_a", "event_m", "event_z"]


async def test_concurrent_creates_of_one_id(service: CortexSessionService) -> None:
    results = await asyncio.gather(
        *(service.create_session(app_name=APP, user_id="u", session_id="same") for _ in range(8)),
        *(
            service.create_session(app_name=f"app_{i}", user_id="u", session_id="x")
            for i in range(5)
        ),
        return_exceptions=True,
    )
    same, others = results[:8], results[8:]
    assert sum(not isinstance(r, BaseException) for r in same) == 1
    assert all(isinstance(r, AlreadyExistsError) for r in same if isinstance(r, BaseException))
    assert not [r for r in others if isinstance(r, BaseException)]


async def test_built_from_a_url_and_from_a_store(
    database: Database, store: cortex.Store, tenant: str
) -> None:
    async with CortexSessionService(database.app_url, pool_size=2) as from_url:
        with use_scope(tenant):  # no construction scope: the caller's scope is the base
            made = await from_url.create_session(app_name=APP, user_id="u", session_id="s")
            assert made.id == "s"
    borrowed = CortexSessionService(store)
    with use_scope(tenant):
        got = await borrowed.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    await borrowed.close()  # a borrowed store stays open
    with use_scope(tenant):
        assert await store.count_sessions() == 1
    with pytest.raises(cortex.ScopeMissing):
        await borrowed.get_session(app_name=APP, user_id="u", session_id="s")


async def test_tenants_are_walled_apart(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    ours = CortexSessionService(store, scope=tenant)
    theirs = CortexSessionService(store, scope=other_tenant)
    await ours.create_session(app_name=APP, user_id="u", session_id="s", state={"app:k": "ours"})
    assert await theirs.get_session(app_name=APP, user_id="u", session_id="s") is None
    assert (await theirs.list_sessions(app_name=APP)).sessions == []
    mine = await theirs.create_session(app_name=APP, user_id="u", session_id="s")
    assert mine.state == {}


async def test_long_running_call_is_a_pending_input(
    service: CortexSessionService, tenant: str
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    call = types.FunctionCall(id="adk-call-1", name="ask_approval", args={"amount": 5})
    await service.append_event(
        session,
        Event(
            author="agent",
            content=types.Content(role="model", parts=[types.Part(function_call=call)]),
            long_running_tool_ids={"adk-call-1"},
        ),
    )
    with use_scope(tenant):
        paused = await service.store.list_sessions(ListFilter(state=SessionState.PAUSED))
        assert [s.key for s in paused] == ["s"]
        detail = await service.store.inspect_session(paused[0].id)
        assert [(p.interrupt_id, p.message) for p in detail.pending] == [
            ("adk-call-1", "ask_approval")
        ]
    answer = types.FunctionResponse(id="adk-call-1", name="ask_approval", response={"ok": True})
    await service.append_event(
        session,
        Event(
            author="user",
            content=types.Content(role="user", parts=[types.Part(function_response=answer)]),
        ),
    )
    with use_scope(tenant):
        assert await service.store.list_sessions(ListFilter(state=SessionState.PAUSED)) == []


async def test_parallel_long_running_calls_are_each_pending(
    service: CortexSessionService, tenant: str
) -> None:
    """One event with two long-running calls (and a plain one) waits for two answers."""
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    calls = [
        types.FunctionCall(id="call-b", name="approve_refund"),
        types.FunctionCall(id="call-a", name="ask_manager"),
        types.FunctionCall(id="call-c", name="lookup"),  # not long-running: no question
    ]
    await service.append_event(
        session,
        Event(
            author="agent",
            content=types.Content(role="model", parts=[types.Part(function_call=c) for c in calls]),
            long_running_tool_ids={"call-a", "call-b"},
        ),
    )

    async def pending() -> list[tuple[str, str]]:
        with use_scope(tenant):
            (found,) = await service.store.list_sessions(ListFilter(agent_id="adk"))
            detail = await service.store.inspect_session(found.id)
            assert detail.session.pending_count == len(detail.pending)
            return [(p.interrupt_id, p.message) for p in detail.pending]

    assert await pending() == [("call-a", "ask_manager"), ("call-b", "approve_refund")]
    # The first answer leaves the session paused on the other call.
    one = types.FunctionResponse(id="call-b", name="approve_refund", response={"ok": True})
    await service.append_event(
        session,
        Event(
            author="user",
            content=types.Content(role="user", parts=[types.Part(function_response=one)]),
        ),
    )
    assert await pending() == [("call-a", "ask_manager")]
    with use_scope(tenant):
        paused = await service.store.list_sessions(ListFilter(state=SessionState.PAUSED))
        assert [s.key for s in paused] == ["s"]
    # Both answered in one event (and an answer to the plain call).
    answers = [
        types.FunctionResponse(id="call-a", name="ask_manager", response={"ok": 1}),
        types.FunctionResponse(id="call-c", name="lookup", response={"found": 2}),
    ]
    await service.append_event(
        session,
        Event(
            author="user",
            content=types.Content(
                role="user", parts=[types.Part(function_response=a) for a in answers]
            ),
        ),
    )
    assert await pending() == []
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert [len(e.get_function_calls()) for e in got.events] == [3, 0, 0]
    assert [len(e.get_function_responses()) for e in got.events] == [0, 1, 2]


async def test_an_operator_answer_reaches_the_agent(
    service: CortexSessionService, tenant: str
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    call = types.FunctionCall(id="adk-call-2", name="ask_approval")
    await service.append_event(
        session,
        Event(
            author="agent",
            content=types.Content(role="model", parts=[types.Part(function_call=call)]),
            long_running_tool_ids={"adk-call-2"},
        ),
    )
    with use_scope(tenant):
        (paused,) = await service.store.list_sessions(ListFilter(state=SessionState.PAUSED))
        await service.store.resume(paused.id, "adk-call-2", {"approved": True}, author="ops")
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    (answer,) = got.events[-1].get_function_responses()
    assert (answer.id, answer.name, answer.response) == ("adk-call-2", "", {"approved": True})
    assert got.events[-1].author == "ops"
    # The session object from before the answer is stale now.
    with pytest.raises(StaleSessionError):
        await service.append_event(session, Event(author="agent"))


async def test_answers_written_through_cortex_all_reach_the_agent(
    service: CortexSessionService, tenant: str
) -> None:
    """A message without an ADK payload that answers two calls is one event with both."""
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    calls = [types.FunctionCall(id=f"call-{n}", name="ask") for n in (1, 2)]
    await service.append_event(
        session,
        Event(
            author="agent",
            content=types.Content(role="model", parts=[types.Part(function_call=c) for c in calls]),
            long_running_tool_ids={"call-1", "call-2"},
        ),
    )
    with use_scope(tenant):
        (paused,) = await service.store.list_sessions(ListFilter(state=SessionState.PAUSED))
        answers = [FunctionResponse(id=f"call-{n}", response={"n": n}) for n in (1, 2)]
        await service.store.append_message(
            paused.id, NewMessage("user", author="ops", function_responses=answers)
        )
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    got_answers = got.events[-1].get_function_responses()
    assert [(a.id, a.response) for a in got_answers] == [("call-1", {"n": 1}), ("call-2", {"n": 2})]


def test_the_cli_shows_an_adk_session(
    database: Database, tenant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from cortex.cli import main

    async def seed() -> None:
        async with CortexSessionService(database.app_url, scope=tenant) as service:
            session = await service.create_session(
                app_name=APP, user_id="ada", session_id="order-42", state={"user:tier": "gold"}
            )
            call = types.FunctionCall(
                id="adk-call-9", name="approve_refund", args={"amount": 140, "note": "n" * 300}
            )
            await service.append_event(
                session,
                Event(
                    author="agent",
                    content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                    long_running_tool_ids={"adk-call-9"},
                ),
            )
            looked = types.FunctionCall(id="adk-call-8", name="lookup_order", args={"id": 42})
            found = types.FunctionResponse(
                id="adk-call-8", name="lookup_order", response={"total": 140}
            )
            for part in (types.Part(function_call=looked), types.Part(function_response=found)):
                role = "model" if part.function_call else "user"
                await service.append_event(
                    session,
                    Event(
                        author="agent" if part.function_call else "user",
                        content=types.Content(role=role, parts=[part]),
                    ),
                )

    asyncio.run(seed())
    url = ["--database-url", database.owner_url, "--scope", tenant]
    assert main(["sessions", "list", "--state", "paused", "--json", *url]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["sessions"]
    assert listed["key"] == "order-42"
    assert main(["sessions", "show", listed["id"], *url]) == 0
    shown = capsys.readouterr().out
    assert "key: order-42" in shown
    assert '"user:tier": "gold"' in shown
    assert "pending adk-call-9" in shown
    assert "approve_refund" in shown
    # The transcript names each tool called and answered, with a short preview.
    assert main(["sessions", "messages", listed["id"], *url]) == 0
    said = capsys.readouterr().out
    assert '[calls approve_refund: {"amount": 140, "note": "nnn' in said
    assert "n" * 300 not in said
    assert '[calls lookup_order: {"id": 42}]' in said
    assert '[answers lookup_order: {"total": 140}]' in said
    assert ": {}]" not in said
    # The adapter's own bookkeeping is no part of the session's state.
    assert "__cortex" not in shown
    assert main(["sessions", "export", listed["id"], *url]) == 0
    assert "__cortex" not in capsys.readouterr().out


async def test_the_adapters_bookkeeping_stays_out_of_the_stores_state(
    service: CortexSessionService, tenant: str
) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u", session_id="s", state={"step": 1}
    )
    event = Event(author="user", actions=EventActions(state_delta={"step": 2}), timestamp=1234.5)
    await service.append_event(session, event)
    store = service.store
    with use_scope(tenant):
        (listed,) = await store.list_sessions()
        got = await store.get_session(listed.id)
        history = await store.get_session_with_messages(listed.id)
        (walked,) = [s async for s in store.iter_sessions()]
    with use_scope(listed.scope):
        by_key = await store.get_session_by_key("adk", "s")
    for seen in (listed, got, history.session, by_key, walked):
        assert seen.data == {"step": 2}, seen.data
    # ADK still gets its last update time, the event's timestamp.
    again = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert again is not None
    assert again.last_update_time == 1234.5
    (adk_listed,) = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert adk_listed.last_update_time == 1234.5


async def test_a_session_recreated_elsewhere_is_found(store: cortex.Store, tenant: str) -> None:
    one = CortexSessionService(store, scope=tenant)
    other = CortexSessionService(store, scope=tenant)  # another process
    await one.create_session(app_name=APP, user_id="u", session_id="s", state={"v": 1})
    assert await one.get_session(app_name=APP, user_id="u", session_id="s") is not None
    await other.delete_session(app_name=APP, user_id="u", session_id="s")
    await other.create_session(app_name=APP, user_id="u", session_id="s", state={"v": 2})
    again = await one.get_session(app_name=APP, user_id="u", session_id="s")  # stale cache
    assert again is not None
    assert again.state == {"v": 2}
    await other.delete_session(app_name=APP, user_id="u", session_id="s")
    third = await other.create_session(app_name=APP, user_id="u", session_id="s")
    await one.append_event(third, Event(author="user"))  # one's cached id is stale again
    got = await other.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert len(got.events) == 1


async def test_delete_removes_the_session_the_id_names_now(
    store: cortex.Store, tenant: str
) -> None:
    one = CortexSessionService(store, scope=tenant)
    other = CortexSessionService(store, scope=tenant)  # another process
    await one.create_session(app_name=APP, user_id="u", session_id="s")
    await other.delete_session(app_name=APP, user_id="u", session_id="s")
    await other.create_session(app_name=APP, user_id="u", session_id="s", state={"v": 2})
    await one.delete_session(app_name=APP, user_id="u", session_id="s")  # one's id is stale
    assert await other.get_session(app_name=APP, user_id="u", session_id="s") is None
    with use_scope(tenant):
        assert await store.count_sessions() == 0


async def test_an_object_of_a_deleted_session_is_stale_for_its_successor(
    store: cortex.Store, tenant: str
) -> None:
    one = CortexSessionService(store, scope=tenant)
    other = CortexSessionService(store, scope=tenant)  # another process
    first = await one.create_session(app_name=APP, user_id="u", session_id="s")
    await one.append_event(first, Event(author="user", actions=delta(v=1)))
    markerless = first.model_copy(deep=True)
    markerless._storage_update_marker = None
    await other.delete_session(app_name=APP, user_id="u", session_id="s")
    second = await other.create_session(app_name=APP, user_id="u", session_id="s", state={"v": 2})
    await other.append_event(second, Event(author="user"))  # as many events as `first` read
    fresh = CortexSessionService(store, scope=tenant)  # nothing cached
    for service, held in ((one, first), (fresh, first), (one, markerless)):
        with pytest.raises(StaleSessionError):
            await service.append_event(held, Event(author="user", actions=delta(v=3)))
    got = await other.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert (got.state, len(got.events)) == ({"v": 2}, 1)
    # An object of the live session appends, whatever the service had cached.
    await other.delete_session(app_name=APP, user_id="u", session_id="s")
    third = await other.create_session(app_name=APP, user_id="u", session_id="s")
    await one.append_event(third, Event(author="user", actions=delta(v=4)))
    got = await fresh.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert (got.state, len(got.events)) == ({"v": 4}, 1)


async def test_a_marker_of_another_service_is_stale(service: CortexSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    session._storage_update_marker = "2026-12-01T00:00:00.000000+00:00"  # ADK's database form
    with pytest.raises(StaleSessionError):
        await service.append_event(session, Event(author="user"))
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert got.events == []


async def test_inputs_of_the_wrong_type_are_refused(
    service: CortexSessionService, store: cortex.Store, tenant: str
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    bad: Any = 5
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: service.create_session(app_name=bad, user_id="u"),
        lambda: service.create_session(app_name=APP, user_id=bad),
        lambda: service.create_session(app_name=APP, user_id="u", session_id=bad),
        lambda: service.create_session(app_name=APP, user_id="u", state=cast(Any, [("k", 1)])),
        lambda: service.create_session(app_name=APP, user_id="u", state=cast(Any, "k")),
        lambda: service.get_session(app_name=APP, user_id="u", session_id=bad),
        lambda: service.get_session(app_name=APP, user_id="u", session_id=cast(Any, None)),
        lambda: service.get_session(
            app_name=APP, user_id="u", session_id="s", config=cast(Any, {"num_recent_events": 1})
        ),
        lambda: service.list_sessions(app_name=bad),
        lambda: service.list_sessions(app_name=APP, user_id=bad),
        lambda: service.delete_session(app_name=APP, user_id="u", session_id=cast(Any, None)),
        lambda: service.get_user_state(app_name=APP, user_id=bad),
        lambda: service.append_event(session, cast(Any, {"author": "user"})),
        lambda: service.append_event(session, cast(Any, None)),
        lambda: service.append_event(cast(Any, {"id": "s"}), Event(author="user")),
        lambda: service.append_event(
            session, Event(author="user", custom_metadata={"k": object()})
        ),
    ]
    for call in calls:
        with pytest.raises(cortex.InvalidInput):
            await call()
    with use_scope(tenant):
        assert await store.count_sessions() == 1
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert got.events == []


async def test_state_that_json_cannot_hold_is_stored_as_text(
    service: CortexSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    await service.append_event(session, Event(author="user", actions=delta(raw=b"\x00\xff", ok=1)))
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert got.state["ok"] == 1
    assert isinstance(got.state["raw"], str)


async def test_messages_written_without_an_event_read_as_events(
    service: CortexSessionService, store: cortex.Store, tenant: str
) -> None:
    await service.create_session(app_name=APP, user_id="u", session_id="s")
    with use_scope(tenant):
        (stored,) = await store.list_sessions(ListFilter(agent_id="adk"))
        await store.append_message(stored.id, cortex.NewMessage("user", "a list", payload=[1]))
        await store.append_message(
            stored.id, cortex.NewMessage("user", "bad", payload={"author": [1]})
        )
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    assert [e.content.parts[0].text for e in got.events if e.content and e.content.parts] == [
        "a list",
        "bad",
    ]


async def test_the_runner_s_rewind_is_an_event_the_service_stores(
    service: CortexSessionService,
) -> None:
    """ADK rewinds by appending an event (``Runner.rewind_async``): no service method to implement.

    Its session service interface (``BaseSessionService``) has no rewind;
    the runner appends an event naming the invocation to rewind before,
    with the state delta that undoes the later ones, and ADK leaves the
    earlier events in the session (cortex's ``Store.rewind_session`` is a
    different operation: it deletes them).
    """
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner

    runner = Runner(
        app_name=APP,
        agent=LlmAgent(name="planner", model="gemini-2.0-flash"),
        session_service=service,
    )
    session = await service.create_session(
        app_name=APP, user_id="u", session_id="s", state={"k": 0}
    )
    for n in (1, 2, 3):
        extra = {"added": True} if n == 3 else {}
        event = Event(invocation_id=f"inv-{n}", author="user", actions=delta(k=n, **extra))
        await service.append_event(session, event)
    await runner.rewind_async(user_id="u", session_id="s", rewind_before_invocation_id="inv-2")
    reloaded = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert reloaded is not None
    assert [e.invocation_id for e in reloaded.events][:3] == ["inv-1", "inv-2", "inv-3"]
    rewind = reloaded.events[-1]
    assert rewind.actions.rewind_before_invocation_id == "inv-2"
    assert reloaded.state == {"k": 1, "added": None}
    # The stored session is consistent, and appends go on after the rewind event.
    with use_scope(service.user_scope(APP, "u")):
        stored = await service.store.get_session_by_key("adk", "s")
        assert stored.message_count == 4
    await service.append_event(reloaded, Event(invocation_id="inv-4", author="user"))
