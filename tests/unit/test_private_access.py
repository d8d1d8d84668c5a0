"""cortex reads no private attribute of another library and imports none of its private names.

A private name of SQLAlchemy or asyncpg can change in any release; cortex
uses only their public API, so one minor release cannot break it silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cortex

PACKAGE = Path(cortex.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


# ADK's own session services keep their stale-session check in this attribute
# of its Session, and offer no public one: cortex's ADK service takes part in it.
ALLOWED = {"_storage_update_marker"}


def _cortex_private_names(modules: list[tuple[Path, ast.Module]]) -> set[str]:
    """Every private name cortex defines: functions, classes, names, its own attributes, slots."""
    names: set[str] = set(ALLOWED)
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.arg):
                names.add(node.id if isinstance(node, ast.Name) else node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
            ):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                and isinstance(node.value, ast.Tuple | ast.List)
            ):
                names.update(
                    e.value
                    for e in node.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                )
    return {n for n in names if _private(n)}


def private_uses(modules: list[tuple[Path, ast.Module]]) -> list[str]:
    own = _cortex_private_names(modules)
    found: list[str] = []
    for path, tree in modules:
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{where}:{node.lineno}: .{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr", "setattr"}
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and node.args[1].value not in own
            ):
                found.append(f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] == "cortex":
                    continue
                parts = node.module.split(".") + [a.name for a in node.names]
                if any(_private(p) for p in parts):
                    found.append(f"{where}:{node.lineno}: from {node.module} import ...")
    return found


def test_no_private_attribute_of_another_library() -> None:
    assert private_uses(_modules()) == []


def test_the_check_finds_a_private_read() -> None:
    planted = ast.parse(
        "def f(pool):\n"
        "    return pool._pool._queue, getattr(pool, '_pre_ping', True)\n"
        "from sqlalchemy.util._concurrency_py3k import greenlet_spawn\n"
    )
    found = private_uses([(PACKAGE / "planted.py", planted)])
    assert len(found) == 4, found
