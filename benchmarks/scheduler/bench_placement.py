"""Placement engine alone: decisions per second, indexed vs a naive linear scan.

    uv run python benchmarks/scheduler/bench_placement.py [--nodes 10000] [--jobs 100000]

A *decision* is one waiting worker considered by the queue pass: placed, or found not to
fit now. The indexed engine runs the real queue pass (`queue.plan`: oldest first, backfill,
the failed-shape shortcut, anti-starvation holds, explanations for the waiting) over all
jobs; the naive baseline runs `placement.place` (one scan of every node per worker) over
the first `--naive-jobs` jobs of the same run (a full naive run would take hours), and the
two must agree on every decision they both made.
"""

from __future__ import annotations

import argparse
import json
import time

from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import NoPlacement, Placement, place
from gpufleet_scheduler.queue import Waiting, plan
from synth import fleet, workload


def naive(nodes_in: list, jobs: list) -> tuple[float, list]:  # type: ignore[type-arg]
    nodes = {n.node_id: n for n in nodes_in}
    decisions = []
    t0 = time.perf_counter()
    for req, _ in jobs:
        d = place(req, list(nodes.values()))
        if isinstance(d, Placement):
            tmp = PlacementIndex([nodes[d.node.node_id]])
            nodes[d.node.node_id] = tmp.take(d)
            decisions.append((req.job_id, d.node.node_id, d.gpu_indices))
        else:
            assert isinstance(d, NoPlacement)
            decisions.append((req.job_id, None, ()))
    return time.perf_counter() - t0, decisions


def indexed(nodes_in: list, jobs: list, explain_budget: int) -> tuple[float, float, object]:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    index = PlacementIndex(nodes_in)
    build = time.perf_counter() - t0
    waiting = [Waiting(req=r, queued_ms=q) for r, q in jobs]
    t1 = time.perf_counter()
    result = plan(waiting, index, now_ms=jobs[-1][1] + 1, explain_budget=explain_budget)
    return build, time.perf_counter() - t1, result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--naive-jobs", type=int, default=2_000)
    ap.add_argument("--explain-budget", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    nodes = fleet(a.nodes)
    jobs = workload(a.jobs)

    # Agreement: the index and the scan decide the same on the naive sample.
    sample = jobs[: a.naive_jobs]
    t_naive, naive_decisions = naive(nodes, sample)
    _, _, sample_result = indexed(nodes, sample, 0)
    ours = {w.req.job_id: (p.node.node_id, p.gpu_indices) for w, p in sample_result.placed}  # type: ignore[attr-defined]
    mismatches = sum(
        1 for job_id, node, gpus in naive_decisions if ours.get(job_id, (None, ())) != (node, gpus)
    )

    build, t_idx, result = indexed(nodes, jobs, a.explain_budget)
    t_plan_only = indexed(nodes, jobs, 0)[1]
    placed = len(result.placed)  # type: ignore[attr-defined]
    out = {
        "nodes": a.nodes,
        "jobs": a.jobs,
        "index_build_s": round(build, 3),
        "indexed_pass_s": round(t_idx, 3),
        "indexed_decisions_per_s": round(a.jobs / t_idx),
        "indexed_decisions_per_s_without_explanations": round(a.jobs / t_plan_only),
        "placed": placed,
        "waiting": a.jobs - placed,
        "explained_shapes": a.explain_budget,
        "naive_jobs": len(sample),
        "naive_s": round(t_naive, 3),
        "naive_decisions_per_s": round(len(sample) / t_naive),
        "speedup": round((a.jobs / t_plan_only) / (len(sample) / t_naive), 1),
        "agreement_mismatches": mismatches,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
