"""``cortex serve --demo``: the embedded server with a demo database for the operator console.

The database is the demo's (``cortex_demo``, recreated on each run): the
server acts as the plain application role, the console reads as the
embedded superuser (which may ``SET ROLE cortex_console``). Two tenants
get sessions waiting on a human, with questions whose response schemas
show what the console's answer forms do.
"""

from __future__ import annotations

from typing import Any, Final

import anyio.to_thread

import cortex
from cortex import NewMessage, RequestedInput, use_scope
from cortex.demo import _grant, _prepare_embedded
from cortex.migrate import upgrade

__all__ = ["prepare_console_demo"]

_REFUND: Final = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean", "description": "pay the refund"},
        "amount": {"type": "integer", "minimum": 0, "exclusiveMaximum": 500},
        "note": {"type": "string", "maxLength": 200},
    },
    "required": ["approved", "amount"],
}
_ROUTE: Final = {
    "type": "object",
    "properties": {
        "team": {"enum": ["billing", "support", "sales"]},
        "priority": {
            "oneOf": [{"const": 1, "title": "high"}, {"const": 2, "title": "normal"}],
        },
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}},
    },
    "required": ["team"],
}


def _ask(interrupt_id: str, text: str, question: str, schema: Any, payload: Any) -> NewMessage:
    return NewMessage(
        "assistant",
        text,
        requested_input=RequestedInput(
            interrupt_id=interrupt_id, message=question, response_schema=schema, payload=payload
        ),
    )


async def _seed(app_url: str) -> None:
    async with cortex.connect(app_url) as store:
        for i, (scope, title) in enumerate(
            [
                ("acme/support/user-1", "Refund for order 1042"),
                ("acme/billing/user-7", "Duplicate charge"),
                ("globex/sales/user-9", "Route a lead"),
                ("globex/support/user-3", "Refund for order 77"),
            ]
        ):
            with use_scope(scope):
                s = await store.create_session("support-bot", title=title)
                await store.append_messages(
                    s.id, [NewMessage("user", f"{title}: can you help?", author="customer")]
                )
                if "Route" in title:
                    ask = _ask(
                        "route-lead",
                        "Which team takes this lead?",
                        "Route this lead to a team",
                        _ROUTE,
                        {"lead": "Initech", "value": 12000},
                    )
                else:
                    ask = _ask(
                        "approve-refund",
                        "A refund needs a human.",
                        f"Approve a refund of ${40 * (i + 1)}?",
                        _REFUND,
                        {"order": 1000 + i, "amount": 40 * (i + 1)},
                    )
                await store.append_messages(s.id, [ask])


async def prepare_console_demo(server_url: str) -> tuple[str, str]:
    """Recreate, migrate and fill the demo database; return (console URL, application URL)."""
    owner_url, app_url = await _prepare_embedded(server_url)
    await anyio.to_thread.run_sync(upgrade, owner_url)
    await _grant(owner_url)
    await _seed(app_url)
    return owner_url, app_url
