"""One validation boundary: every wrong type, for every parameter, is InvalidInput naming it.

The store points at a port where nothing listens, so a call that got past
validation would raise DatabaseUnavailable instead: each refusal here is
proved to happen before any SQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from cortex import (
    FunctionResponse,
    InvalidInput,
    ListFilter,
    NewMessage,
    RequestedInput,
    Session,
    Store,
    use_scope,
)
from cortex._db.engine import make_engine
from cortex.ids import format_id, new_uuid

pytestmark = pytest.mark.anyio

SID = format_id("ses", new_uuid())
INT4_OVER = 2**31

WRONG: dict[str, Any] = {
    "None": None,
    "int": 5,
    "huge int": 2**80,
    "float": 1.5,
    "bool": True,
    "bytes": b"x",
    "dict": {"a": [1]},
    "empty dict": {},
    "list": ["x"],
    "object": object(),
}


async def _drain(it: AsyncIterator[Any]) -> None:
    async for _ in it:
        pass


def _session() -> Session:
    now = datetime.now(UTC)
    return Session(id=SID, agent_id="a", scope="acme/x", created_at=now, updated_at=now)


Call = Callable[[Store, Any], Awaitable[Any]]

# (method, parameter, call with the value in that parameter, values that are valid there)
PARAMS: list[tuple[str, str, Call, set[str]]] = [
    ("create_session", "agent_id", lambda s, v: s.create_session(v), set()),
    ("create_session", "title", lambda s, v: s.create_session("a", title=v), set()),
    (
        "create_session",
        "metadata",
        lambda s, v: s.create_session("a", metadata=v),
        {"None", "dict", "empty dict"},
    ),
    ("create_session", "is_default", lambda s, v: s.create_session("a", is_default=v), {"bool"}),
    ("create_session", "session_id", lambda s, v: s.create_session("a", session_id=v), {"None"}),
    ("get_session", "session_id", lambda s, v: s.get_session(v), set()),
    ("update_session", "session", lambda s, v: s.update_session(v), set()),
    ("delete_session", "session_id", lambda s, v: s.delete_session(v), set()),
    ("list_sessions", "filter", lambda s, v: s.list_sessions(v), {"None"}),
    ("count_sessions", "filter", lambda s, v: s.count_sessions(v), {"None"}),
    ("iter_sessions", "filter", lambda s, v: _drain(s.iter_sessions(v)), {"None"}),
    ("resolve_session", "agent_id", lambda s, v: s.resolve_session(v), set()),
    ("resolve_session", "session_id", lambda s, v: s.resolve_session("a", v), {"None"}),
    ("set_default_session", "session_id", lambda s, v: s.set_default_session(v), set()),
    (
        "append_messages",
        "session_id",
        lambda s, v: s.append_messages(v, [NewMessage("user")]),
        set(),
    ),
    ("append_messages", "messages", lambda s, v: s.append_messages(SID, v), set()),
    ("append_message", "session_id", lambda s, v: s.append_message(v, NewMessage("user")), set()),
    ("append_message", "message", lambda s, v: s.append_message(SID, v), set()),
    ("list_messages", "session_id", lambda s, v: s.list_messages(v), set()),
    ("list_messages", "after_seq", lambda s, v: s.list_messages(SID, after_seq=v), {"int"}),
    ("list_messages", "limit", lambda s, v: s.list_messages(SID, limit=v), {"int"}),
    ("fork_session", "session_id", lambda s, v: s.fork_session(v), set()),
    (
        "fork_session",
        "through_seq",
        lambda s, v: s.fork_session(SID, through_seq=v),
        {"None", "int"},
    ),
    ("fork_session", "title", lambda s, v: s.fork_session(SID, title=v), {"None"}),
    ("rewind_session", "session_id", lambda s, v: s.rewind_session(v, to_seq=0), set()),
    ("rewind_session", "to_seq", lambda s, v: s.rewind_session(SID, to_seq=v), {"int"}),
    ("inspect_session", "session_id", lambda s, v: s.inspect_session(v), set()),
    ("abort_session", "session_id", lambda s, v: s.abort_session(v, "r"), set()),
    ("abort_session", "reason", lambda s, v: s.abort_session(SID, v), set()),
    ("resume", "session_id", lambda s, v: s.resume(v, "i", {}), set()),
    ("resume", "interrupt_id", lambda s, v: s.resume(SID, v, {}), set()),
    # Any JSON value answers; bytes and objects are not JSON.
    (
        "resume",
        "response",
        lambda s, v: s.resume(SID, "i", v),
        {"None", "int", "huge int", "float", "bool", "dict", "empty dict", "list"},
    ),
    ("resume", "author", lambda s, v: s.resume(SID, "i", {}, author=v), set()),
    ("mark_interrupted", "session_id", lambda s, v: s.mark_interrupted(v, "r"), set()),
    ("mark_interrupted", "reason", lambda s, v: s.mark_interrupted(SID, v), set()),
    ("clear_interrupted", "session_id", lambda s, v: s.clear_interrupted(v), set()),
]

CASES = [
    pytest.param(call, param, value, id=f"{method}-{param}-{label}")
    for method, param, call, valid in PARAMS
    for label, value in WRONG.items()
    if label not in valid
]


@pytest.fixture
async def dead_store() -> AsyncIterator[Store]:
    engine = make_engine("postgresql://nobody@127.0.0.1:1/none", manual_transactions=True)
    try:
        yield Store(engine)
    finally:
        await engine.dispose()


@pytest.mark.parametrize(("call", "param", "value"), CASES)
async def test_wrong_type_is_invalid_input_naming_the_parameter(
    dead_store: Store, call: Call, param: str, value: Any
) -> None:
    with use_scope("acme/x"), pytest.raises(InvalidInput) as info:
        await call(dead_store, value)
    assert param in str(info.value)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        pytest.param(
            lambda s: s.list_messages(SID, after_seq=INT4_OVER), "after_seq", id="after_seq"
        ),
        pytest.param(
            lambda s: s.list_sessions(ListFilter.model_construct(offset=INT4_OVER)),
            "offset",
            id="offset-constructed",
        ),
        pytest.param(
            lambda s: s.create_session("a", metadata={1: "a", "1": "b"}), "metadata", id="int-key"
        ),
        pytest.param(
            lambda s: s.create_session("a", metadata={"x": {None: 1}}),
            "metadata",
            id="nested-none-key",
        ),
        pytest.param(
            lambda s: s.create_session("a", metadata={"x": [{2.5: 1}]}),
            "metadata",
            id="nested-float-key",
        ),
        pytest.param(
            lambda s: s.append_messages(SID, [NewMessage("user", metadata={"a": {1: 2}})]),
            "metadata",
            id="message-int-key",
        ),
        pytest.param(lambda s: s.append_messages(SID, None), "messages", id="append-none"),
        # Every message within its limits, the batch over 64 MiB in all.
        pytest.param(
            lambda s: s.append_messages(SID, [NewMessage("user", "x" * 2**20)] * 65),
            "messages",
            id="batch-bytes-content",
        ),
        pytest.param(
            lambda s: s.append_messages(
                SID,
                [NewMessage("user", "x" * (2**20 - 70_000), metadata={"k": "y" * 65_000})] * 70,
            ),
            "messages",
            id="batch-bytes-content-and-metadata",
        ),
        pytest.param(lambda s: s.append_messages(SID, "user"), "messages", id="append-str"),
        pytest.param(
            lambda s: s.append_messages(SID, [NewMessage("user"), None]),
            "messages",
            id="append-none-item",
        ),
    ],
)
async def test_refused_before_sql(
    dead_store: Store, call: Callable[[Store], Awaitable[Any]], param: str
) -> None:
    with use_scope("acme/x"), pytest.raises(InvalidInput) as info:
        await call(dead_store)
    assert param in str(info.value)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        pytest.param(lambda: NewMessage("user", "x", author=None), "author", id="author-none"),
        pytest.param(lambda: NewMessage("user", WRONG["bytes"]), "content", id="content-bytes"),
        pytest.param(lambda: NewMessage(WRONG["int"]), "role", id="role-int"),
        pytest.param(
            lambda: NewMessage.model_validate({"role": "user", "content": 5}),
            "content",
            id="model_validate",
        ),
        pytest.param(
            lambda: NewMessage.model_validate(None), "NewMessage", id="model_validate-none"
        ),
        pytest.param(
            lambda: NewMessage.model_validate_json(b'{"role": "robot"}'),
            "role",
            id="model_validate_json",
        ),
        pytest.param(
            lambda: NewMessage.model_validate_json(b"{"),
            "NewMessage",
            id="model_validate_json-broken",
        ),
        pytest.param(lambda: NewMessage("user", metadata=None), "metadata", id="metadata-none"),
        pytest.param(lambda: ListFilter(offset=INT4_OVER), "offset", id="offset"),
        pytest.param(lambda: ListFilter(limit=True), "limit", id="limit-bool"),
        pytest.param(lambda: ListFilter(offset=1.0), "offset", id="offset-float"),
        pytest.param(lambda: ListFilter(exact="yes"), "exact", id="exact-str"),
        pytest.param(lambda: ListFilter(agent_id=5), "agent_id", id="agent-int"),
        pytest.param(lambda: ListFilter(search=b"x"), "search", id="search-bytes"),
        pytest.param(lambda: RequestedInput(interrupt_id=5), "interrupt_id", id="interrupt-int"),
        pytest.param(
            lambda: RequestedInput(interrupt_id="i", message=None), "message", id="question-none"
        ),
        pytest.param(lambda: FunctionResponse(id=None), "id", id="response-id-none"),
        pytest.param(lambda: FunctionResponse(id="i", name=5), "name", id="response-name-int"),
        pytest.param(
            lambda: _session().model_copy(update={}).__setattr__("title", 5),
            "title",
            id="assign-title",
        ),
    ],
)
def test_models_refuse_wrong_types(build: Callable[[], Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        build()
    assert field in str(info.value)


async def test_a_task_started_during_a_call_keeps_none_of_its_encoded_texts() -> None:
    """The boundary's memo of encoded payloads ends with the call.

    A task started inside the call (as the pool opens a connection) holds a
    copy of the call's context for as long as it lives; the memo it sees
    there must be empty once the call has returned, or it would keep every
    payload of that call alive.
    """
    import asyncio

    from cortex._calls import messages as _messages
    from cortex._validate import _ENCODED, boundary

    seen: dict[str, Any] = {}
    release = asyncio.Event()

    async def outlives_the_call() -> None:
        await release.wait()
        seen["after"] = dict(_ENCODED.get() or {})

    class Probe:
        @boundary
        async def append_messages(self, session_id: str, messages: list[NewMessage]) -> None:
            _messages.encode_batch(list(messages))
            seen["during"] = len(_ENCODED.get() or {})
            seen["task"] = asyncio.ensure_future(outlives_the_call())

    payload = {"blob": "x" * 100_000}
    await Probe().append_messages(
        format_id("ses", new_uuid()), [NewMessage("user", "a", payload=payload)]
    )
    release.set()
    await seen["task"]
    assert seen["during"] == 1  # the payload's text, kept for the storage
    assert seen["after"] == {}
