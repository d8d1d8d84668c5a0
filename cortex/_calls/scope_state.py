"""A scope's state document written directly: JSON merge patch (RFC 7386) or replacement.

Plain ``async def`` functions taking ``(conn, scope, ...)``; they never
commit. The merge runs in Python on the document read under its row lock,
so concurrent patches to one scope apply one after the other, each on the
other's result.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from cortex._calls.constraints import Writing, refusals
from cortex._calls.rows import decode_data, split_reserved
from cortex._db.executor import Tx
from cortex._sql import scope_state as sql
from cortex._sql.params import NEW_DATA, SCOPE_TENANT, TARGET_SCOPE
from cortex._sql.tables import SCOPE_DATA_SIZE
from cortex.errors import InvalidInput
from cortex.models import encode_data
from cortex.scope import Scope

__all__ = ["merge_patch", "update_document"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target``; null removes a key, objects merge, the rest replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


async def update_document(
    conn: Tx, scope: Scope, target: Scope, patch: dict[str, Any], *, replace: bool
) -> dict[str, Any]:
    """Merge ``patch`` into the document at ``target`` (or replace it); return it as read after.

    Keys beginning RESERVED_DATA_PREFIX (cortex's adapters' own) are kept
    as they are, whatever the patch.

    Raises:
        InvalidInput: the document would be larger than MAX_DATA_BYTES as
            stored (nothing is written).
    """
    params = {SCOPE_TENANT: scope.tenant, TARGET_SCOPE: str(target)}
    stored = (await conn.execute(sql.lock_document_statement(), params)).one()["data"]
    visible, reserved = split_reserved(decode_data(stored))
    document = dict(patch) if replace else merge_patch(visible, patch)
    try:
        encoded = encode_data({**document, **reserved})
    except ValueError as exc:
        raise InvalidInput(f"patch: the document would break a limit: {exc}") from None
    text = orjson.dumps(encoded).decode()
    with refusals(Writing(scope, session_id=uuid.UUID(int=0)), [SCOPE_DATA_SIZE]):
        await conn.execute(sql.write_document_statement(), {**params, NEW_DATA: text})
    return dict(document)
