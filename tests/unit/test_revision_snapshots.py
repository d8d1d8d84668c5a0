"""The revisions are snapshots: they import only frozen code, and frozen code never changes.

A revision (alembic/versions) or a module of cortex/_revision_helpers may
import the standard library, SQLAlchemy, Alembic, the versioned helper
modules and exception classes of cortex.errors: nothing else of cortex, so a
change to live code cannot change what a released revision does. Each
versioned helper's SHA-256 is pinned below.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from pathlib import Path
from typing import Final

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cortex import errors
from cortex._revision_helpers.backfill_v1 import is_valid
from cortex.errors import InvalidInput
from cortex.models import check_identifier
from cortex.scope import Scope

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "alembic" / "versions"
HELPERS = ROOT / "cortex" / "_revision_helpers"
HELPER_PACKAGE: Final = "cortex._revision_helpers"
VERSIONED: Final = re.compile(r"[a-z][a-z0-9_]*_v[1-9][0-9]*")

# Each released helper, frozen: a changed behaviour goes into a new _v2 module.
FROZEN: Final = {
    "backfill_v1.py": "6c4e5e08f166264936c0f24fc74cceb5eba04ee4bc8f58fd1626ad42c839ba15",
    "citus_v1.py": "252b57c811529bb619e090146f6543c835ef98ab94ac54fc8cea248f2f8a7605",
    "ddl_v1.py": "6af81cfd41d41d2b0073fb75d3ad38ee23599055825c497556717de81ada9b12",
    "progress_v1.py": "f63d9554aa6808f300d640e73dc96e2d1991d94014ae7b4b905644c22f654f6b",
}

_LIBRARIES: Final = frozenset({"sqlalchemy", "alembic"})
# rich only draws progress_v1's bar on a terminal: it never reaches the database.
_LIBRARIES_OF: Final = {"progress_v1.py": frozenset({"rich"})}
# Ways to import by name at run time, which the checks below could not follow.
_DYNAMIC: Final = frozenset({"__import__", "import_module", "run_module"})


def _is_helper(module: str) -> bool:
    package, _, name = module.rpartition(".")
    return package == HELPER_PACKAGE and VERSIONED.fullmatch(name) is not None


def _module_allowed(module: str, libraries: frozenset[str]) -> bool:
    top = module.split(".")[0]
    if top in {"importlib", "runpy"}:
        return False
    return top in sys.stdlib_module_names or top in libraries or _is_helper(module)


def _exception_class(name: str) -> bool:
    value = getattr(errors, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def refused_imports(source: str, libraries: frozenset[str] = _LIBRARIES) -> list[str]:
    """Each import in ``source`` that a snapshot may not make, as ``line N: ...``."""
    refused: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import cortex._revision_helpers.x` alone binds `cortex`, and all of it.
                bare_helper = _is_helper(alias.name) and alias.asname is None
                if bare_helper or not _module_allowed(alias.name, libraries):
                    refused.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [alias.name for alias in node.names]
            if node.level:
                ok = False
            elif module == "cortex.errors":
                ok = all(_exception_class(name) for name in names)
            elif module == HELPER_PACKAGE:
                ok = all(VERSIONED.fullmatch(name) for name in names)
            else:
                ok = _module_allowed(module, libraries)
            if not ok:
                dots = "." * node.level
                refused.append(f"line {node.lineno}: from {dots}{module} import {', '.join(names)}")
        elif isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in _DYNAMIC:
                refused.append(f"line {node.lineno}: {name}(...)")
    return refused


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.py"))


@pytest.mark.parametrize("path", _sources(VERSIONS), ids=lambda path: path.stem)
def test_a_revision_imports_only_frozen_code(path: Path) -> None:
    refused = refused_imports(path.read_text(encoding="utf-8"))
    assert not refused, (
        f"{path.name} imports live code; import a cortex._revision_helpers module "
        f"(add a _v2 one for a new behaviour): {refused}"
    )


@pytest.mark.parametrize("path", _sources(HELPERS), ids=lambda path: path.name)
def test_a_helper_imports_only_frozen_code(path: Path) -> None:
    libraries = _LIBRARIES | _LIBRARIES_OF.get(path.name, frozenset())
    refused = refused_imports(path.read_text(encoding="utf-8"), libraries)
    assert not refused, f"{path.name} imports live code; copy what it needs: {refused}"


def test_every_helper_is_versioned() -> None:
    loose = [
        path.name
        for path in _sources(HELPERS)
        if path.name != "__init__.py" and VERSIONED.fullmatch(path.stem) is None
    ]
    assert not loose, f"a helper module is named <name>_v<N>.py: {loose}"
    assert not [p for p in HELPERS.iterdir() if p.is_dir() and p.name != "__pycache__"]


@pytest.mark.parametrize("path", _sources(HELPERS), ids=lambda path: path.name)
def test_a_released_helper_is_frozen(path: Path) -> None:
    if path.name == "__init__.py":
        return
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.name in FROZEN, (
        f"{path.name} has no pinned digest: add {path.name!r}: {digest!r} to FROZEN"
    )
    assert FROZEN[path.name] == digest, (
        f"{path.name} changed: a released helper is frozen; add a _v2 module instead "
        "(and import it from new revisions only)"
    )


def test_every_pinned_helper_exists() -> None:
    missing = sorted(name for name in FROZEN if not (HELPERS / name).is_file())
    assert not missing, f"released helpers are gone (revisions may import them): {missing}"


@pytest.mark.parametrize(
    "line",
    [
        "import cortex.models",
        "import cortex",
        "from cortex import scope",
        "from cortex.scope import Scope",
        "from cortex.errors import sqlstate_of",
        "from cortex.errors import SchemaMismatch, translate",
        "from cortex.errors import *",
        "from . import ddl_v1",
        "from .ddl_v1 import run",
        "import cortex._revision_helpers.ddl_v1",
        "from cortex._revision_helpers import tools",
        "from cortex._revision_helpers.tools import run",
        "import rich",
        "import importlib",
        "def f():\n    from cortex.models import check_identifier",
        "class C:\n    def f(self):\n        import cortex._engine",
        "__import__('cortex.models')",
        "x = importlib.import_module('cortex.models')",
    ],
)
def test_the_check_refuses(line: str) -> None:
    assert refused_imports(line)


@pytest.mark.parametrize(
    "line",
    [
        "from __future__ import annotations",
        "import time",
        "from collections.abc import Sequence",
        "import sqlalchemy as sa",
        "from sqlalchemy.engine import Connection",
        "from alembic import context, op",
        "from cortex.errors import InvalidInput, SchemaMismatch",
        "from cortex._revision_helpers import ddl_v1 as ddl",
        "from cortex._revision_helpers import ddl_v1, citus_v2",
        "from cortex._revision_helpers.backfill_v1 import backfill",
        "import cortex._revision_helpers.ddl_v1 as ddl",
    ],
)
def test_the_check_allows(line: str) -> None:
    assert refused_imports(line) == []


def _api_accepts(agent_id: str, scope: str) -> bool:
    try:
        check_identifier(agent_id, "agent_id")
        Scope.parse(scope)
    except InvalidInput:
        return False
    return True


_SEGMENT_CHARACTERS = "aZ09._:-"
_KEYS = st.text(
    alphabet=st.sampled_from([*_SEGMENT_CHARACTERS, "/", " ", "\t", "\x00", "é", "\u200b"])
)


@settings(max_examples=400)
@given(agent_id=_KEYS | st.text(), scope=_KEYS | st.text())
@example(agent_id="a" * 128, scope="/".join(["s" * 64] * 8))
@example(agent_id="a" * 129, scope="/".join(["s"] * 9))
@example(agent_id="a", scope="s" * 65)
@example(agent_id="a", scope="a//b")
@example(agent_id="\ud800", scope="a")
@example(agent_id="a\u00a0b", scope="a")
def test_the_backfill_checks_keys_as_the_api_does(agent_id: str, scope: str) -> None:
    # A failure means the API's rules changed: the catch-up (`cortex db
    # backfill`) then needs a backfill_v2 with the new ones.
    assert is_valid(agent_id, scope) == _api_accepts(agent_id, scope)
