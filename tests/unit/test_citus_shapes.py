"""Every statement shape cortex compiles stays inside what Citus routes to one shard.

On a Citus coordinator each cortex statement must be a single-tenant router
query (docs/citus.md). Citus refuses some constructs outright; this walks
every cached statement builder in cortex._sql.sessions, cortex._sql.messages
and cortex._sql.operator, with every argument it can be called with (every listing
filter shape included), compiles each statement for PostgreSQL and refuses:

- a subquery inside ``INSERT ... VALUES`` ("subqueries are not supported
  within INSERT queries");
- a VOLATILE function (``clock_timestamp()`` and friends): Citus refuses them
  in UPDATE and DELETE on distributed tables, and cortex uses none anywhere;
- an outer join on a constant (``LEFT JOIN LATERAL ... ON true``): Citus
  refuses pseudoconstant quals in outer joins on PostgreSQL 15 and 16;
- on a distributed database, the ``SECURITY DEFINER`` search function (a
  function that reads a distributed table cannot run inside a routed query);
- a statement on a cortex table without an equality on ``tenant_id``, or
  with the tenant bound by two parameters (it would fan out to every shard).

It needs no database, so plain CI catches a regression before a cluster does.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cortex._sql import messages, operator, sessions
from cortex._sql.predicates import FilterShape
from cortex.models import SessionState

# Functions PostgreSQL marks VOLATILE that a statement could plausibly call.
_VOLATILE = (
    "clock_timestamp",
    "timeofday",
    "random",
    "gen_random_uuid",
    "uuid_generate",
    "nextval",
    "setval",
    "txid_current",
)
_TABLES = ("sessions", "messages", "pending_inputs", "session_markers")

_SHAPES = [
    FilterShape(depth, exact, agent, default_only, search, state, distributed)
    for depth, exact, agent, default_only, search, state, distributed in itertools.product(
        (1, 2, 3, 4),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
        (None, *SessionState),
        (False, True),
    )
]

# What each builder parameter ranges over, by name.
_DOMAINS: dict[str, tuple[Any, ...]] = {
    "depth": (1, 2, 3, 4),
    "for_update": (False, True),
    "cursor": (False, True),
    "offset": (False, True),
    "caller_chosen_id": (False, True),
    "count": (1, 2, 5),
    "newest_first": (False, True),
    "since": (False, True),
    "with_data": (False, True),
    "single": (False, True),
    "expected": (False, True),
    "distributed": (False, True),
    "shape": tuple(_SHAPES),
}


def _builders() -> list[tuple[str, Callable[..., Any]]]:
    found = []
    for module in (sessions, messages, operator):
        for name, obj in sorted(vars(module).items()):
            if name.endswith(("_statement", "_statements")) and hasattr(obj, "cache_info"):
                found.append((f"{module.__name__}.{name}", obj))
    return found


def _calls(builder: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    params = list(inspect.signature(builder).parameters)
    for values in itertools.product(*(_DOMAINS[p] for p in params)):
        built = builder(**dict(zip(params, values, strict=True)))
        label = ", ".join(f"{p}={v!r}" for p, v in zip(params, values, strict=True))
        for i, stmt in enumerate(built if isinstance(built, tuple) else (built,)):
            yield f"({label})[{i}]", stmt


_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _sql(stmt: sa.ClauseElement) -> str:
    return " ".join(str(stmt.compile(dialect=_DIALECT)).split())


def _distributed(label: str) -> bool:
    return "distributed=True" in label


def refusals(sql: str, *, distributed: bool) -> list[str]:
    """What Citus would refuse (or fan out) in one compiled statement."""
    problems = []
    values = re.search(r"\bVALUES \((.*?)\)(?: ON CONFLICT| RETURNING|$)", sql)
    if values and re.search(r"\b(SELECT|EXISTS)\b", values.group(1)):
        problems.append("a subquery inside INSERT ... VALUES")
    returning = re.search(r"^INSERT\b.*?\bRETURNING\b(.*)$", sql)
    if distributed and returning and re.search(r"\bSELECT\b", returning.group(1)):
        problems.append("a subquery inside INSERT ... RETURNING")
    for name in _VOLATILE:
        if re.search(rf"\b{name}\w*\(", sql):
            problems.append(f"the VOLATILE function {name}()")
    if distributed and "cortex_search_ids" in sql:
        problems.append("the SECURITY DEFINER search function inside a routed query")
    if re.search(r"\bLEFT OUTER JOIN\b.*\bON (true|1 = 1)\b", sql):
        # "Distributed queries with outer joins and pseudoconstant quals are
        # not supported in PG15 and PG16."
        problems.append("an outer join ON a constant")
    tenant_params = set(re.findall(r"tenant_id = %\((\w+)\)s", sql))
    if len(tenant_params) > 1:
        # Equal at run time, but Citus prunes shards per parameter when it
        # plans: two of them make it plan for every shard.
        problems.append(f"the tenant bound by {len(tenant_params)} parameters")
    for table in _TABLES:
        # A row inserted with its tenant_id routes by that value; any other
        # reference needs an equality on the distribution column.
        inserted = re.search(rf"\bINSERT INTO {table} \([^)]*\btenant_id\b", sql)
        read = re.search(rf"\b(FROM|UPDATE|JOIN) {table}\b", sql)
        if (inserted or read) and not inserted and "tenant_id = " not in sql:
            problems.append(f"no tenant_id equality on {table}")
    return problems


def test_the_walk_finds_every_builder() -> None:
    names = {name.rsplit(".", 1)[1] for name, _ in _builders()}
    # A rename must not let a builder slip out of the walk unnoticed.
    assert {
        "insert_statement",
        "update_statement",
        "page_statement",
        "count_statement",
        "append_statement",
        "record_statement",
        "interrupt_statements",
        "switch_statements",
    } <= names
    assert len(names) >= 25


@pytest.mark.parametrize(("name", "builder"), _builders(), ids=[name for name, _ in _builders()])
def test_no_statement_shape_uses_what_citus_refuses(name: str, builder: Callable[..., Any]) -> None:
    bad = {}
    for label, stmt in _calls(builder):
        problems = refusals(_sql(stmt), distributed=_distributed(label))
        if problems:
            bad[label] = problems
    assert not bad, f"{name}: {dict(itertools.islice(bad.items(), 3))}"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("INSERT INTO sessions (a) VALUES (EXISTS (SELECT 1)) RETURNING sessions.id", "subquery"),
        ("UPDATE sessions SET updated_at=clock_timestamp() WHERE tenant_id = $1", "VOLATILE"),
        ("SELECT 1 FROM sessions WHERE id IN (SELECT cortex_search_ids($1))", "SECURITY"),
        ("SELECT 1 FROM messages WHERE id = $1", "tenant_id"),
        ("SELECT 1 FROM sessions LEFT OUTER JOIN LATERAL (SELECT 1) AS r ON true", "outer join"),
        ("INSERT INTO sessions (tenant_id) VALUES (%(t)s) RETURNING (SELECT 1)", "RETURNING"),
        ("UPDATE sessions SET x=1 WHERE tenant_id = %(a)s AND tenant_id = %(b)s", "parameters"),
    ],
)
def test_the_check_catches_each_construct(sql: str, expected: str) -> None:
    assert any(expected in problem for problem in refusals(sql, distributed=True))
