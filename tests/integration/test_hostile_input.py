"""Fuzz every public input: each call succeeds or raises InvalidInput/NotFound, and a refused call writes nothing.

Hypothesis draws ids, scopes, titles, metadata (deep nesting, huge numbers,
NaN, NUL, lone surrogates, non-string keys), search strings, message content,
response schemas and payloads, and for every parameter also values of the
wrong type: every JSON type, None, bytes, huge ints, floats, nested lists and
dicts, arbitrary objects. A raw driver error, a TypeError, pydantic's
ValidationError or any other exception fails the test. The figures count the
arguments drawn by type.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, timedelta, timezone
from typing import Any

import anyio.from_thread
import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cortex
from cortex import (
    Conflict,
    CortexError,
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

pytestmark = pytest.mark.reliability

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


class Opaque:
    """Not JSON, not a string, not anything cortex takes."""

    def __repr__(self) -> str:
        return "Opaque()"


# Values of every type, for parameters that expect something else.
anything = (
    json_values
    | st.binary(max_size=20)
    | st.sampled_from([2**31, 2**31 - 1, -(2**31) - 1, 2**63, -1, 0, 1.0, -0.0, 1e300, True])
    | st.builds(lambda: 10**5000)
    | st.builds(Opaque)
    | st.dictionaries(
        st.integers() | st.none() | st.booleans(), json_values, min_size=1, max_size=3
    )
    | st.lists(st.lists(json_values, max_size=3), max_size=3)
    | st.tuples(text, st.integers())
    | st.builds(lambda: {"k": {1: "a", "1": "b"}})
)


def wild(expected: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Two times in three the expected kind of value, else anything at all.

    (``expected | anything`` would flatten into one choice among all of
    anything's branches, and rarely draw the expected kind.)
    """
    return st.integers(0, 2).flatmap(lambda pick: anything if pick == 0 else expected)


def kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "huge int" if abs(value) >= 2**31 else "int"
    for cls, name in (
        (float, "float"),
        (str, "str"),
        (bytes, "bytes"),
        (dict, "dict"),
        (list, "list"),
        (tuple, "tuple"),
    ):
        if isinstance(value, cls):
            return name
    return "other object"


def drawn(*values: Any) -> None:
    for value in values:
        record(f"hostile inputs: arguments drawn of type {kind(value)}")


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

    def check(
        self,
        call: Callable[[cortex.Store], Awaitable[Any]],
        scope: str = TENANT,
        also: tuple[type[CortexError], ...] = (),
    ) -> str:
        """Run ``call`` in ``scope``; return "ok", "invalid", "notfound" or "refused".

        ``also``: further cortex errors this call may answer with (a taken
        id is Conflict); anything else fails the test.
        """
        before = self.footprint()

        async def go() -> str:
            try:
                with use_scope(scope):
                    await call(self.store)
            except InvalidInput:
                return "invalid"
            except NotFound:
                return "notfound"
            except also:
                return "refused"
            return "ok"

        outcome = self.portal.call(go)
        record("hostile inputs: calls tried")
        if outcome != "ok":
            assert self.footprint() == before, "a refused call wrote something"
            record("hostile inputs: refused with nothing written")
        return outcome


@FUZZ
@given(
    agent=wild(text),
    title=wild(text),
    meta=wild(metadata),
    is_default=wild(st.booleans()),
    session_id=wild(st.none() | ids),
)
def test_create_session(
    fuzz: Fuzz, agent: Any, title: Any, meta: Any, is_default: Any, session_id: Any
) -> None:
    drawn(agent, title, meta, is_default, session_id)
    fuzz.check(
        lambda s: s.create_session(
            agent, title=title, metadata=meta, is_default=is_default, session_id=session_id
        ),
        also=(Conflict,),
    )


@FUZZ
@given(session_id=wild(ids))
def test_id_taking_calls(fuzz: Fuzz, session_id: Any) -> None:
    drawn(session_id)
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
@given(
    term=wild(text),
    agent=wild(st.none() | text),
    limit=wild(st.integers(-5, 1005)),
    offset=wild(st.integers(-5, 10)),
    exact=wild(st.booleans()),
    flt=st.none() | anything,
)
def test_listing(
    fuzz: Fuzz, term: Any, agent: Any, limit: Any, offset: Any, exact: Any, flt: Any
) -> None:
    drawn(term, agent, limit, offset, exact, flt)

    def build() -> ListFilter:
        return ListFilter(search=term, agent_id=agent, limit=limit, offset=offset, exact=exact)

    async def listing(store: cortex.Store) -> None:
        await store.list_sessions(build())
        await store.count_sessions(build())

    async def walk(store: cortex.Store) -> None:
        async for _ in store.iter_sessions(build()):
            pass

    fuzz.check(listing)
    fuzz.check(walk)
    fuzz.check(lambda s: s.list_sessions(flt))
    fuzz.check(lambda s: s.count_sessions(flt))


# Instants with no zone, UTC, or any fixed offset a datetime can carry,
# from year 1 to 9999: the edges overflow once converted to UTC.
instants = st.datetimes(
    timezones=st.none()
    | st.just(UTC)
    | st.builds(
        timezone,
        st.timedeltas(
            min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
        ),
    )
)


@FUZZ
@given(
    meta=wild(metadata),
    after=wild(st.none() | instants),
    before=wild(st.none() | instants),
    which=st.sampled_from(["created", "updated"]),
    agent=st.none() | text,
)
def test_listing_by_metadata_and_time(
    fuzz: Fuzz, meta: Any, after: Any, before: Any, which: str, agent: Any
) -> None:
    drawn(meta, after, before)

    def build() -> ListFilter:
        bounds = {f"{which}_after": after, f"{which}_before": before}
        return ListFilter(metadata=meta, agent_id=agent, **bounds)

    async def every_way(store: cortex.Store) -> None:
        await store.list_sessions(build())
        await store.count_sessions(build())
        async for _ in store.iter_sessions(build()):
            pass

    fuzz.check(every_way)


@FUZZ
@given(
    content=wild(text),
    author=wild(text),
    meta=wild(metadata),
    role=wild(st.sampled_from(["user", "assistant", "system", "tool"])),
    message_id=wild(st.none() | st.builds(lambda: format_id("msg", new_uuid()))),
    schema=st.none()
    | st.dictionaries(
        st.sampled_from(["type", "properties", "required", "minimum"]), json_values, max_size=3
    ),
    payload=wild(json_values),
    interrupt=wild(text),
)
def test_messages(
    fuzz: Fuzz,
    content: Any,
    author: Any,
    meta: Any,
    role: Any,
    message_id: Any,
    schema: Any,
    payload: Any,
    interrupt: Any,
) -> None:
    drawn(content, author, meta, role, message_id, schema, payload, interrupt)

    async def append(store: cortex.Store) -> None:
        message = NewMessage(
            role,
            content,
            author=author,
            metadata=meta,
            id=message_id,
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
@given(messages=anything, after_seq=wild(st.integers(-5, 10)), limit=wild(st.integers(-5, 1005)))
def test_message_arguments(fuzz: Fuzz, messages: Any, after_seq: Any, limit: Any) -> None:
    drawn(messages, after_seq, limit)
    fuzz.check(lambda s: s.append_messages(fuzz.target, messages))
    fuzz.check(lambda s: s.append_message(fuzz.target, messages))
    fuzz.check(lambda s: s.list_messages(fuzz.target, after_seq=after_seq, limit=limit))
    fuzz.check(lambda s: s.update_session(messages))


@FUZZ
@given(reason=wild(text))
def test_markers(fuzz: Fuzz, reason: Any) -> None:
    drawn(reason)
    fuzz.check(lambda s: s.mark_interrupted(format_id("ses", new_uuid()), reason))
    fuzz.check(lambda s: s.abort_session(format_id("ses", new_uuid()), reason))


@FUZZ
@given(
    session_id=wild(ids),
    through_seq=wild(st.none() | st.integers(-5, 5) | st.just(2**31)),
    title=wild(st.none() | text),
    to_seq=wild(st.integers(-5, 5) | st.just(2**31)),
)
def test_fork_and_rewind(
    fuzz: Fuzz, session_id: Any, through_seq: Any, title: Any, to_seq: Any
) -> None:
    drawn(session_id, through_seq, title, to_seq)
    for sid in (session_id, fuzz.target):

        async def fork(store: cortex.Store, sid: Any = sid) -> None:
            await store.fork_session(sid, through_seq=through_seq, title=title)

        async def rewind(store: cortex.Store, sid: Any = sid) -> None:
            await store.rewind_session(sid, to_seq=to_seq)

        fuzz.check(fork)
        fuzz.check(rewind)
