"""The lifecycle benchmark's figures from plain data (benchmarks/lifecycle/figures.py,
slurm.py's summary parser): what it calls billed exactly once, doubled, lost."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path[:0] = [str(ROOT / "lifecycle"), str(ROOT)]

import figures  # noqa: E402
import slurm  # noqa: E402
from fleetstack import Run  # noqa: E402

T = datetime(2026, 1, 1, tzinfo=UTC)


def entry(placement: str, job: str, stage: str = "end") -> dict[str, str]:
    return {"placement_id": placement, "job_id": job, "stage": stage}


def test_one_usage_charge_per_run_is_exact() -> None:
    check = figures.check_ledger({"p1": "j1", "p2": "j2"}, [entry("p1", "j1"), entry("p2", "j2")])
    assert check.exact
    assert (check.expected_runs, check.charged_runs, check.entries) == (2, 2, 2)


def test_a_run_not_charged_yet_is_missing() -> None:
    check = figures.check_ledger({"p1": "j1", "p2": "j2"}, [entry("p1", "j1")])
    assert not check.exact
    assert check.missing == 1


def test_a_job_charged_on_two_placements_is_charged_twice() -> None:
    runs = {"p1": "j1", "p2": "j1"}
    check = figures.check_ledger(runs, [entry("p1", "j1"), entry("p2", "j1")])
    assert not check.exact
    assert check.jobs_charged_more_than_once == 1


def test_a_placement_charged_in_two_stages_or_never_run_is_not_exact() -> None:
    twice = figures.check_ledger({"p1": "j1"}, [entry("p1", "j1", "h1"), entry("p1", "j1")])
    assert twice.placements_charged_more_than_once == 1 and not twice.exact
    stray = figures.check_ledger({"p1": "j1"}, [entry("p1", "j1"), entry("p9", "j9")])
    assert stray.unexpected == 1 and not stray.exact


def run(job: str, start_s: int, end_s: int | None) -> Run:
    end = T + timedelta(seconds=end_s) if end_s is not None else None
    return Run(job, "n", T + timedelta(seconds=start_s), end, ["finished"] if end else [])


def test_two_runs_of_a_job_overlapping_are_counted_as_run_twice_at_once() -> None:
    runs = [run("a", 0, 10), run("a", 5, 12), run("b", 0, 1), run("b", 2, 3), run("c", 0, 1)]
    got = figures.doubled(runs, {"a", "b", "c"}, T + timedelta(seconds=60))
    assert got == {"jobs_run_more_than_once": 2, "jobs_run_twice_at_once": 1}


def test_a_run_not_ended_overlaps_until_now() -> None:
    runs = [run("a", 0, None), run("a", 30, 31)]
    assert figures.doubled(runs, {"a"}, T + timedelta(seconds=60))["jobs_run_twice_at_once"] == 1


def test_a_placement_that_never_started_is_no_run() -> None:
    runs = [run("a", 0, 1), Run("a", "n", None, None, ["failed"])]
    assert figures.doubled(runs, {"a"}, T)["jobs_run_more_than_once"] == 0


def test_rates_and_latencies_count_from_the_first_submit() -> None:
    sent = {"a": 0.0, "b": 1.0, "c": 2.0}
    at = {
        "a": {"running": 1.0, "finished": 2.0},
        "b": {"running": 3.0, "finished": 4.0},
        "c": {"failed": 5.0},
    }
    got = figures.lifecycle(sent, at, 0.0)
    assert (got["started"], got["finished"], got["failed"], got["not_ended"]) == (2, 2, 1, 0)
    assert got["started_per_s"] == round(2 / 3.0, 2)
    assert got["finished_per_s"] == 0.5
    assert got["all_finished_s"] is None  # one failed
    assert got["submit_to_finished"]["max_ms"] == 3000


def test_requeued_and_lost_nodes() -> None:
    states = {"a": ["running", "queued", "running"], "b": ["queued", "running"]}
    assert figures.requeued(states, {"a", "b"}) == 1
    changes = [
        (1.0, "n1", "lost", "active"),
        (5.0, "n2", "lost", "active"),
        (6.0, "n2", "lost", None),
    ]
    assert figures.nodes_lost(changes, since=2.0) == 1


def test_cpu_per_job_leaves_the_part_out_of_the_rest_of_the_machine() -> None:
    got = figures.cpu_per_job(
        {"a": 1.0, "part": 0.0}, {"a": 3.0, "part": 1.0}, jobs=2, machine_s=5.0, part="part"
    )
    assert got["a"] == {"cpu_s": 2.0, "per_job_s": 1.0}
    assert got[figures.REST]["cpu_s"] == 3.0


def test_the_slurm_harness_summary_is_read_back() -> None:
    text = (
        "first wave: 80 jobs (= free slots) allocated within 0.61s of t0 (sdiag polled)\n"
        "host: 2 CPUs, mean CPU busy during measurement: 93% (vmstat)\n"
        "submission: 500 jobs in 2.10s = 238.1 jobs/s (partition DOWN, nothing scheduled)\n"
        "after release: all started in 9.80s (51.0 jobs/s), all completed in 9.95s (50.3 jobs/s)\n"
        "slurm: 500 jobs, 10 nodes: 51.0 jobs/s started, 9.95 s total\n"
    )
    got = slurm.parse_summary(text)
    assert got["submit_per_s"] == 238.1
    assert (got["started_per_s"], got["completed_per_s"]) == (51.0, 50.3)
    assert (got["all_started_s"], got["all_completed_s"], got["first_wave_s"]) == (9.8, 9.95, 0.61)
    assert got["cpu_busy_pct"] == 93
    assert got["summary"].startswith("slurm: 500 jobs")
