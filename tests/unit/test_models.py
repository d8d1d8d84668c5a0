from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cortex import (
    ForkedFrom,
    FunctionResponse,
    InvalidInput,
    ListFilter,
    NewMessage,
    RequestedInput,
    RetentionPolicy,
    Scope,
    Session,
    SessionState,
)
from cortex.models import (
    MAX_CONTENT_BYTES,
    MAX_JSON_BYTES,
    PREVIEW_LENGTH,
    check_identifier,
    check_json,
)


def _session(**kw: Any) -> Session:
    now = datetime.now(UTC)
    base: dict[str, Any] = {
        "id": "ses_01m8n5v2k0ecc9ehf091kvpg8h",
        "agent_id": "a",
        "scope": "acme/x",
        "created_at": now,
        "updated_at": now,
    }
    return Session(**(base | kw))


def test_session_json_scope_is_path() -> None:
    s = _session()
    dumped = s.model_dump(mode="json")
    assert dumped["scope"] == "acme/x"
    assert Session.model_validate_json(s.model_dump_json()) == s


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"title": "x" * 1001}, "title"),
        ({"title": "a\x00b"}, "title"),
        ({"metadata": {"k": "x" * MAX_JSON_BYTES}}, "metadata"),
        ({"metadata": {"k\x00": 1}}, "metadata"),
        ({"metadata": {"k": float("nan")}}, "metadata"),
        ({"metadata": {"k": "\ud800"}}, "metadata"),
    ],
)
def test_session_limits(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        _session(**kwargs)


def test_assignment_is_validated() -> None:
    s = _session()
    with pytest.raises(InvalidInput, match="title"):
        s.title = "x" * 1001
    s.title = "ok"
    assert s.title == "ok"


def test_deep_and_huge_json_refused() -> None:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidInput):
        check_json(deep, "metadata")
    with pytest.raises(InvalidInput):
        check_json({"n": 10**5000}, "metadata")
    assert check_json({"n": 10**50}, "metadata") == '{"n":' + str(10**50) + "}"


def test_list_filter_limits() -> None:
    assert ListFilter().page_size == 50
    assert ListFilter(limit=1000).page_size == 1000
    for bad in (
        {"limit": -1},
        {"limit": 1001},
        {"offset": -1},
        {"search": "x" * 201},
        {"search": "\x00"},
        {"agent_id": "a b"},
        {"agent_id": ""},
        {"agent_id": "x" * 129},
    ):
        with pytest.raises(InvalidInput):
            ListFilter(**bad)
    ListFilter(search="x" * 200, agent_id="x" * 128)


def test_identifiers() -> None:
    check_identifier("agent:1/é", "agent_id")
    for bad in ("", "a b", "a\tb", "a\nb", "x" * 129, "a\x00", "a\u200bb\x7f"):
        with pytest.raises(InvalidInput):
            check_identifier(bad, "agent_id")


def test_new_message_limits() -> None:
    NewMessage("user", "x" * MAX_CONTENT_BYTES)
    with pytest.raises(InvalidInput, match="content"):
        NewMessage("user", "x" * (MAX_CONTENT_BYTES + 1))
    with pytest.raises(InvalidInput, match="content"):
        NewMessage("user", "é" * (MAX_CONTENT_BYTES // 2 + 1))  # bytes, not characters
    with pytest.raises(InvalidInput, match="role"):
        NewMessage("robot")  # type: ignore[arg-type]  # proving the refusal
    with pytest.raises(InvalidInput, match="content"):
        NewMessage("user", "a\x00")
    with pytest.raises(InvalidInput, match="author"):
        NewMessage("user", author="x" * 129)


def test_preview_is_bounded() -> None:
    assert NewMessage("user", "x" * 5000).preview() == "x" * PREVIEW_LENGTH


def test_requested_input_schema_checked() -> None:
    RequestedInput(interrupt_id="i1", response_schema={"type": "object", "required": ["ok"]})
    with pytest.raises(InvalidInput, match="response_schema"):
        RequestedInput(interrupt_id="i1", response_schema={"type": "nope"})
    with pytest.raises(InvalidInput, match="interrupt_id"):
        RequestedInput(interrupt_id="x" * 129)
    with pytest.raises(InvalidInput, match="payload"):
        RequestedInput(interrupt_id="i", payload="x" * (MAX_JSON_BYTES + 1))
    with pytest.raises(InvalidInput):
        FunctionResponse(id="i", response={"k": "\x00"})


def test_pydantic_validates_models_without_their_init() -> None:
    """A nested model or a re-validated instance goes straight to pydantic's core.

    cortex's ``__init__`` only turns a direct call's errors into InvalidInput;
    marked as pydantic's own, it is not run for every model the boundary
    re-validates (2 µs a message) and a nested error names its whole path.
    """
    with pytest.raises(InvalidInput) as refused:
        NewMessage("assistant", "q", requested_inputs=[{"interrupt_id": "", "bogus": 1}])
    assert "requested_inputs.0.bogus" in str(refused.value)
    message = NewMessage("user", "hi")
    again = NewMessage.model_validate(message)
    assert again == message
    assert again is not message
    message.__dict__["role"] = "robot"  # changed behind validate_assignment
    with pytest.raises(InvalidInput, match="role"):
        NewMessage.model_validate(message)


def test_from_database_equals_model_construct() -> None:
    from cortex.models import from_database

    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": "ses_01m8n5v2k0ecc9ehf091kvpg8h",
        "agent_id": "a",
        "scope": Scope.parse("acme/x"),
        "title": "t",
        "metadata": {"k": [1]},
        "message_count": 3,
        "trimmed_count": 0,
        "last_message": "m",
        "is_default": True,
        "backfilled_by": "",
        "created_at": now,
        "updated_at": now,
        "state": SessionState.PAUSED,
        "pending_count": 1,
        "key": "order-42",
        "data": {"app:k": 1.5},
        "forked_from": None,
    }
    fast = from_database(Session, dict(values))
    slow = Session.model_construct(**values)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump_json() == slow.model_dump_json()
    with pytest.raises(InvalidInput):
        fast.title = "x" * 1001  # still validated on assignment


def test_from_database_equals_model_construct_with_private_attributes() -> None:
    """ADK's Session (a private attribute, an alias generator) is built as model_construct builds it."""
    adk = pytest.importorskip("google.adk.sessions.session")
    from cortex.models import from_database

    values: dict[str, Any] = {
        "id": "s-1",
        "app_name": "app",
        "user_id": "u",
        "state": {"k": [1, {"x": None}]},
        "events": [],
        "last_update_time": 1764500000.25,
    }
    fast = from_database(adk.Session, dict(values), {"_storage_update_marker": "3"})
    slow = adk.Session.model_construct(**values)
    slow._storage_update_marker = "3"
    assert fast == slow
    assert fast._storage_update_marker == "3"
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json(by_alias=True) == slow.model_dump_json(by_alias=True)
    assert fast.model_fields_set == slow.model_fields_set
    assert adk.Session.model_validate(fast.model_dump()).model_dump() == fast.model_dump()


def test_row_to_session_builds_the_model_in_field_order() -> None:
    """The listing's fast path: the dict it hands over is in field order, the model equal to model_construct's."""
    import uuid

    from cortex._calls.rows import row_to_session
    from cortex._sql.sessions import SESSION_COLUMNS
    from cortex.ids import format_id

    now = datetime.now(UTC)
    sid = uuid.UUID("0190f3c2-6f1e-7b7a-9c55-7d2f6f0f8a11")
    row = {
        "id": sid,
        "agent_id": "a",
        "scope": "acme/x",
        "title": "t",
        "metadata": '{"k":[1]}',
        "message_count": 3,
        "trimmed_count": 0,
        "last_message": "m",
        "is_default": True,
        "backfilled_by": "",
        "created_at": now,
        "updated_at": now,
        "state": "paused",
        "pending_count": 1,
        "session_key": "order-42",
        "forked_from_id": None,
        "forked_from_seq": None,
        "data": '{"app:k":"1.5"}',
    }
    assert set(row) == {column.name for column in SESSION_COLUMNS}
    built = row_to_session(row)  # type: ignore[arg-type]  # a mapping stands in for the record
    assert list(built.__dict__) == list(Session.model_fields)
    expected = Session.model_construct(
        id=format_id("ses", sid),
        agent_id="a",
        scope=Scope.parse("acme/x"),
        title="t",
        metadata={"k": [1]},
        message_count=3,
        trimmed_count=0,
        last_message="m",
        is_default=True,
        backfilled_by="",
        created_at=now,
        updated_at=now,
        state=SessionState.PAUSED,
        pending_count=1,
        key="order-42",
        data={"app:k": 1.5},
        forked_from=None,
    )
    assert built == expected
    assert built.model_dump_json() == expected.model_dump_json()
    assert built.model_fields_set == expected.model_fields_set
    # Each instance owns its set: one model's fields set never leaks into another's.
    other = row_to_session(row)  # type: ignore[arg-type]
    assert built.model_fields_set is not other.model_fields_set
    empty = row_to_session({**row, "metadata": "{}", "data": "{}"})  # type: ignore[arg-type]
    assert empty.metadata == {}
    assert empty.data == {}
    assert empty.metadata is not other.metadata
    source = uuid.UUID("0190f3c2-6f1e-7b7a-9c55-7d2f6f0f8a12")
    forked = row_to_session({**row, "forked_from_id": source, "forked_from_seq": 2})  # type: ignore[arg-type]
    assert forked.forked_from == ForkedFrom(session_id=format_id("ses", source), seq=2)
    assert built.forked_from is None


def test_a_list_filter_round_trips_as_json_and_keeps_its_instants() -> None:
    from datetime import timedelta, timezone

    flt = ListFilter(
        metadata={"n": [1, {"a": None}], "channel": "web"},
        created_after=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=5))),
    )
    again = ListFilter.model_validate_json(flt.model_dump_json())
    assert again == flt
    assert (
        again.metadata_pairs
        == flt.metadata_pairs
        == (("channel", '"web"'), ("n", '[1,{"a":null}]'))
    )
    # The same instant, held in UTC.
    assert flt.created_after == datetime(2025, 12, 31, 19, tzinfo=UTC)
    assert flt.created_after is not None
    assert flt.created_after.tzinfo is UTC
    assert ListFilter(metadata={}).metadata_pairs == ListFilter().metadata_pairs == ()


@pytest.mark.parametrize(
    ("period", "text"),
    [
        (timedelta(weeks=702), "P4914D"),
        (timedelta(hours=1, seconds=5), "PT1H0M5S"),
        (timedelta(days=1, hours=2, minutes=3, seconds=4), "P1DT2H3M4S"),
        (timedelta(minutes=3), "PT3M"),
        (timedelta(seconds=9), "PT9S"),
    ],
)
def test_an_idle_period_is_written_as_an_rfc3339_duration(period: timedelta, text: str) -> None:
    policy = RetentionPolicy(delete_idle_after=period)
    assert policy.model_dump(mode="json")["delete_idle_after"] == text
    assert RetentionPolicy.model_validate_json(policy.model_dump_json()) == policy
    assert policy.model_dump()["delete_idle_after"] == period


def test_an_idle_period_is_whole_seconds() -> None:
    with pytest.raises(InvalidInput, match="whole seconds"):
        RetentionPolicy(delete_idle_after=timedelta(seconds=1.5))
