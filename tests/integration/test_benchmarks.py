"""Each benchmark scenario runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

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
    assert [r["scenario"] for r in reports] == [
        "append",
        "listing",
        "resolve",
        "frameworks",
        "physical",
    ]
    for report in reports:
        assert report["invariants_ok"] is True
        assert report["postgres_version"]
        assert report["results"]
        for result in report["results"]:
            assert set(result) >= {"name", "cortex", "floor", "ratio"}
            assert result["cortex"]["ops"] > 0
            assert result["floor"]["ops"] > 0
            if report["scenario"] == "append":
                for side in (result["cortex"], result["floor"]):
                    tail = [side[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms")]
                    assert tail == sorted(tail)
                    assert tail[0] > 0
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_physical_reports_every_side_beside_the_physical_floor(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "physical.json"
    args = ["physical", "--quick", "--n", "48", "--concurrency", "2", "--dsn", server_url]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "physical"
    assert report["invariants_ok"] is True
    assert len(report["load_average"]) == 3
    lines = {r["name"]: r for r in report["results"]}
    groups = [r["group"] for r in report["results"]]
    assert groups == ["append"] * 3 + ["create"] + ["resolve"] * 2 + ["listing"] * 2
    for line in lines.values():
        assert {"physical", "same_sql", "cortex"} <= set(line["sides"])
        assert line["floor"] == line["sides"]["physical"]
        assert line["cortex"] == line["sides"]["cortex"]
        for side in line["sides"].values():
            assert side["ops"] > 0
        assert set(line["ratios"]) >= {"physical", "same_sql"}
        assert line["ratio"] == line["ratios"]["physical"]
        # The floor's own multiple of every other side: the ceiling of cortex's.
        assert set(line["ceilings"]) == set(line["sides"]) - {"cortex", "physical"}
        for side, ceiling in line["ceilings"].items():
            floor, other = line["sides"]["physical"], line["sides"][side]
            if line["kind"] == "latency":
                assert ceiling == pytest.approx(other["p50_ms"] / floor["p50_ms"])
            else:
                assert ceiling == pytest.approx(floor["ops_per_s"] / other["ops_per_s"])
        if line["group"] == "append":
            assert {"adk", "agents"} <= set(line["sides"])
        elif line["group"] == "listing":
            assert "adk" in line["sides"]
            assert line["absent"] == {"agents": "no listing"}
            assert line["kind"] == "latency"
            assert {"p50_x_physical", "p95_x_physical"} <= set(line["ratios"])
        else:
            assert not {"adk", "agents"} & set(line["sides"])
    assert "append, sequential (1 task, one session)" in lines
    assert "list one user's newest 100 (sequential calls)" in lines
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_memory_walks_every_session_and_message_in_a_child_process(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "memory.json"
    args = ["memory", "--n", "3000", "--dsn", server_url, "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "memory"
    assert report["invariants_ok"] is True
    walks = {r["walk"]: r for r in report["report"]}
    assert set(walks) == {"iter_sessions", "list_messages"}
    assert walks["iter_sessions"]["rows"] == walks["iter_sessions"]["distinct"] == 3000
    assert walks["list_messages"]["rows"] == walks["list_messages"]["distinct"] == 300
    for walk in walks.values():
        assert walk["peak_after_mib"] >= walk["peak_before_mib"] > 0
        assert walk["rss_samples_mib"]
        assert {"seconds", "growth_mib", "target_mib", "under_target"} <= set(walk)
    assert not out.with_suffix(".png").exists()  # a table, no chart


def test_retention_runs_once_over_its_subtree(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "retention.json"
    assert main(["retention", "--n", "2000", "--dsn", server_url, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "retention"
    assert report["invariants_ok"] is True
    steps = {r["step"]: r for r in report["report"]}
    assert steps["dry run"]["messages_removed"] == steps["run"]["messages_removed"] == 1700
    assert steps["second run"]["messages_removed"] == 0
    assert steps["appends during the run"]["count"] >= 1


def test_cpu_splits_each_call_into_client_and_server_time(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    assert main(["cpu", "--quick", "--n", "40", "--dsn", server_url, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "cpu"
    assert report["invariants_ok"] is True
    names = [line["name"] for line in report["results"]]
    assert names == [
        "append one message",
        "append one message, 600 KB of session state",
        "list a user's newest 20",
        "list a user's newest 100",
        "list a user's newest 20, each session holding 50 KB of state",
    ]
    # A server on this machine (the tests' is) has its backends' CPU read from /proc.
    local = (urlsplit(server_url).hostname or "localhost") in ("127.0.0.1", "localhost", "::1")
    for line in report["results"]:
        assert set(line["sides"]) == {"physical", "routine", "cortex"}
        for side in line["sides"].values():
            assert side["calls"] == 40
            assert side["wall_us"] > 0
            assert side["client_cpu_us"] > 0
            assert ("server_cpu_us" in side) == local
            if local:
                assert side["server_cpu_us"] > 0
                assert side["cpu_us"] == pytest.approx(
                    side["client_cpu_us"] + side["server_cpu_us"]
                )
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_indexes_measures_each_promise_and_puts_every_index_back(
    server_url: str, tmp_path: Path
) -> None:
    from benchmarks import indexes

    out = tmp_path / "indexes.json"
    args = ["indexes", "--quick", "--n", "20", "--concurrency", "4", "--dsn", server_url]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "indexes"
    assert report["invariants_ok"] is True  # counters equal rows, every index back as it was
    assert [line["name"] for line in report["results"]] == [v.name for v in indexes.VARIANTS]
    local = (urlsplit(server_url).hostname or "localhost") in ("127.0.0.1", "localhost", "::1")
    for line, variant in zip(report["results"], indexes.VARIANTS, strict=True):
        assert line["dropped"] == [*variant.indexes, *variant.triggers]
        assert line["built"] == [name for name, _ in variant.builds]
        assert len(line["rounds"]) == 2  # --quick
        for measured in line["rounds"]:
            assert measured["cortex_per_s"] > 0
            assert measured["physical_per_s"] > 0
            assert measured["ratio"] == pytest.approx(
                measured["cortex_per_s"] / measured["physical_per_s"]
            )
            assert ("cortex_cpu_us" in measured) == local
            assert measured["cortex_wal_bytes"] > 0
            assert measured["physical_wal_bytes"] > 0
        assert line["summary"]["ratio_min"] <= line["summary"]["ratio"]
        assert line["summary"]["ratio"] <= line["summary"]["ratio_max"]
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_indexes_refuses_a_variant_naming_no_index(
    server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import indexes

    ghost = indexes.Variant("no ghost index", "nothing", ("ix_sessions_ghost",))
    monkeypatch.setattr(indexes, "VARIANTS", (*indexes.VARIANTS, ghost))
    with pytest.raises(RuntimeError, match="ix_sessions_ghost"):
        main(["indexes", "--quick", "--n", "4", "--concurrency", "2", "--dsn", server_url])


def test_filters_measures_filtered_pages_beside_the_unfiltered_one(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "filters.json"
    args = ["filters", "--quick", "--n", "3000", "--dsn", server_url, "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "filters"
    assert report["invariants_ok"] is True  # the filtered listing and count found the seeded rows
    names = [r["name"] for r in report["results"]]
    assert names[0] == "page: tenant org0, no filter"
    assert "page: tenant org0, metadata 1 %" in names
    assert "count: tenant org0, metadata 1 %" in names
    for result in report["results"]:
        for side in (result["cortex"], result["floor"]):
            assert side["ops"] > 0
            assert side["p95_ms"] >= side["p50_ms"] > 0
    assert not out.with_suffix(".png").exists()  # a table, no chart


def test_lifecycle_exports_erases_and_imports_a_subtree(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "lifecycle.json"
    assert main(["lifecycle", "--n", "2000", "--dsn", server_url, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "lifecycle"
    assert report["invariants_ok"] is True
    steps = {r["step"]: r for r in report["results"]}
    assert set(steps) == {"export", "erase", "import"}
    assert steps["export"]["messages"] == steps["erase"]["messages"] == 2000
    assert steps["import"]["messages"] == 2000
    assert steps["import"]["identical"] is True
    assert steps["export"]["peak_after_mib"] >= steps["export"]["peak_before_mib"] > 0
    assert steps["erase"]["probe"]["calls"] > 0
    assert steps["erase"]["probe_failures"] == []
    assert {"longest_wait_ms", "waits_seen"} <= set(steps["erase"]["locks"])
    assert not out.with_suffix(".png").exists()  # a table, no chart


def test_telemetry_measures_every_side_in_the_loop_and_in_process(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "telemetry.json"
    args = ["telemetry", "--quick", "--n", "50", "--dsn", server_url, "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "telemetry"
    assert report["invariants_ok"] is True
    sides = [r["side"] for r in report["results"]]
    loop = ["base", "off", "metrics", "spans + metrics"]
    assert sides == [*loop, *(f"in process: {s}" for s in loop)]
    for result in report["results"]:
        assert result.get("median_us_per_call", result.get("cpu_ns_per_call", 0)) > 0


def test_server_sets_http_calls_beside_the_store(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "server.json"
    args = ["server", "--quick", "--n", "40", "--concurrency", "2", "--dsn", server_url]
    assert main([*args, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "server"
    assert report["invariants_ok"] is True  # every counter equals its rows after the appends
    assert [line["name"] for line in report["results"]] == [
        "append one message, 2 workers",
        "a page of 50 sessions, one call at a time",
        "a page of 50 sessions, 2 workers",
        "a page of 100 messages, one call at a time",
        "a page of 100 messages, 2 workers",
    ]
    for line in report["results"]:
        for side in (line["http"], line["store"]):
            assert side["ops"] > 0
            assert side["p99_ms"] >= side["p50_ms"] > 0
        if line["kind"] == "throughput":
            assert line["ratio"] == pytest.approx(
                line["http"]["ops_per_s"] / line["store"]["ops_per_s"]
            )
        else:
            assert line["ratio"] == pytest.approx(line["http"]["p50_ms"] / line["store"]["p50_ms"])
        assert line["meets_target"] in (True, False)
        assert line["server_cpu_us_per_call"] >= 0


def test_console_measures_pages_of_waiting_sessions_across_tenants(
    server_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "console.json"
    args = ["console", "--quick", "--n", "3000", "--dsn", server_url, "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["scenario"] == "console"
    assert report["invariants_ok"] is True  # no page longer than asked
    names = [r["name"] for r in report["results"]]
    assert names[0] == "every tenant, paused, first page"
    for result in report["results"]:
        assert result["p95_ms"] >= result["p50_ms"] > 0
        assert 0 < result["rows"] <= 50 or result["name"].startswith("project")
    assert not out.with_suffix(".png").exists()  # a table, no chart
