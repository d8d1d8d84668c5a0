"""The statements that write a scope's state document directly (not through a session).

``Store.update_scope_data`` reads the document under its row lock, merges in
Python and writes it back: two statements in one transaction. Both name the
tenant by ``scope_tenant``, so row-level security and Citus routing apply as
to every other statement on ``scope_data``.
"""

from __future__ import annotations

from functools import cache

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from cortex._sql.params import NEW_DATA, TARGET_SCOPE, scope_tenant_param, text_param
from cortex._sql.tables import scope_data

__all__ = ["lock_document_statement", "write_document_statement"]


@cache
def lock_document_statement() -> sa.Insert:
    """The document at ``target_scope``, row-locked, created empty if there is none.

    ON CONFLICT DO UPDATE locks an existing row (and waits for a writer
    holding it) where a plain SELECT ... FOR UPDATE could not lock a row
    that does not exist yet: two first writers to one scope serialise too.
    """
    stmt = pg_insert(scope_data).values(
        tenant_id=scope_tenant_param(),
        scope=text_param(TARGET_SCOPE),
        data=sa.text("'{}'::jsonb"),
        updated_at=sa.func.statement_timestamp(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[scope_data.c.tenant_id, scope_data.c.scope],
        set_={"data": scope_data.c.data},
    ).returning(sa.cast(scope_data.c.data, sa.Text()).label("data"))


@cache
def write_document_statement() -> sa.Update:
    """Replace the document at ``target_scope`` (locked by :func:`lock_document_statement`)."""
    return (
        sa.update(scope_data)
        .where(
            scope_data.c.tenant_id == scope_tenant_param(),
            scope_data.c.scope == text_param(TARGET_SCOPE),
        )
        .values(
            data=sa.cast(text_param(NEW_DATA), JSONB()),
            updated_at=sa.func.greatest(scope_data.c.updated_at, sa.func.statement_timestamp()),
        )
    )
