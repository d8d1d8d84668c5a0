"""Each benchmark scenario runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.__main__ import main

pytestmark = pytest.mark.slow


def test_every_scenario_runs_and_writes_json_and_chart(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(
        [
            "all",
            "--quick",
            "--n",
            "160",
            "--concurrency",
            "4",
            "--dsn",
            server_url,
            "--json",
            str(out),
        ]
    )
    assert code == 0
    reports = json.loads(out.read_text())
    assert [r["scenario"] for r in reports] == ["append", "listing", "resolve", "frameworks"]
    for report in reports:
        assert report["invariants_ok"] is True
        assert report["postgres_version"]
        assert report["results"]
        for result in report["results"]:
            assert set(result) >= {"name", "cortex", "floor", "ratio"}
            assert result["cortex"]["ops"] > 0
            assert result["floor"]["ops"] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
