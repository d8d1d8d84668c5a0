"""Export and import a scope: one snapshot out, exactly the same rows back in, or nothing.

Every call runs as the plain application role (row-level security applies);
the owner's connection compares what is really stored, column by column.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import cortex
from cortex import Conflict, InvalidInput, NewMessage, ScopeViolation, use_scope
from cortex._calls import transfer
from tests.lifecycle import populate, stored

pytestmark = pytest.mark.citus


async def _export(store: cortex.Store, path: str | None = None) -> list[dict[str, Any]]:
    return [record async for record in store.export_scope(path)]


def _types(records: list[dict[str, Any]]) -> list[str]:
    return [r["type"] for r in records]


async def test_export_then_erase_then_import_is_the_identity(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    written = await populate(store, root, sessions=4)
    with use_scope(f"{tenant}/u10"):
        beside = await store.create_session("bot")
    before = await stored(owner_conn, tenant, root)
    with use_scope(root):
        records = await _export(store)
    header, end = records[0], records[-1]
    assert header["type"] == "header"
    assert header["root"] == root
    assert header["version"] == 1
    assert (header["sessions"], header["messages"]) == (4, written["messages"])
    assert end == {
        "type": "end",
        "scope_documents": len(before["scope_data"]),
        "sessions": 4,
        "messages": written["messages"],
        "pending_inputs": len(before["pending_inputs"]),
        "markers": len(before["session_markers"]),
    }
    # JSON Lines: each record survives a trip through JSON text.
    lines = [json.dumps(r) for r in records]
    with use_scope(root):
        await store.erase_scope()
    assert all(rows == [] for rows in (await stored(owner_conn, tenant, root)).values())
    with use_scope(root):
        report = await store.import_scope(json.loads(line) for line in lines)
    assert (report.sessions, report.messages, report.unchanged) == (4, written["messages"], 0)
    assert await stored(owner_conn, tenant, root) == before
    # The state the store serves is back too: merged documents, states, questions.
    with use_scope(root):
        sessions = {s.id: s for s in await store.list_sessions()}
        assert set(sessions) == set(written["sessions"])
        detail = await store.inspect_session(written["sessions"][0])
        assert [p.interrupt_id for p in detail.pending] == ["q2"]
        assert detail.interrupt_reason == "draining"
    with use_scope(f"{tenant}/u10"):
        assert (await store.get_session(beside.id)).id == beside.id


async def test_importing_twice_changes_nothing(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root)
    with use_scope(root):
        records = await _export(store)
        before = await stored(owner_conn, tenant, root)
        again = await store.import_scope(records)
        rows = sum(len(v) for v in before.values())
        assert again.unchanged == rows
        assert (again.sessions, again.messages, again.scope_documents) == (0, 0, 0)
        assert await stored(owner_conn, tenant, root) == before
        assert (await store.import_scope(records)).unchanged == rows


async def test_into_moves_the_subtree_and_keeps_ids(
    store: cortex.Store, tenant: str, other_tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    written = await populate(store, root)
    with use_scope(root):
        records = await _export(store)
    # Another tenant may take the same ids: ids are unique per tenant.
    with use_scope(f"{other_tenant}/team"):
        report = await store.import_scope(records, into=f"{other_tenant}/team/moved")
    assert str(report.scope) == f"{other_tenant}/team/moved"
    moved = await stored(owner_conn, other_tenant, f"{other_tenant}/team/moved")
    original = await stored(owner_conn, tenant, root)
    assert [r[1] for r in moved["sessions"]] == [r[1] for r in original["sessions"]]
    with use_scope(f"{other_tenant}/team/moved"):
        listed = {s.id: str(s.scope) for s in await store.list_sessions()}
    assert set(listed) == set(written["sessions"])
    assert all(path.startswith(f"{other_tenant}/team/moved") for path in listed.values())
    with use_scope(f"{other_tenant}/team/moved"):
        assert await store.get_scope_data() == {"plan": "pro", "shared": True}
    # The same tenant while the source still exists: the ids are taken.
    with use_scope(tenant), pytest.raises(Conflict):
        await store.import_scope(records, into=f"{tenant}/copy")
    assert (await stored(owner_conn, tenant, f"{tenant}/copy"))["sessions"] == []


async def test_an_import_that_conflicts_anywhere_writes_nothing(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root, sessions=4)
    with use_scope(root):
        records = await _export(store)
        await store.erase_scope()
    # The last session's id now holds another session, elsewhere in the tenant.
    last = next(r for r in reversed(records) if r["type"] == "session")
    with use_scope(f"{tenant}/u2"):
        await store.create_session("intruder", session_id=last["id"])
    with use_scope(root), pytest.raises(Conflict) as caught:
        await store.import_scope(records)
    assert "intruder" not in str(caught.value)  # nothing of what holds the id
    assert all(rows == [] for rows in (await stored(owner_conn, tenant, root)).values())
    # A message of the export changed: its id is stored with other content.
    with use_scope(root):
        fresh = await _export(store)
    with use_scope(f"{tenant}/u2"):
        (s,) = await store.list_sessions()
        await store.append_messages(s.id, [NewMessage("user", "mine")])
        mine = await _export(store)
    changed = copy.deepcopy(mine)
    for record in changed:
        if record["type"] == "message":
            record["content"] = "theirs"
    with use_scope(f"{tenant}/u2"), pytest.raises(Conflict):
        await store.import_scope(changed)
    assert fresh[1:-1] == []


async def test_a_default_or_key_taken_in_the_target_is_conflict(
    store: cortex.Store, tenant: str
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root, sessions=1)
    with use_scope(root):
        records = await _export(store)
        await store.erase_scope()
        await store.resolve_session("bot")  # a new default of (bot, root)
        with pytest.raises(Conflict, match="default"):
            await store.import_scope(records)
        await store.erase_scope()
        await store.resolve_session("bot", key="framework-key")
        without_default = [
            {**r, "is_default": False} if r["type"] == "session" else r for r in records
        ]
        with pytest.raises(Conflict, match="key"):
            await store.import_scope(without_default)


async def test_paths_outside_the_current_scope_are_refused(
    store: cortex.Store, tenant: str, other_tenant: str
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root, sessions=1)
    with use_scope(root):
        records = await _export(store)
    with use_scope(f"{tenant}/u1/x"):
        # The export's root is above the current scope.
        with pytest.raises(ScopeViolation):
            await store.import_scope(records)
        with pytest.raises(ScopeViolation):
            store.export_scope(root)
        with pytest.raises(ScopeViolation):
            store.export_scope(f"{tenant}/u10")
        with pytest.raises(ScopeViolation):
            await store.import_scope(records, into=f"{tenant}/u10")
        with pytest.raises(ScopeViolation):
            await store.import_scope(records, into=f"{other_tenant}/u1/x")
        with pytest.raises(InvalidInput):
            store.export_scope("a//b")
        with pytest.raises(InvalidInput):
            await store.import_scope(records, into="x/" * 8 + "x")


def _broken(records: list[dict[str, Any]], change: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    change(out)
    return out


def _first(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(r for r in records if r["type"] == kind)


_REMOTE = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}}


def _asks(records: list[dict[str, Any]], schema: Any) -> None:
    """The first question a message asks now carries ``schema``."""
    message = next(r for r in records if r["type"] == "message" and r["requested_input"])
    question = {**json.loads(message["requested_input"]), "response_schema": schema}
    message["requested_input"] = json.dumps(question)


def _pends(records: list[dict[str, Any]], schema: Any) -> None:
    pending = _first(records, "pending_input")
    pending["response_schema"] = pending["response_schema_json"] = json.dumps(schema)


def _session_metadata(records: list[dict[str, Any]], text: str) -> None:
    _first(records, "session").update(metadata=text, metadata_json=text)


# create_session refuses metadata over 64 KiB (a row of metadata_pairs per key).
_WIDE = json.dumps({f"k{i}": i for i in range(9_999)}, separators=(",", ":"))

BREAKS: list[tuple[str, Any]] = [
    ("no header", lambda r: r.pop(0)),
    ("no end", lambda r: r.pop()),
    ("a newer version", lambda r: r[0].update(version=2)),
    ("another format", lambda r: r[0].update(format="other")),
    ("unknown type", lambda r: r.insert(2, {"type": "gossip"})),
    ("unknown field", lambda r: _first(r, "session").update(extra=1)),
    ("missing field", lambda r: _first(r, "message").pop("content")),
    ("bad id", lambda r: _first(r, "session").update(id="ses_nope")),
    ("msg id as session", lambda r: _first(r, "message").update(id=_first(r, "session")["id"])),
    ("naive time", lambda r: _first(r, "session").update(created_at="2026-12-02T10:00:00")),
    ("bad JSON text", lambda r: _first(r, "message").update(metadata="{nope")),
    ("NUL", lambda r: _first(r, "message").update(content="a\x00b")),
    ("negative count", lambda r: _first(r, "session").update(message_count=-1)),
    ("count off", lambda r: _first(r, "session").update(message_count=99)),
    ("seq gap", lambda r: _first(r, "message").update(seq=7)),
    ("scope outside root", lambda r: _first(r, "session").update(scope="elsewhere/x")),
    ("scope beside root", lambda r: _first(r, "session").update(scope=r[0]["root"] + "0")),
    ("end counts off", lambda r: r[-1].update(messages=0)),
    ("after end", lambda r: r.append({"type": "end"})),
    ("marker kind", lambda r: _first(r, "marker").update(kind="paused")),
    ("out of order", lambda r: r.append(r.pop(1))),
    ("not a record", lambda r: r.insert(1, ["session"])),
    ("bool as int", lambda r: _first(r, "session").update(message_count=True)),
    ("JSON text too deep", lambda r: _first(r, "message").update(metadata="[" * 5000 + "]" * 5000)),
    ("metadata over 64 KiB", lambda r: _session_metadata(r, _WIDE)),
    ("metadata a list", lambda r: _session_metadata(r, "[1, 2]")),
    ("metadata a string", lambda r: _first(r, "session").update(metadata_json='"s"')),
    ("message metadata null", lambda r: _first(r, "message").update(metadata="null")),
    ("metadata NaN", lambda r: _first(r, "message").update(metadata='{"n": NaN}')),
    # An append refuses these response schemas (RequestedInput): an import does too.
    ("remote $ref asked", lambda r: _asks(r, _REMOTE)),
    ("schema not an object", lambda r: _asks(r, ["type", "object"])),
    ("lookaround pattern pending", lambda r: _pends(r, {"type": "string", "pattern": "(?=a)"})),
    ("remote $ref pending", lambda r: _pends(r, _REMOTE)),
]


@pytest.mark.anyio
async def test_metadata_near_the_limit_imports_as_exported(
    store: cortex.Store, tenant: str
) -> None:
    """Numbers jsonb prints in full (1e300 as 301 digits) count as the caller wrote them."""
    root = f"{tenant}/big"
    huge = {f"k{i}": 1e300 for i in range(250)}  # 3,391 bytes written; 77,141 printed by jsonb
    wide = {f"k{i}": 10**40 + i for i in range(1_200)}  # about 62 KiB
    with use_scope(root):
        made = [
            await store.create_session("bot", metadata=huge),
            await store.create_session("bot", metadata=wide),
        ]
        records = await _export(store)
        await store.erase_scope()
        await store.import_scope(records)
        assert [(await store.get_session(s.id)).metadata for s in made] == [huge, wide]
        # Rows a release before 20261201000009 wrote hold the jsonb form only,
        # which PostgreSQL prints with every digit.
        for record in records:
            if record["type"] == "session":
                printed = {
                    key: int(value) for key, value in json.loads(record["metadata_json"]).items()
                }
                record["metadata"], record["metadata_json"] = json.dumps(printed), None
        await store.erase_scope()
        assert (await store.import_scope(records)).sessions == 2


@pytest.mark.anyio
@pytest.mark.parametrize(("label", "change"), BREAKS, ids=[name for name, _ in BREAKS])
async def test_a_malformed_export_is_refused_and_nothing_is_written(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection, label: str, change: Any
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root, sessions=2)
    with use_scope(root):
        records = await _export(store)
        await store.erase_scope()
        with pytest.raises(InvalidInput):
            await store.import_scope(_broken(records, change))
    assert all(rows == [] for rows in (await stored(owner_conn, tenant, root)).values())


async def test_an_export_is_one_snapshot_while_writes_go_on(
    store: cortex.Store, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"{tenant}/u1"
    monkeypatch.setattr(transfer, "PAGE_SESSIONS", 4)
    monkeypatch.setattr(transfer, "PAGE_ROWS", 3)
    # Pages of sessions mixing runs of small ones, empty ones and ones longer than a page.
    sizes = [4, 0, 1, 1, 0, 7, 2, 3, 0, 1]
    with use_scope(root):
        made = [await store.create_session("bot") for _ in sizes]
        for s, size in zip(made, sizes, strict=True):
            if size:
                await store.append_messages(s.id, [NewMessage("user", str(i)) for i in range(size)])
        seen: list[dict[str, Any]] = []
        walk = store.export_scope()
        seen.append(await anext(walk))
        seen.append(await anext(walk))
        # Writes after the snapshot began: none of them is in the export.
        await store.append_messages(made[0].id, [NewMessage("user", "late")])
        await store.delete_session(made[1].id)
        await store.create_session("late")
        seen += [record async for record in walk]
    assert _types(seen).count("session") == len(sizes)
    assert _types(seen).count("message") == sum(sizes)
    assert all(r["content"] != "late" for r in seen if r["type"] == "message")
    counts = seen[-1]
    assert (counts["sessions"], counts["messages"]) == (len(sizes), sum(sizes))
    held = {r["id"]: r["message_count"] for r in seen if r["type"] == "session"}
    assert sorted(held.values()) == sorted(sizes)
    # Grouped by session, in seq order, each session's record first.
    current = None
    for record in seen:
        if record["type"] == "session":
            current, expected = record["id"], 1
        elif record["type"] == "message":
            assert record["session_id"] == current
            assert record["seq"] == expected
            expected += 1
    # And it imports back as it was (each session's messages all there).
    with use_scope(root):
        await store.erase_scope()
        assert (await store.import_scope(seen)).messages == sum(sizes)


async def _slow(records: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for record in records:
        await anyio.lowlevel.checkpoint()
        yield record


async def test_an_async_source_imports_too(
    store: cortex.Store, tenant: str, owner_conn: asyncpg.Connection
) -> None:
    root = f"{tenant}/u1"
    await populate(store, root, sessions=2)
    with use_scope(root):
        records = await _export(store)
        before = await stored(owner_conn, tenant, root)
        await store.erase_scope()
        await store.import_scope(_slow(records))
    assert await stored(owner_conn, tenant, root) == before
