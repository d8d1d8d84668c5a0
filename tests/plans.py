"""Reading EXPLAIN (FORMAT JSON) output in tests: every node, Citus's remote plans included."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


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


def rows_read(plan: Any, relation: str) -> int:
    """Rows the plan's scans of ``relation`` read: returned plus filtered out, over all loops."""
    total = 0
    for scan in scans(plan, relation):
        kept = float(str(scan.get("Actual Rows", 0)))
        removed = float(str(scan.get("Rows Removed by Filter", 0)))
        total += int((kept + removed) * int(str(scan.get("Actual Loops", 1))))
    return total
