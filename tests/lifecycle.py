"""A scope subtree holding one of everything a scope can hold, and its rows as stored.

Used by the erase and export/import tests: :func:`populate` writes it
through the store, :func:`stored` reads every row of it back as the owner
(past row-level security), column by column, so two states compare exactly.
"""

from __future__ import annotations

from typing import Any, Final

import asyncpg

import cortex
from cortex import FunctionResponse, NewMessage, RequestedInput, use_scope
from cortex.ids import format_id, new_uuid

__all__ = ["TABLES", "populate", "stored"]

# Each table a scope's data lives in, with the column its rows are ordered by.
TABLES: Final = {
    "sessions": "id",
    "messages": "id",
    "pending_inputs": "session_id, raised_seq, interrupt_id",
    "session_markers": "session_id, kind",
    "scope_data": "scope",
}


def _ask(interrupt_id: str) -> NewMessage:
    return NewMessage(
        "assistant",
        f"asking {interrupt_id}",
        author="agent",
        requested_input=RequestedInput(
            interrupt_id=interrupt_id,
            message=f"Approve {interrupt_id}?",
            response_schema={"type": "object"},
            payload={"ticket": interrupt_id, "amount": 1.50},
        ),
    )


async def populate(store: cortex.Store, root: str, *, sessions: int = 3) -> dict[str, Any]:
    """Write a subtree at ``root``: sessions at several depths, every kind of row.

    Returns the ids written: ``sessions`` (all), ``parked`` (an id with only
    a marker), ``messages`` (how many in all).
    """
    ids: list[str] = []
    messages = 0
    with use_scope(root):
        top = await store.create_session(
            "bot",
            title="top \u202e title",
            metadata={"n": 1, "nested": {"a": [1, 2.5, None]}},
            is_default=True,
            key="framework-key",
            data={"turn": 1},
            scope_data={root: {"plan": "pro"}},
        )
        ids.append(top.id)
        stored = await store.append_messages(
            top.id,
            [
                NewMessage("user", "hello", metadata={"k": "v"}, payload={"event": [1, {"x": 1}]}),
                _ask("q1"),
                _ask("q2"),
            ],
            data={"turn": 2},
        )
        messages += len(stored)
        await store.append_messages(
            top.id,
            [NewMessage("user", function_response=FunctionResponse(id="q1", response={"ok": 1}))],
        )
        messages += 1
        await store.mark_interrupted(top.id, "draining")
        parked = format_id("ses", new_uuid())
        await store.mark_interrupted(parked, "parked before its session")
    for i in range(sessions - 1):
        path = f"{root}/user-{i}/thread" if i % 2 else f"{root}/user-{i}"
        with use_scope(path):
            s = await store.create_session(
                f"agent-{i}", scope_data={path: {"i": i}, root: {"shared": True}}
            )
            ids.append(s.id)
            batch = [NewMessage("user" if j % 2 else "assistant", f"m{j}") for j in range(5)]
            messages += len(await store.append_messages(s.id, batch))
            if i == 0:
                await store.abort_session(s.id, "withdrawn")
    return {"sessions": ids, "parked": parked, "messages": messages}


async def stored(
    owner: asyncpg.Connection, tenant: str, root: str
) -> dict[str, list[tuple[Any, ...]]]:
    """Every row at and beneath ``root`` in each table, all columns, as the owner reads them."""
    lo, hi = root + "/", root + "0"
    in_subtree = "(scope = $2 OR (scope >= $3 AND scope < $4))"
    sessions_in = f"SELECT id FROM sessions WHERE tenant_id = $1 AND {in_subtree}"
    where = {
        "sessions": in_subtree,
        "messages": f"session_id IN ({sessions_in})",
        "pending_inputs": f"session_id IN ({sessions_in})",
        "session_markers": in_subtree,
        "scope_data": in_subtree,
    }
    out = {}
    for table, order in TABLES.items():
        rows = await owner.fetch(
            f"SELECT * FROM {table} WHERE tenant_id = $1 AND ({where[table]})"
            f" AND $2 IS NOT NULL AND $3 IS NOT NULL AND $4 IS NOT NULL ORDER BY {order}",
            tenant,
            root,
            lo,
            hi,
        )
        out[table] = [tuple(r) for r in rows]
    return out
