"""The tracing cost figures of the lifecycle benchmark (benchmarks/lifecycle/tracecost.py):
the system's CPU per job, against the ratio 0's median."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path[:0] = [str(ROOT / "lifecycle"), str(ROOT)]

import tracecost  # noqa: E402


def run(ratio: float, scheduler: float, rest: float, spans: int) -> dict[str, Any]:
    by_group = {
        "scheduler": {"per_job_s": scheduler},
        "node-agents": {"per_job_s": 0.008},
        "of which the agent processes alone": {"per_job_s": 0.006},
        "this benchmark (submit, watch, sample)": {"per_job_s": 0.0005},
        "rest of the machine (other users, kernel, what no group holds)": {"per_job_s": rest},
    }
    out = {
        "settings": {"loadavg_at_start": (1.0, 1.0, 1.0)},
        "warmup_ended": 80,
        "gpufleet": {
            "finished": 1920,
            "cpu": {"by_group": by_group, "machine_busy_cores": 1.9},
            "billing": {"exactly_one_usage_charge_per_run": True},
        },
    }
    return tracecost.one(ratio, out, spans)


def test_the_system_is_its_groups_not_the_rest_of_the_machine_nor_the_benchmark() -> None:
    assert run(0.0, 0.002, 0.9, 0)["system_cpu_s_per_job"] == pytest.approx(0.010)


def test_each_ratio_against_the_median_of_ratio_0() -> None:
    runs = [
        run(0.0, 0.002, 0.01, 0),
        run(0.0, 0.004, 0.05, 0),
        run(1.0, 0.0035, 0.0, 20_000),
        run(1.0, 0.0045, 0.0, 20_000),
    ]
    zero, one = tracecost.summary(runs)
    assert zero["median"] == pytest.approx(0.011) and zero["vs_0_percent"] == 0.0
    assert one["median"] == pytest.approx(0.012) and one["vs_0_percent"] == pytest.approx(9.1)
    assert one["spans_per_job"] == 10.0  # warm-up jobs included
    assert "| 1 | 2 |" in tracecost.markdown({"summary": [zero, one]})


def test_ratios_are_between_0_and_1() -> None:
    assert tracecost.ratios("0, 0.1,1") == [0.0, 0.1, 1.0]
    with pytest.raises(ValueError, match="between 0 and 1"):
        tracecost.ratios("0,2")
