"""Every limit is enforced before any SQL runs.

The store here points at a port where nothing listens: a call that reached
the database would raise DatabaseUnavailable. Each bad call must raise
InvalidInput instead, which proves it was refused first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from cortex import (
    InvalidInput,
    ListFilter,
    NewMessage,
    ScopeViolation,
    Session,
    SessionCursor,
    Store,
    use_scope,
)
from cortex._db.engine import make_engine
from cortex.ids import format_id, new_uuid

pytestmark = pytest.mark.anyio

SID = format_id("ses", new_uuid())
BIG = "x" * (64 * 1024 + 1)
NAIVE = datetime(2026, 1, 1)  # noqa: DTZ001  # without a timezone on purpose

HEADER: dict[str, Any] = {
    "type": "header",
    "format": "cortex-scope-export",
    "version": 1,
    "root": "acme/x",
}

CALLS: list[tuple[str, Callable[[Store], Awaitable[Any]]]] = [
    ("agent id empty", lambda s: s.create_session("")),
    ("agent id whitespace", lambda s: s.create_session("a b")),
    ("agent id long", lambda s: s.create_session("a" * 129)),
    ("title long", lambda s: s.create_session("a", title="t" * 1001)),
    ("title NUL", lambda s: s.create_session("a", title="\x00")),
    ("metadata big", lambda s: s.create_session("a", metadata={"k": BIG})),
    ("metadata NUL", lambda s: s.create_session("a", metadata={"k": "\x00"})),
    ("session id malformed", lambda s: s.create_session("a", session_id="ses_bad")),
    ("get malformed", lambda s: s.get_session("nope")),
    ("get wrong prefix", lambda s: s.get_session(format_id("msg", new_uuid()))),
    ("delete malformed", lambda s: s.delete_session("")),
    ("update forged", lambda s: s.update_session(_forged(title="t" * 1001))),
    ("update metadata NUL", lambda s: s.update_session(_forged(metadata={"\x00": 1}))),
    ("list offset on iter", lambda s: _drain(s, ListFilter(offset=1))),
    ("page offset", lambda s: s.list_sessions_page(ListFilter(offset=1))),
    ("page cursor a dict", lambda s: s.list_sessions_page(cursor={"id": SID})),  # type: ignore[arg-type]
    ("page cursor forged", lambda s: s.list_sessions_page(cursor=_cursor(listing="0" * 31))),
    ("page cursor elsewhere", lambda s: s.list_sessions_page(cursor=_cursor(listing="0" * 32))),
    ("scope data empty key", lambda s: s.update_scope_data({"": 1})),
    ("scope data reserved key", lambda s: s.update_scope_data({"__cortex_x": 1})),
    ("scope data NaN", lambda s: s.update_scope_data({"k": float("nan")})),
    ("scope data not a dict", lambda s: s.update_scope_data([1])),  # type: ignore[arg-type]
    ("scope data replace too big", lambda s: s.update_scope_data({"k": BIG * 17}, replace=True)),
    ("list metadata not a dict", lambda s: s.list_sessions(_filter(metadata=["k", "v"]))),
    ("list metadata big", lambda s: s.list_sessions(_filter(metadata={"k": BIG}))),
    ("list metadata NUL key", lambda s: s.list_sessions(_filter(metadata={"\x00": 1}))),
    ("list metadata NaN", lambda s: s.list_sessions(_filter(metadata={"k": float("nan")}))),
    (
        "count metadata keys",
        lambda s: s.count_sessions(_filter(metadata=dict.fromkeys("abcdefghijklmnopq", 1))),
    ),
    (
        "count naive created",
        lambda s: s.count_sessions(_filter(created_after=NAIVE)),
    ),
    ("list naive updated", lambda s: s.list_sessions(_filter(updated_before=NAIVE))),
    ("iter naive updated", lambda s: _drain(s, _filter(updated_after=NAIVE))),
    ("iter created a string", lambda s: _drain(s, _filter(created_before="2026-01-01T00:00:00Z"))),
    ("resolve bad agent", lambda s: s.resolve_session("a b")),
    ("resolve bad id", lambda s: s.resolve_session("a", "x")),
    ("set default bad id", lambda s: s.set_default_session("x")),
    ("append none", lambda s: s.append_messages(SID, [])),
    ("append too many", lambda s: s.append_messages(SID, [NewMessage("user")] * 1001)),
    (
        "append content NUL",
        lambda s: s.append_messages(SID, [NewMessage.model_construct(role="user", content="\x00")]),
    ),
    (
        "append content big",
        lambda s: s.append_messages(
            SID, [NewMessage.model_construct(role="user", content="x" * (1024 * 1024 + 1))]
        ),
    ),
    ("list messages limit", lambda s: s.list_messages(SID, limit=-1)),
    ("list messages after", lambda s: s.list_messages(SID, after_seq=-1)),
    ("fork through negative", lambda s: s.fork_session(SID, through_seq=-1)),
    ("fork through past int4", lambda s: s.fork_session(SID, through_seq=2**31)),
    ("fork title long", lambda s: s.fork_session(SID, title="t" * 1001)),
    ("fork title NUL", lambda s: s.fork_session(SID, title="\x00")),
    ("fork malformed", lambda s: s.fork_session("ses_")),
    ("rewind negative", lambda s: s.rewind_session(SID, to_seq=-1)),
    ("rewind past int4", lambda s: s.rewind_session(SID, to_seq=2**31)),
    ("rewind malformed", lambda s: s.rewind_session(format_id("msg", new_uuid()), to_seq=0)),
    ("abort reason long", lambda s: s.abort_session(SID, "r" * 1001)),
    ("abort reason NUL", lambda s: s.abort_session(SID, "\x00")),
    ("resume interrupt id", lambda s: s.resume(SID, "i" * 129, {})),
    ("resume payload big", lambda s: s.resume(SID, "i", {"k": BIG})),
    ("resume author NUL", lambda s: s.resume(SID, "i", {}, author="\x00")),
    ("mark reason long", lambda s: s.mark_interrupted(SID, "r" * 1001)),
    ("clear malformed", lambda s: s.clear_interrupted("ses_")),
    ("erase path malformed", lambda s: s.erase_scope("acme//x")),
    ("erase path not a path", lambda s: s.erase_scope(7)),  # type: ignore[arg-type]
    ("erase dry run not a flag", lambda s: s.erase_scope(dry_run="yes")),  # type: ignore[arg-type]
    ("erasures path malformed", lambda s: s.list_erasures("acme/x/")),
    ("export path malformed", lambda s: _drain_export(s, "acme/%")),
    ("import not records", lambda s: s.import_scope("{}")),
    ("import no header", lambda s: s.import_scope([{"type": "session"}])),
    ("import empty", lambda s: s.import_scope([])),
    ("import newer version", lambda s: s.import_scope([{**HEADER, "version": 2}])),
    ("import into malformed", lambda s: s.import_scope([HEADER], into="acme/x//y")),
]

# Outside the bound scope (acme/x): refused before any SQL too.
OUTSIDE: list[tuple[str, Callable[[Store], Awaitable[Any]]]] = [
    ("erase above", lambda s: s.erase_scope("acme")),
    ("scope data above", lambda s: s.update_scope_data({"a": 1}, scope="acme")),
    ("erase beside", lambda s: s.erase_scope("acme/x0")),
    ("erase dry run beside", lambda s: s.erase_scope("acme/xy", dry_run=True)),
    ("erasures beside", lambda s: s.list_erasures("acme/y")),
    ("export other tenant", lambda s: _drain_export(s, "globex/x")),
    ("import root above", lambda s: s.import_scope([{**HEADER, "root": "acme"}])),
    ("import into beside", lambda s: s.import_scope([HEADER], into="acme/x-corp")),
]


async def _drain_export(store: Store, path: str) -> None:
    async for _ in store.export_scope(path):
        pass


def _forged(**changes: Any) -> Session:
    now = datetime.now(UTC)
    base = Session(id=SID, agent_id="a", scope="acme/x", created_at=now, updated_at=now)
    return base.model_copy(update=changes)


def _cursor(**changes: Any) -> SessionCursor:
    base = SessionCursor(updated_at=datetime.now(UTC), id=SID, listing="0" * 32)
    return base.model_copy(update=changes)


def _filter(**fields: Any) -> ListFilter:
    """A filter forged past its own validation: the store's boundary must refuse it."""
    return ListFilter.model_construct(**fields)


async def _drain(store: Store, flt: ListFilter) -> None:
    async for _ in store.iter_sessions(flt):
        pass


@pytest.mark.parametrize("case", OUTSIDE, ids=[label for label, _ in OUTSIDE])
async def test_a_scope_outside_is_refused_before_any_sql(
    case: tuple[str, Callable[[Store], Awaitable[Any]]],
) -> None:
    _, call = case
    engine = make_engine("postgresql://nobody@127.0.0.1:1/none", manual_transactions=True)
    try:
        with use_scope("acme/x"), pytest.raises(ScopeViolation):
            await call(Store(engine))
    finally:
        await engine.dispose()


@pytest.mark.parametrize("case", CALLS, ids=[label for label, _ in CALLS])
async def test_refused_before_any_sql(case: tuple[str, Callable[[Store], Awaitable[Any]]]) -> None:
    _, call = case
    engine = make_engine("postgresql://nobody@127.0.0.1:1/none", manual_transactions=True)
    try:
        with use_scope("acme/x"), pytest.raises(InvalidInput):
            await call(Store(engine))
    finally:
        await engine.dispose()
