"""The listing predicate compiled to SQL text: no database needed."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cortex import ListFilter, Scope
from cortex._filters import page, session_predicate, subtree_clause
from cortex._tables import sessions

_PG = postgresql.asyncpg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated


def sql(clause: sa.ClauseElement) -> str:
    return str(clause.compile(dialect=_PG, compile_kwargs={"literal_binds": True}))


def test_depth_one_is_the_tenant() -> None:
    text = sql(subtree_clause(Scope.parse("acme")))
    assert text == "sessions.tenant_id = 'acme'"


def test_depth_two_uses_the_l2_column() -> None:
    text = sql(subtree_clause(Scope.parse("acme/support")))
    assert "scope_l2 = 'acme/support'" in text
    assert "scope_depth >= 2" in text


def test_deeper_is_a_whole_segment_range() -> None:
    text = sql(subtree_clause(Scope.parse("acme/a/b")))
    assert "sessions.scope = 'acme/a/b'" in text
    assert "sessions.scope >= 'acme/a/b/'" in text
    assert "sessions.scope < 'acme/a/b0'" in text


def test_search_escapes_wildcards() -> None:
    text = sql(session_predicate(Scope.parse("acme"), ListFilter(search="50%_\\x")))
    assert "ILIKE '%' || '50/%/_\\x' || '%' ESCAPE '/'" in text.replace("%%", "%")


def test_every_option_adds_one_condition() -> None:
    text = sql(
        session_predicate(
            Scope.parse("acme/x"), ListFilter(agent_id="a1", exact=True, default_only=True)
        )
    )
    assert "sessions.scope = 'acme/x'" in text
    assert "sessions.agent_id = 'a1'" in text
    assert "sessions.is_default" in text
    assert "scope_l2" not in text


def test_count_gets_no_pagination() -> None:
    flt = ListFilter(limit=5, offset=10)
    count = (
        sa.select(sa.func.count())
        .select_from(sessions)
        .where(session_predicate(Scope.parse("acme"), flt))
    )
    assert "LIMIT" not in sql(count)
    listing = page(
        sa.select(sessions.c.id).where(session_predicate(Scope.parse("acme"), flt)),
        limit=5,
        offset=10,
    )
    text = sql(listing)
    assert "ORDER BY sessions.updated_at DESC, sessions.id DESC" in text
    assert "LIMIT 5 OFFSET 10" in text
