"""The PNG beside ``--json``: cortex/floor ratios and cortex's latencies, per scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt


def draw(reports: list[dict[str, Any]], png: Path) -> None:
    """One row per scenario: the ratio to the floor (left) and p50/p95 latency (right)."""
    sizes = [max(3, len(r["results"])) * (2 if r["scenario"] == "physical" else 1) for r in reports]
    fig, axes = plt.subplots(
        len(reports),
        2,
        figsize=(15, 1.2 * len(reports) + 0.3 * sum(sizes)),
        squeeze=False,
        gridspec_kw={"height_ratios": sizes},
    )
    for (ratio_ax, latency_ax), report in zip(axes, reports, strict=True):
        if report["scenario"] == "physical":
            _physical(ratio_ax, latency_ax, report)
            continue
        results = report["results"]
        names = [r["name"] for r in results]
        ys = range(len(results))
        ratios = [r["ratio"] for r in results]
        colors = ["#2a9d8f" if x >= 0.8 else "#e9c46a" if x >= 0.5 else "#e76f51" for x in ratios]
        ratio_ax.barh(list(ys), ratios, color=colors)
        ratio_ax.axvline(1.0, color="black", linewidth=0.8)
        ratio_ax.set_yticks(list(ys), names, fontsize=8)
        ratio_ax.invert_yaxis()
        ratio_ax.set_xlabel("cortex / raw asyncpg floor (1.0 = as fast as hand-written)")
        ratio_ax.set_title(f"{report['scenario']}: ratio to the floor", fontsize=10)
        p50 = [r["cortex"]["p50_ms"] for r in results]
        p95 = [r["cortex"]["p95_ms"] for r in results]
        floor95 = [r["floor"]["p95_ms"] for r in results]
        height = 0.27
        latency_ax.barh([y - height for y in ys], p50, height, label="cortex p50", color="#264653")
        latency_ax.barh(list(ys), p95, height, label="cortex p95", color="#2a9d8f")
        latency_ax.barh(
            [y + height for y in ys], floor95, height, label="floor p95", color="#b0b0b0"
        )
        latency_ax.set_yticks(list(ys), [""] * len(results))
        latency_ax.invert_yaxis()
        latency_ax.set_xscale("log")
        latency_ax.set_xlabel("latency, ms (log)")
        latency_ax.set_title(
            f"PostgreSQL {report['postgres_version'].split()[0]}, {report['cpus']} CPUs",
            fontsize=10,
        )
        latency_ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# The physical scenario's sides, in its table's order, and their colours.
_SIDES = (
    ("physical", "physical floor", "#b0b0b0"),
    ("same_sql", "same-SQL floor", "#8ab17d"),
    ("cortex", "cortex", "#264653"),
    ("adk", "ADK", "#e76f51"),
    ("agents", "Agents SDK", "#e9c46a"),
)


def _physical(speed_ax: Any, latency_ax: Any, report: dict[str, Any]) -> None:
    """Every side's speed relative to the physical floor (left), p50/p95 latency (right)."""
    results = report["results"]
    names = [r["name"] for r in results]
    ys = list(range(len(results)))
    height = 0.8 / len(_SIDES)
    for k, (side, label, color) in enumerate(_SIDES):
        offsets = [y - 0.4 + (k + 0.5) * height for y in ys]
        speeds, p50s, p95s = [], [], []
        for r in results:
            s, floor = r["sides"].get(side), r["floor"]
            if s is None:
                speeds.append(0.0)
                p50s.append(0.0)
                p95s.append(0.0)
                continue
            if r["kind"] == "throughput":
                speeds.append(s["ops_per_s"] / floor["ops_per_s"])
            else:
                speeds.append(floor["p50_ms"] / s["p50_ms"])
            p50s.append(s["p50_ms"])
            p95s.append(s["p95_ms"])
        speed_ax.barh(offsets, speeds, height, label=label, color=color)
        latency_ax.barh(offsets, p95s, height, color=color, alpha=0.45)
        latency_ax.barh(offsets, p50s, height, color=color, label=f"{label} p50 (p95 pale)")
    speed_ax.axvline(1.0, color="black", linewidth=0.8)
    speed_ax.axvline(0.5, color="black", linewidth=0.6, linestyle=":")
    speed_ax.set_yticks(ys, names, fontsize=8)
    speed_ax.invert_yaxis()
    speed_ax.set_xlabel("speed relative to the physical floor (throughput; listing: 1 / p50)")
    speed_ax.set_title("physical: every side against the physical floor", fontsize=10)
    speed_ax.legend(fontsize=7, loc="lower right")
    latency_ax.set_yticks(ys, [""] * len(results))
    latency_ax.invert_yaxis()
    latency_ax.set_xscale("log")
    latency_ax.set_xlabel("latency, ms (log)")
    load = report.get("load_average")
    latency_ax.set_title(
        f"PostgreSQL {report['postgres_version'].split()[0]}, {report['cpus']} CPUs"
        + (f", load {load[0]:.1f}" if load else ""),
        fontsize=10,
    )
    latency_ax.legend(fontsize=7, loc="lower right")


def main() -> None:
    """``python -m benchmarks.chart results.json``: redraw the PNG from saved results."""
    import json
    import sys

    source = Path(sys.argv[1])
    data = json.loads(source.read_text())
    draw(data if isinstance(data, list) else [data], source.with_suffix(".png"))


if __name__ == "__main__":
    main()
