"""Reading EXPLAIN (FORMAT JSON) output in tests: every node, Citus's remote plans included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from cortex.models import ListFilter
from cortex.scope import Scope


def parsed(explained: Any) -> Any:
    """The plan asyncpg returned for ``EXPLAIN (FORMAT JSON)``: text or already decoded."""
    return json.loads(explained) if isinstance(explained, str) else explained


def nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every object in the plan, depth first: plan nodes, Citus jobs and tasks, remote plans."""
    if isinstance(plan, dict):
        yield plan
        for value in plan.values():
            yield from nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from nodes(item)


def scans(plan: Any, relation: str) -> list[dict[str, Any]]:
    """The scan nodes of ``relation``, or of a Citus shard of it (``relation_102008``)."""
    found = []
    for node in nodes(plan):
        name = str(node.get("Relation Name", ""))
        if name == relation or name.removeprefix(relation + "_").isdigit():
            found.append(node)
    return found


def rows_returned(node: dict[str, Any]) -> int:
    """Rows a plan node returned over all its loops.

    ``Actual Rows`` is per loop: an integer up to PostgreSQL 17, a number
    with two decimals (``1.00``) from PostgreSQL 18 on.
    """
    per_loop = float(str(node.get("Actual Rows", 0)))
    return round(per_loop * int(str(node.get("Actual Loops", 1))))


def rows_read(plan: Any, relation: str) -> int:
    """Rows the plan's scans of ``relation`` read: returned plus filtered out, over all loops."""
    total = 0
    for scan in scans(plan, relation):
        kept = float(str(scan.get("Actual Rows", 0)))
        removed = float(str(scan.get("Rows Removed by Filter", 0)))
        total += round((kept + removed) * int(str(scan.get("Actual Loops", 1))))
    return total


async def explain_page(
    app_conn: asyncpg.Connection, scope: Scope, flt: ListFilter
) -> tuple[list[asyncpg.Record], Any]:
    """A listing page's rows and its ``EXPLAIN (ANALYZE)`` plan, as the application role.

    Under the plan the store runs: on plain PostgreSQL the routines' generic
    plan (cortex._db.routines.ROUTINE_SETTINGS); on Citus the workers' own.
    """
    from cortex._db.executor import compile_statement
    from cortex._sql.predicates import filter_params, filter_shape
    from cortex._sql.sessions import page_statement
    from tests.conftest import CITUS_URL

    compiled = compile_statement(
        page_statement(filter_shape(scope, flt), cursor=False, offset=False)
    )
    values = {**filter_params(scope, flt), "limit": flt.page_size}
    args = [values[name] if name in values else compiled.fixed[name] for name in compiled.order]
    async with app_conn.transaction():
        await app_conn.execute(
            "SET LOCAL citus.propagate_set_commands = 'local';"
            f" SET LOCAL cortex.tenant = '{scope.tenant}'"
        )
        if CITUS_URL is None:
            await app_conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        rows = await app_conn.fetch(compiled.sql, *args)
        explained = await app_conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.sql, *args)
    return rows, parsed(explained)


async def explain_filtered_page(
    app_conn: asyncpg.Connection, scope: Scope, flt: ListFilter
) -> tuple[list[Any] | None, list[asyncpg.Record], Any]:
    """As :func:`explain_page`, after the metadata filter's first window of candidates, as the store reads it.

    Returns the candidates (None: too many, the page walks), the page's rows
    and its plan. The plan cache as the store's own statements leave it.
    """
    from cortex._db.executor import compile_statement
    from cortex._sql.params import METADATA_IDS, METADATA_SINCE
    from cortex._sql.predicates import (
        METADATA_CANDIDATES,
        filter_params,
        filter_shape,
        hour_start,
        metadata_candidate_params,
        metadata_candidates_statement,
        too_many_candidates,
        uses_metadata_candidates,
        with_candidates,
    )
    from cortex._sql.sessions import page_statement

    shape = filter_shape(scope, flt)
    values: dict[str, Any] = {**filter_params(scope, flt), "limit": flt.page_size}
    async with app_conn.transaction():
        await app_conn.execute(f"SET LOCAL cortex.tenant = '{scope.tenant}'")
        ids: list[Any] | None = None
        since = None
        if uses_metadata_candidates(shape):
            found = compile_statement(metadata_candidates_statement(shape.metadata, before=False))
            given = metadata_candidate_params(
                scope, flt, skip=flt.page_size - 1, cap=METADATA_CANDIDATES
            )
            row = await app_conn.fetchrow(
                found.sql, *(given[n] if n in given else found.fixed[n] for n in found.order)
            )
            assert row is not None
            since, ids = row["since_hour"], row["ids"] or []
            if too_many_candidates(len(ids), wanted=flt.page_size, cap=METADATA_CANDIDATES):
                ids = None
        if ids is not None:
            shape = with_candidates(shape, window=since is not None)
            values[METADATA_IDS] = ids
            if since is not None:
                values[METADATA_SINCE] = hour_start(since)
        compiled = compile_statement(page_statement(shape, cursor=False, offset=False))
        args = [values[n] if n in values else compiled.fixed[n] for n in compiled.order]
        rows = await app_conn.fetch(compiled.sql, *args)
        explained = await app_conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.sql, *args)
    return ids, rows, parsed(explained)
