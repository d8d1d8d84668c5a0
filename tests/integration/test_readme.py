"""The README's quick start runs as written (against the test database)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import Database

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quick_start_runs(database: Database, tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    code = block.group(1).replace("postgresql://app_service@db.example/app", database.app_url)
    # The last line demonstrates the error: make it assert that instead of dying.
    code, replaced = re.subn(
        r"( +)await store\.get_session\(session\.id\) +# raises cortex\.NotFound.*",
        r"\1try:\n\1    await store.get_session(session.id)\n"
        r"\1except cortex.NotFound:\n\1    print('isolated')",
        code,
    )
    assert replaced == 1
    script = tmp_path / "quick_start.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["2 Let me check.", "isolated"]
