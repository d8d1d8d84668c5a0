"""What an adapter's stored payload says about tools, read without the frameworks.

The adapters store each framework turn whole as a message's payload: an ADK
``Event`` (``cortex.integrations.adk``) or an Agents SDK item
(``cortex.integrations.openai_agents``). A tool call's message has no text
of its own, and an ADK answer's body is only in its event, so the command
line reads the tool's name and its arguments or answer from here. Plain
dicts only: neither framework is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ToolUse", "tool_uses"]


@dataclass(frozen=True)
class ToolUse:
    """One tool call or one tool answer a payload holds."""

    kind: Literal["call", "answer"]
    # The tool's name; "" when the payload does not say (an Agents SDK output).
    name: str
    # The call's id, which its answer repeats; "" when there is none.
    call_id: str
    # The arguments of a call, the result of an answer: any JSON value.
    body: Any


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _adk_parts(parts: list[Any]) -> list[ToolUse]:
    """The function calls and responses among an ADK event's content parts."""
    out = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        call, answer = part.get("function_call"), part.get("function_response")
        if isinstance(call, dict):
            out.append(
                ToolUse(
                    "call", _text(call.get("name")), _text(call.get("id")), call.get("args", {})
                )
            )
        if isinstance(answer, dict):
            out.append(
                ToolUse(
                    "answer",
                    _text(answer.get("name")),
                    _text(answer.get("id")),
                    answer.get("response", {}),
                )
            )
    return out


def _agents_item(item: dict[str, Any]) -> list[ToolUse]:
    """An Agents SDK call item (``function_call``, ``custom_tool_call``, ``*_call``) or its output."""
    kind = _text(item.get("type"))
    call_id = _text(item.get("call_id")) or _text(item.get("id"))
    if kind.endswith("_call_output"):
        return [ToolUse("answer", _text(item.get("name")), call_id, item.get("output"))]
    if kind.endswith("_call"):
        # A built-in tool's call (web_search_call) names no tool: its type does.
        name = _text(item.get("name")) or kind.removesuffix("_call")
        body = item.get("arguments", item.get("input", item.get("action")))
        return [ToolUse("call", name, call_id, body)]
    return []


def tool_uses(payload: Any) -> list[ToolUse]:
    """The tool calls and answers in a stored payload, in order; [] for any other payload."""
    if not isinstance(payload, dict):
        return []
    content = payload.get("content")
    if isinstance(content, dict) and isinstance(content.get("parts"), list):
        return _adk_parts(content["parts"])
    if "type" in payload:
        return _agents_item(payload)
    return []
