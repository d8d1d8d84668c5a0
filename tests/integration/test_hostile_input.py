"""Fuzz every public input: each call succeeds or raises InvalidInput/NotFound, and a refused call writes nothing.

Hypothesis draws ids, scopes, titles, metadata (deep nesting, huge numbers,
NaN, NUL, lone surrogates), search strings, message content, response schemas
and payloads. A raw driver error, or any other exception, fails the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio.from_thread
import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cortex
from cortex import (
    FunctionResponse,
    InvalidInput,
    ListFilter,
    NewMessage,
    NotFound,
    RequestedInput,
    use_scope,
)
from cortex.ids import format_id, new_uuid
from tests.conftest import Database, asyncpg_dsn
from tests.figures import record

TENANT = f"fuzz{uuid.uuid4().hex[:6]}"
FUZZ = settings(
    max_examples=int(os.environ.get("CORTEX_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

text = st.text(alphabet=st.characters(codec=None), max_size=300) | st.sampled_from(
    ["", "\x00", "a\x00b", "\ud800", "x" * 1001, " ", "a b", "%", "_", "\\"]
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**60), max_value=10**60)
    | st.sampled_from([float("nan"), float("inf")])
    | st.builds(lambda: 10**5000)  # built, not listed: hypothesis cannot repr it
    | st.floats(allow_nan=False)
    | text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


def deep(n: int) -> Any:
    value: Any = "leaf"
    for _ in range(n):
        value = [value]
    return value


metadata = st.dictionaries(text, json_values, max_size=5) | st.sampled_from(
    [{"deep": deep(3000)}, {"big": "x" * 70_000}, {"\x00": 1}]
)
ids = (
    text
    | st.builds(lambda: format_id("ses", new_uuid()))
    | st.sampled_from(["ses_", "msg_01m8n5v2k0ecc9ehf091kvpg8h", "ses_01M8N5V2K0ECC9EHF091KVPG8H"])
)


@pytest.fixture(scope="module")
def fuzz(
    database: Database, portal: anyio.from_thread.BlockingPortal, portal_store: cortex.Store
) -> Iterator[Fuzz]:
    owner = portal.call(asyncpg.connect, asyncpg_dsn(database.owner_url))

    async def make_session() -> str:
        with use_scope(TENANT):
            return (await portal_store.create_session("fuzz-target")).id

    target = portal.call(make_session)
    yield Fuzz(portal_store, portal, owner, target)
    portal.call(owner.close)


class Fuzz:
    def __init__(
        self,
        store: cortex.Store,
        portal: anyio.from_thread.BlockingPortal,
        owner: asyncpg.Connection,
        target: str,
    ) -> None:
        self.store, self.portal, self.owner, self.target = store, portal, owner, target

    def footprint(self) -> tuple[Any, ...]:
        async def read() -> tuple[Any, ...]:
            row = await self.owner.fetchrow(
                "SELECT (SELECT count(*) FROM sessions WHERE tenant_id = $1),"
                " (SELECT coalesce(sum(message_count), 0) FROM sessions WHERE tenant_id = $1),"
                " (SELECT count(*) FROM messages WHERE tenant_id = $1),"
                " (SELECT max(updated_at) FROM sessions WHERE tenant_id = $1)",
                TENANT,
            )
            assert row is not None
            return tuple(row)

        return self.portal.call(read)

    def check(self, call: Callable[[cortex.Store], Awaitable[Any]], scope: str = TENANT) -> str:
        """Run ``call`` in ``scope``; return "ok", "invalid" or "notfound"."""
        before = self.footprint()

        async def go() -> str:
            try:
                with use_scope(scope):
                    await call(self.store)
            except InvalidInput:
                return "invalid"
            except NotFound:
                return "notfound"
            return "ok"

        outcome = self.portal.call(go)
        record("hostile inputs: calls tried")
        if outcome != "ok":
            assert self.footprint() == before, "a refused call wrote something"
            record("hostile inputs: refused with nothing written")
        return outcome


@FUZZ
@given(agent=text, title=text, meta=metadata, session_id=st.none() | ids)
def test_create_session(
    fuzz: Fuzz, agent: str, title: str, meta: Any, session_id: str | None
) -> None:
    fuzz.check(lambda s: s.create_session(agent, title=title, metadata=meta, session_id=session_id))


@FUZZ
@given(session_id=ids)
def test_id_taking_calls(fuzz: Fuzz, session_id: str) -> None:
    for call in (
        lambda s: s.get_session(session_id),
        lambda s: (
            s.delete_session(session_id) if session_id != fuzz.target else s.get_session(session_id)
        ),
        lambda s: s.list_messages(session_id),
        lambda s: (
            s.set_default_session(session_id)
            if session_id != fuzz.target
            else s.get_session(session_id)
        ),
        lambda s: s.inspect_session(session_id),
        lambda s: s.clear_interrupted(session_id),
        lambda s: s.resolve_session("fuzz-target", session_id),
    ):
        fuzz.check(call)


@FUZZ
@given(path=text)
def test_scopes(fuzz: Fuzz, path: str) -> None:
    # InvalidScope (an InvalidInput) for a malformed path; a count of nothing otherwise.
    fuzz.check(lambda s: s.count_sessions(), scope=path)


@FUZZ
@given(term=text, agent=st.none() | text, limit=st.integers(-5, 1005), offset=st.integers(-5, 10))
def test_listing(fuzz: Fuzz, term: str, agent: str | None, limit: int, offset: int) -> None:
    def flt() -> ListFilter:
        return ListFilter(search=term, agent_id=agent, limit=limit, offset=offset)

    async def listing(store: cortex.Store) -> None:
        await store.list_sessions(flt())
        await store.count_sessions(flt())

    fuzz.check(listing)


@FUZZ
@given(
    content=text,
    author=text,
    meta=metadata,
    schema=st.none()
    | st.dictionaries(
        st.sampled_from(["type", "properties", "required", "minimum"]), json_values, max_size=3
    ),
    payload=json_values,
    interrupt=text,
)
def test_messages(
    fuzz: Fuzz, content: str, author: str, meta: Any, schema: Any, payload: Any, interrupt: str
) -> None:
    async def append(store: cortex.Store) -> None:
        message = NewMessage(
            "assistant",
            content,
            author=author,
            metadata=meta,
            requested_input=RequestedInput(
                interrupt_id=interrupt, response_schema=schema, payload=payload
            ),
        )
        await store.append_message(fuzz.target, message)

    if fuzz.check(append) == "ok":
        # A question that got in can be answered, or refused cleanly.
        fuzz.check(lambda s: s.resume(fuzz.target, interrupt, payload, author=author))

    async def answer(store: cortex.Store) -> None:
        await store.append_message(
            fuzz.target,
            NewMessage("tool", function_response=FunctionResponse(id=interrupt, response=payload)),
        )

    fuzz.check(answer)


@FUZZ
@given(reason=text)
def test_markers(fuzz: Fuzz, reason: str) -> None:
    fuzz.check(lambda s: s.mark_interrupted(format_id("ses", new_uuid()), reason))
    fuzz.check(lambda s: s.abort_session(format_id("ses", new_uuid()), reason))
