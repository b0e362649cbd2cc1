"""What one trace per job costs (`--trace-ratios`): the lifecycle run once per sampling
ratio (and `--rounds` times over, the ratios alternating, so that the machine's drift falls
on each alike), and the system's CPU per finished job of each against the ratio 0's.

The system's CPU is the sum of its process groups (the five services, the node agents with
their workers, nats-server, the database): neither this benchmark's own process nor the rest
of the machine, which other users' work moves from run to run."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NOT_THE_SYSTEM = (
    "of which the agent processes alone",  # a part of node-agents
    "this benchmark (submit, watch, sample)",
    "rest of the machine (other users, kernel, what no group holds)",
)


def ratios(text: str) -> list[float]:
    out = [float(r) for r in text.split(",") if r.strip()]
    if not out or any(not 0 <= r <= 1 for r in out):
        raise ValueError(f"--trace-ratios: ratios between 0 and 1, comma-separated: {text!r}")
    return out


def system_cpu_per_job(by_group: Mapping[str, Mapping[str, float]]) -> float:
    return sum(v["per_job_s"] for k, v in by_group.items() if k not in NOT_THE_SYSTEM)


def spans_written(traces: Path) -> int:
    """Spans the processes of one run wrote (their JSON lines), warm-up included."""
    count = 0
    for path in traces.glob("*.jsonl"):
        with path.open("rb") as f:
            count += sum(1 for _ in f)
    return count


def one(ratio: float, run: Mapping[str, Any], spans: int) -> dict[str, Any]:
    g = run["gpufleet"]
    by_group = g["cpu"]["by_group"]
    return {
        "ratio": ratio,
        "finished": g["finished"],
        "started_per_s": g.get("started_per_s"),
        "system_cpu_s_per_job": round(system_cpu_per_job(by_group), 5),
        "by_group_per_job_s": {k: v["per_job_s"] for k, v in by_group.items()},
        "machine_busy_cores": g["cpu"]["machine_busy_cores"],
        "billing_exact": g["billing"]["exactly_one_usage_charge_per_run"],
        "spans_written": spans,
        "jobs_traced": g["finished"] + run.get("warmup_ended", 0),  # warm-up included
        "loadavg_at_start": run["settings"]["loadavg_at_start"],
    }


def summary(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per ratio: the median of its runs' system CPU per job, and that against ratio 0's."""
    by_ratio: dict[float, list[float]] = {}
    for r in runs:
        by_ratio.setdefault(r["ratio"], []).append(r["system_cpu_s_per_job"])
    base = statistics.median(by_ratio[0.0]) if 0.0 in by_ratio else None
    rows = []
    for ratio, values in sorted(by_ratio.items()):
        median = statistics.median(values)
        rows.append(
            {
                "ratio": ratio,
                "runs": len(values),
                "system_cpu_s_per_job": values,
                "median": round(median, 5),
                "vs_0_percent": None if not base else round(100 * (median / base - 1), 1),
                "spans_per_job": round(
                    statistics.median(
                        x["spans_written"] / max(1, x.get("jobs_traced", x["finished"]))
                        for x in runs
                        if x["ratio"] == ratio
                    ),
                    2,
                ),
            }
        )
    return rows


def markdown(out: Mapping[str, Any]) -> str:
    lines = [
        "| sampling ratio | runs | system CPU-s per job (each run) | median | vs 0 "
        "| spans per job |",
        "|---|---|---|---|---|---|",
    ]
    for row in out["summary"]:
        each = ", ".join(f"{v:.4f}" for v in row["system_cpu_s_per_job"])
        vs = "-" if row["vs_0_percent"] is None else f"{row['vs_0_percent']:+.1f} %"
        lines.append(
            f"| {row['ratio']:g} | {row['runs']} | {each} | {row['median']:.4f} | {vs} "
            f"| {row['spans_per_job']:g} |"
        )
    return "\n".join(lines)
