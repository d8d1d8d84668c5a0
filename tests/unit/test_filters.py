"""The listing predicate compiled to SQL text: no database needed."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cortex import ListFilter, Scope, SessionState
from cortex._sql.predicates import (
    depth_class,
    escape_like,
    filter_params,
    filter_shape,
    page,
    scope_params,
    session_predicate,
    subtree_clause,
)
from cortex._sql.tables import sessions

_PG = postgresql.asyncpg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated


def sql(clause: Any, params: dict[str, Any]) -> str:
    """Render with values; a bare clause is wrapped in a SELECT and its WHERE returned."""
    if not isinstance(clause, sa.Select):
        text = sql(sa.select(sessions.c.id).where(clause), params)
        return text.split("WHERE ", 1)[1]
    return str(clause.params(params).compile(dialect=_PG, compile_kwargs={"literal_binds": True}))


def test_depth_one_is_the_tenant() -> None:
    scope = Scope.parse("acme")
    assert sql(subtree_clause(1), scope_params(scope)) == "sessions.tenant_id = 'acme'"


def test_depth_two_uses_the_l2_column() -> None:
    text = sql(subtree_clause(2), scope_params(Scope.parse("acme/support")))
    assert "scope_l2 = 'acme/support'" in text
    assert "scope_depth >= 2" in text


def test_depth_three_uses_the_l3_column() -> None:
    scope = Scope.parse("acme/a/b")
    assert depth_class(scope) == 3
    text = sql(subtree_clause(depth_class(scope)), scope_params(scope))
    assert "scope_l3 = 'acme/a/b'" in text
    assert "scope_depth >= 3" in text


def test_deeper_is_a_whole_segment_range() -> None:
    scope = Scope.parse("acme/a/b/c")
    assert depth_class(scope) == depth_class(Scope.parse("acme/a/b/c/d/e/f/g")) == 4
    text = sql(subtree_clause(depth_class(scope)), scope_params(scope))
    assert "sessions.scope = 'acme/a/b/c'" in text
    assert "sessions.scope >= 'acme/a/b/c/'" in text
    assert "sessions.scope < 'acme/a/b/c0'" in text


def test_search_escapes_wildcards() -> None:
    assert escape_like("50%_/x\\") == "%50/%/_//x\\%"
    scope, flt = Scope.parse("acme/x"), ListFilter(search="50%_")
    text = sql(session_predicate(filter_shape(scope, flt)), filter_params(scope, flt))
    assert "sessions.title ILIKE '%50/%/_%' ESCAPE '/'" in text
    # Across a whole tenant: candidates from the search function, same escaped pattern.
    tenant = Scope.parse("acme")
    text = sql(session_predicate(filter_shape(tenant, flt)), filter_params(tenant, flt))
    assert "sessions.id IN (SELECT public.cortex_search_ids(CAST('%50/%/_%' AS TEXT))" in text
    assert "ILIKE" not in text


def test_every_option_adds_one_condition() -> None:
    scope = Scope.parse("acme/x")
    flt = ListFilter(agent_id="a1", exact=True, default_only=True)
    text = sql(session_predicate(filter_shape(scope, flt)), filter_params(scope, flt))
    assert "sessions.scope = 'acme/x'" in text
    assert "sessions.agent_id = 'a1'" in text
    assert "sessions.is_default" in text
    assert "scope_l2" not in text
    assert "ILIKE" not in text


def test_shape_not_values_keys_the_statement() -> None:
    a = filter_shape(Scope.parse("t1/x"), ListFilter(agent_id="a", search="q"))
    b = filter_shape(Scope.parse("t2/y"), ListFilter(agent_id="b", search="zz"))
    assert a == b
    assert filter_shape(Scope.parse("t1/x/y"), ListFilter()) != filter_shape(
        Scope.parse("t1/x"), ListFilter()
    )


def test_count_gets_no_pagination() -> None:
    scope, flt = Scope.parse("acme"), ListFilter(limit=5, offset=10)
    shape, params = filter_shape(scope, flt), filter_params(scope, flt)
    count = sa.select(sa.func.count()).select_from(sessions).where(session_predicate(shape))
    assert "LIMIT" not in sql(count, params)
    listing = page(sa.select(sessions.c.id).where(session_predicate(shape)), offset=True)
    text = sql(listing, {**params, "limit": 5, "offset": 10})
    assert "ORDER BY sessions.updated_at DESC, sessions.id DESC" in text
    assert "LIMIT 5 OFFSET 10" in text


def test_partial_index_predicates_are_constants() -> None:
    # Generic (prepared) plans can use a partial index only if its predicate
    # follows from constants in the statement, not from parameters.
    shape = filter_shape(Scope.parse("acme/x"), ListFilter(state=SessionState.PAUSED))
    text = str(sa.select(sessions.c.id).where(session_predicate(shape)).compile(dialect=_PG))
    assert "sessions.scope_depth >= 2" in text
    assert "sessions.state = 'paused'" in text


def test_metadata_is_one_equality_per_key_never_containment() -> None:
    scope = Scope.parse("acme")
    flt = ListFilter(metadata={"tags": [1, 2], "channel": "web"})
    shape, params = filter_shape(scope, flt), filter_params(scope, flt)
    assert shape.metadata == 2
    text = sql(session_predicate(shape), params)
    assert "@>" not in text
    # Keys in order, each compared as jsonb to its value's JSON text; the
    # verbatim column unless the row predates it.
    assert text.count("CASE WHEN (sessions.metadata_json IS NULL)") == 2
    assert (
        "THEN sessions.metadata -> 'channel' ELSE CAST(sessions.metadata_json -> 'channel' AS JSONB)"
        " END = CAST('\"web\"' AS JSONB)"
    ) in text
    assert "= CAST('[1,2]' AS JSONB)" in text
    assert text.index("'channel'") < text.index("'tags'")


def test_metadata_keys_and_values_are_binds_whatever_they_hold() -> None:
    scope = Scope.parse("acme")
    hostile = ListFilter(metadata={"'; DROP TABLE sessions; --": "') OR true --"})
    plain = ListFilter(metadata={"k": "v"})
    # The same shape, so the same statement: the values never reach its text.
    assert filter_shape(scope, hostile) == filter_shape(scope, plain)
    params = filter_params(scope, hostile)
    assert params["metadata_key_0"] == "'; DROP TABLE sessions; --"
    assert params["metadata_value_0"] == '"\') OR true --"'


def test_time_bounds_are_exclusive_and_only_those_given() -> None:
    from datetime import UTC, datetime

    scope, t = Scope.parse("acme"), datetime(2026, 1, 1, tzinfo=UTC)
    flt = ListFilter(created_after=t, updated_before=t)
    shape = filter_shape(scope, flt)
    assert (shape.created_after, shape.created_before) == (True, False)
    assert (shape.updated_after, shape.updated_before) == (False, True)
    text = str(sa.select(sessions.c.id).where(session_predicate(shape)).compile(dialect=_PG))
    assert "sessions.created_at > $2::TIMESTAMP WITH TIME ZONE" in text
    assert "sessions.updated_at < $3::TIMESTAMP WITH TIME ZONE" in text
    assert "$4" not in text
    params = filter_params(scope, flt)
    assert params["created_after"] == params["updated_before"] == t
    assert "created_before" not in params
    assert "updated_after" not in params


def test_no_metadata_or_time_filter_is_the_unfiltered_shape() -> None:
    scope = Scope.parse("acme/x")
    assert filter_shape(scope, ListFilter(metadata={})) == filter_shape(scope, ListFilter())
    assert filter_shape(scope, ListFilter(metadata=None)) == filter_shape(scope, ListFilter())


def test_an_hour_beyond_pythons_datetimes_is_clamped() -> None:
    """PostgreSQL holds times to the year 294276: past Python's, a window starts at its last day.

    A finite time below the hour, not ``datetime.max``: asyncpg sends that as
    ``infinity``, a start no row passes.
    """
    from datetime import UTC, datetime

    from cortex._sql.predicates import hour_of, hour_start

    now = datetime(2026, 12, 2, 17, 30, tzinfo=UTC)
    assert hour_start(hour_of(now)) == datetime(2026, 12, 2, 17, tzinfo=UTC)
    year_20000 = (20000 - 1970) * 8766
    assert hour_start(year_20000) == datetime(9999, 12, 31, tzinfo=UTC)
    assert hour_start(-year_20000) == datetime.min.replace(tzinfo=UTC)
