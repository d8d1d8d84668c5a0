"""Calls of the console's audit trail on the application side: record one action.

The body of one transaction bound to the caller's tenant; no commits. The
row's scope is the session's when the caller sees it, else the caller's own:
an action that met NotFound is recorded too, where the caller stands.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cortex._db.executor import Tx
from cortex._sql import console as sql
from cortex._sql.params import (
    ACTION,
    ACTION_ID,
    DETAIL,
    OUTCOME,
    SCOPE_PATH,
    SCOPE_TENANT,
    SESSION_ID,
    SUBJECT,
    TARGET_ID,
    target_id_param,
)
from cortex._sql.predicates import depth_class, scope_params, visible
from cortex._sql.tables import sessions
from cortex.ids import new_uuid
from cortex.scope import Scope

__all__ = ["record_action"]


def _scope_of_statement(depth: int) -> sa.Select[Any]:
    return sa.select(sessions.c.scope).where(visible(depth), sessions.c.id == target_id_param())


async def record_action(
    conn: Tx,
    scope: Scope,
    session_id: uuid.UUID | None,
    *,
    subject: str,
    action: str,
    outcome: str,
    detail: str,
) -> tuple[uuid.UUID, str, datetime]:
    """Insert one audit row; its id, the scope it was recorded in and its time."""
    where = str(scope)
    if session_id is not None:
        params = {**scope_params(scope), TARGET_ID: session_id}
        found = (await conn.execute(_scope_of_statement(depth_class(scope)), params)).all()
        if found:
            where = found[0][0]
    action_id = new_uuid()
    inserted = await conn.execute(
        sql.insert_action_statement(),
        {
            SCOPE_TENANT: scope.tenant,
            ACTION_ID: action_id,
            SCOPE_PATH: where,
            SESSION_ID: session_id,
            SUBJECT: subject,
            ACTION: action,
            OUTCOME: outcome,
            DETAIL: detail,
        },
    )
    at: datetime = inserted.all()[0][0]
    return action_id, where, at
