"""Every public Store call is reported to the store's observer (telemetry sees them all)."""

from __future__ import annotations

import ast
import inspect

import cortex.store


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {d.id for d in node.decorator_list if isinstance(d, ast.Name)}


def test_every_public_store_method_is_observed() -> None:
    tree = ast.parse(inspect.getsource(cortex.store))
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    methods = [
        n
        for n in store.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    ]
    unobserved = [
        m.name
        for m in methods
        if "property" not in _decorator_names(m) and "observed" not in _decorator_names(m)
    ]
    assert len(methods) > 30
    assert unobserved == []
