"""The adapters' framework-free parts: scope segments, optional imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cortex import InvalidInput, Scope
from cortex.integrations._backing import segment


def test_plain_names_are_their_own_segment() -> None:
    for name in ("my_app", "user-42", "a.b:c", "x" * 64):
        assert segment(name) == name


def test_other_names_are_encoded_one_to_one() -> None:
    names = [
        "ada@example.com",
        "with space",
        "café",
        "b32.looks-encoded",
        "sha.looks-hashed",
        "a/b",
        "x" * 65,
        "y" * 500,
        "\u2028",
    ]
    segments = [segment(n) for n in names]
    assert len(set(segments)) == len(names)
    for s in segments:
        Scope("tenant", s)  # every one is a valid segment
    assert segment("b32.looks-encoded") != "b32.looks-encoded"
    assert segment("y" * 500).startswith("sha.")
    with pytest.raises(InvalidInput):
        segment("")
    for not_text in (5, None, b"app"):
        with pytest.raises(InvalidInput, match="must be a string"):
            segment(not_text)  # type: ignore[arg-type]


def test_import_cortex_needs_no_framework() -> None:
    code = (
        "import sys, cortex, cortex.integrations, cortex.integrations._backing;"
        "bad = [m for m in ('google.adk', 'agents') if m in sys.modules];"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_backing_refuses_what_is_neither_a_store_nor_a_url() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from cortex.integrations._backing import Backing

    engine = create_async_engine("postgresql+asyncpg://x@y/z")
    for wrong in (None, 5, b"postgresql://x@y/z", engine):
        with pytest.raises(InvalidInput, match="a Store or a database URL"):
            Backing(wrong, None)  # type: ignore[arg-type]
    for scope in (5, b"acme", ["acme"]):
        with pytest.raises(InvalidInput, match="scope"):
            Backing("postgresql://x@y/z", scope)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="database URL"):
        Backing("mysql://x@y/z", None)


def test_tool_uses_read_from_each_frameworks_payload() -> None:
    from cortex.integrations._payloads import ToolUse, tool_uses

    adk_event = {
        "author": "agent",
        "content": {
            "role": "model",
            "parts": [
                {"text": "Let me look."},
                {"function_call": {"id": "c1", "name": "lookup", "args": {"n": 1}}},
                {"function_response": {"id": "c0", "name": "ask", "response": {"ok": True}}},
            ],
        },
    }
    assert tool_uses(adk_event) == [
        ToolUse("call", "lookup", "c1", {"n": 1}),
        ToolUse("answer", "ask", "c0", {"ok": True}),
    ]
    call = {"type": "function_call", "call_id": "k", "name": "f", "arguments": '{"a": 1}'}
    assert tool_uses(call) == [ToolUse("call", "f", "k", '{"a": 1}')]
    output = {"type": "function_call_output", "call_id": "k", "output": "2"}
    assert tool_uses(output) == [ToolUse("answer", "", "k", "2")]
    search = {"type": "web_search_call", "id": "ws", "action": {"query": "q"}}
    assert tool_uses(search) == [ToolUse("call", "web_search", "ws", {"query": "q"})]
    # Anything else holds no tool use, however odd.
    for other in (
        None,
        [1],
        "text",
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": []},
        {"content": {"parts": [5, {"function_call": "not a dict"}]}},
    ):
        assert tool_uses(other) == []
