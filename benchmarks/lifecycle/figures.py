"""The lifecycle benchmark's figures, computed from what was watched (plain data in, plain
data out: no I/O here)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetstack import Run, stats_ms


def rate(count: int, seconds: float | None) -> float | None:
    return round(count / seconds, 2) if seconds and seconds > 0 else None


def lifecycle(
    sent: Mapping[str, float], at: Mapping[str, Mapping[str, float]], t0: float
) -> dict[str, Any]:
    """Started/finished counts, rates and latencies of the jobs submitted (`sent`: job id ->
    perf_counter of its submit request; `at`: job id -> event -> arrival; `t0`: the first
    submit). A job counts as started when the scheduler said `running`, as finished on
    `finished`; rates are counts over the time from t0 to the last of them."""
    running = {j: at[j]["running"] for j in sent if "running" in at.get(j, {})}
    finished = {j: at[j]["finished"] for j in sent if "finished" in at.get(j, {})}
    failed = [j for j in sent if "failed" in at.get(j, {})]
    worker_started = [j for j in sent if "started" in at.get(j, {})]
    last_run = max(running.values(), default=None)
    last_fin = max(finished.values(), default=None)
    span_run = last_run - t0 if last_run is not None else None
    span_fin = last_fin - t0 if last_fin is not None else None
    return {
        "jobs": len(sent),
        "worker_started": len(worker_started),
        "started": len(running),
        "finished": len(finished),
        "failed": len(failed),
        "not_ended": len(sent) - len(finished) - len(failed),
        "started_per_s": rate(len(running), span_run),
        "finished_per_s": rate(len(finished), span_fin),
        "last_started_s": round(span_run, 2) if span_run is not None else None,
        "last_finished_s": round(span_fin, 2) if span_fin is not None else None,
        "all_finished_s": round(span_fin, 2)
        if span_fin is not None and len(finished) == len(sent)
        else None,
        "submit_to_running": stats_ms([running[j] - sent[j] for j in running]),
        "submit_to_finished": stats_ms([finished[j] - sent[j] for j in finished]),
    }


def _overlap(a: Run, b: Run, now: datetime) -> bool:
    assert a.started_at is not None and b.started_at is not None
    return a.started_at < (b.ended_at or now) and b.started_at < (a.ended_at or now)


def doubled(runs: Iterable[Run], jobs: set[str], now: datetime) -> dict[str, int]:
    """Jobs of `jobs` that ran on more than one placement (their node said it started), and
    of those, the ones whose runs overlapped in time (the nodes' clocks; a run not ended
    counts as running until `now`)."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        if r.job_id in jobs and r.started_at is not None:
            by_job[r.job_id].append(r)
    more = {j: rs for j, rs in by_job.items() if len(rs) > 1}
    overlapping = sum(
        1
        for rs in more.values()
        if any(_overlap(a, b, now) for i, a in enumerate(rs) for b in rs[i + 1 :])
    )
    return {"jobs_run_more_than_once": len(more), "jobs_run_twice_at_once": overlapping}


def requeued(states: Mapping[str, list[str]], jobs: set[str]) -> int:
    """Jobs put back in the queue after they had left it."""
    return sum(1 for j in jobs if "queued" in states.get(j, [])[1:])


def nodes_lost(node_states: Iterable[tuple[float, str, str, str | None]], since: float) -> int:
    """Distinct nodes marked lost since `since` (perf_counter)."""
    return len({m for t, m, state, _ in node_states if state == "lost" and t >= since})


@dataclass(frozen=True)
class Ledger:
    """The check of the usage charges against the runs (see `check_ledger`)."""

    expected_runs: int
    charged_runs: int
    entries: int
    missing: int
    unexpected: int
    placements_charged_more_than_once: int
    jobs_charged_more_than_once: int

    @property
    def exact(self) -> bool:
        return (
            self.missing == 0
            and self.unexpected == 0
            and self.placements_charged_more_than_once == 0
            and self.jobs_charged_more_than_once == 0
        )


def check_ledger(expected: Mapping[str, str], entries: Iterable[Mapping[str, Any]]) -> Ledger:
    """`expected`: placement -> job of every run that started and ended (the node said so);
    `entries`: the payer's usage-fee ledger entries (billing's `ledger`: key
    `usage:<placement>:<stage>:<account>`, with `placement_id`, `job_id`, `stage`).

    A run of `true` is settled by one entry (stage `end`; `h<k>` stages only for full
    running hours): exactly one per expected run, none for any other placement, and no job
    charged on two placements (a job that ran twice is billed for the platform's mistake)."""
    per_placement = Counter(str(e["placement_id"]) for e in entries)
    jobs_of: dict[str, set[str]] = defaultdict(set)
    for e in entries:
        jobs_of[str(e["job_id"])].add(str(e["placement_id"]))
    return Ledger(
        expected_runs=len(expected),
        charged_runs=len(per_placement),
        entries=sum(per_placement.values()),
        missing=sum(1 for p in expected if p not in per_placement),
        unexpected=sum(1 for p in per_placement if p not in expected),
        placements_charged_more_than_once=sum(1 for c in per_placement.values() if c > 1),
        jobs_charged_more_than_once=sum(1 for ps in jobs_of.values() if len(ps) > 1),
    )


def cpu_per_job(
    before: Mapping[str, float],
    after: Mapping[str, float],
    jobs: int,
    machine_s: float,
    part: str = "",
) -> dict[str, dict[str, float]]:
    """CPU seconds by group over a window and per job (`jobs`: those finished); the last
    row is the rest of the machine's busy time (`machine_s`) that no group accounts for
    (`part` names a row that is a part of another, not added)."""
    out = {}
    counted = 0.0
    for group in after:
        used = after[group] - before.get(group, 0.0)
        counted += used if group != part else 0.0
        out[group] = {"cpu_s": round(used, 2), "per_job_s": round(used / max(1, jobs), 4)}
    rest = machine_s - counted
    out[REST] = {"cpu_s": round(rest, 2), "per_job_s": round(rest / max(1, jobs), 4)}
    return out


REST = "rest of the machine (other users, kernel, what no group holds)"
