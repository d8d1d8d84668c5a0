from __future__ import annotations

import inspect

import cortex


def test_all_is_sorted_and_complete() -> None:
    assert list(cortex.__all__) == sorted(cortex.__all__)
    for name in cortex.__all__:
        assert hasattr(cortex, name), name
    # Everything public that is not a submodule is in __all__.
    public = {
        n for n in dir(cortex) if not n.startswith("_") and not inspect.ismodule(getattr(cortex, n))
    }
    assert public - {"annotations"} <= set(cortex.__all__)


def test_error_tree() -> None:
    assert issubclass(cortex.NotFound, LookupError)
    assert issubclass(cortex.InvalidInput, ValueError)
    assert issubclass(cortex.InvalidScope, cortex.InvalidInput)
    assert issubclass(cortex.AlreadyAborted, cortex.Conflict)
    for name in cortex.__all__:
        obj = getattr(cortex, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, cortex.CortexError), name


def test_one_version_source() -> None:
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    # pyproject names no version of its own: hatch reads cortex/_version.py.
    assert "version" in project["dynamic"]
    assert "version" not in project
    assert cortex.__version__ == version("cortex-sessions")
