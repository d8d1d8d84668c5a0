"""The private executor refuses what SQLAlchemy's own execution path refuses.

cortex runs compiled Core statements straight on asyncpg (cortex._db.executor);
these run it on a real connection as the application role.
"""

from __future__ import annotations

import asyncpg
import pytest
import sqlalchemy as sa

import cortex
from cortex import CortexError, NewMessage, RequestedInput, use_scope
from cortex._db.executor import StatementError, Tx, _compile
from cortex._sql.tables import sessions
from tests.conftest import Database

_BY_ID = sa.select(sessions.c.id).where(sessions.c.id == sa.bindparam("target_id"))


async def test_a_missing_parameter_is_refused_not_bound_as_null(
    app_conn: asyncpg.Connection,
) -> None:
    with pytest.raises(StatementError, match="a value is required for bind parameter"):
        await Tx(app_conn).execute(_BY_ID, {})


async def test_an_unknown_parameter_is_refused(app_conn: asyncpg.Connection) -> None:
    with pytest.raises(StatementError, match="unknown bind parameter"):
        await Tx(app_conn).execute(_BY_ID, {"target_id": None, "target_Id": 1})


def test_an_expanding_in_is_refused_at_compile_time() -> None:
    stmt = sa.select(sessions.c.id).where(
        sessions.c.agent_id.in_(sa.bindparam("ids", expanding=True))
    )
    with pytest.raises(StatementError, match="expanding"):
        _compile(stmt)


async def test_values_embedded_in_a_shape_are_bound(app_conn: asyncpg.Connection) -> None:
    stmt = sa.select(
        sa.literal("interrupted", sa.Text()).label("kind"), sa.bindparam("n", type_=sa.Integer())
    )
    row = (await Tx(app_conn).execute(stmt, {"n": 7})).one()
    assert tuple(row) == ("interrupted", 7)


async def test_one_row_expected_is_a_cortex_error(app_conn: asyncpg.Connection) -> None:
    result = await Tx(app_conn).execute(sa.select(sa.literal(1)).where(sa.false()))
    with pytest.raises(CortexError, match="expected one row, got 0"):
        result.one()


def test_the_statement_cache_is_bounded() -> None:
    assert _compile.cache_info().maxsize is not None


async def test_json_codecs_are_cortexs_own(database: Database, tenant: str) -> None:
    # A pool option that changes SQLAlchemy's JSON decoding must not change
    # what cortex reads: it executes on the driver with codecs it sets itself.
    async with cortex.connect(
        database.app_url, json_deserializer=lambda _: "not cortex's"
    ) as store:
        with use_scope(tenant):
            s = await store.create_session("bot")
            asked = NewMessage(
                "assistant",
                "ok?",
                requested_input=RequestedInput(interrupt_id="q", payload={"a": [1, 2.5]}),
            )
            await store.append_message(s.id, asked)
            (stored,) = await store.list_messages(s.id)
            assert stored.requested_input is not None
            assert stored.requested_input.payload == {"a": [1, 2.5]}
            detail = await store.inspect_session(s.id)
            assert detail.pending[0].payload == {"a": [1, 2.5]}
