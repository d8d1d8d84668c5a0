"""The README's install line works from a built wheel, in a clean virtualenv.

The wheel is built from this checkout (hatchling, no network) and installed
without dependencies into a fresh venv; the dependencies come from the test
environment's site-packages through a plain path entry, which does not
process its ``.pth`` files, so the checkout's editable cortex stays out of
reach: ``import cortex`` can only find the wheel's.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cortex
from tests.conftest import current_at_head

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(*args: str, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_wheel_in_a_clean_venv(blank_db: str, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(ROOT), cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith(f"cortex_sessions-{cortex.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
    assert "Name: cortex-sessions\n" in headers
    assert f"Version: {cortex.__version__}\n" in headers
    assert "Provides-Extra: embedded\n" in headers
    assert "Provides-Extra: fastapi\n" in headers
    assert any(n.startswith("cortex/_alembic/versions/") for n in names)
    # The console's templates and stylesheet ship in the package: no build step.
    assert "cortex/server/templates/session.html" in names
    assert "cortex/server/static/console.css" in names

    venv = tmp_path / "clean"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel), cwd=tmp_path)  # fmt: skip
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                   cwd=tmp_path).strip()  # fmt: skip
    Path(purelib, "test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    where = _run(str(python), "-c", "import cortex; print(cortex.__file__)", cwd=tmp_path)
    assert where.strip().startswith(str(venv))
    version = _run(str(python), "-m", "cortex", "--version", cwd=tmp_path)
    assert version.strip() == f"cortex {cortex.__version__}"
    script = str(venv / "bin" / "cortex")
    _run(script, "--database-url", blank_db, "db", "upgrade", cwd=tmp_path)
    state = json.loads(
        _run(script, "db", "current", "--json", "--database-url", blank_db, cwd=tmp_path)
    )
    assert state == current_at_head()
