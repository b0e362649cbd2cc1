"""Cost quality: the scheduler's placements against the true optimum, by exhaustive search.

    uv run python benchmarks/scheduler/bench_quality.py [--instances 300]

Small random instances (3-5 public nodes of mixed types, GPU counts and prices; 3-6 jobs
of 1-4 GPUs, 1-2 acceptable types, some with a max price). Two comparisons:

1. Per decision (what R-SCHED-1 asks): each worker goes to the cheapest node that can take
   it at that moment. Checked exactly against a scan of every node: the gap must be 0.
2. Whole batch: the cheapest assignment (exhaustive) of exactly the jobs our pass placed,
   all of them placed, against what the pass paid; and how often a different choice would
   have placed more jobs. Greedy oldest-first is not globally optimal (an early job may take
   the cheap node a later one needed); the gap says by how much on these instances.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from decimal import Decimal

from gpufleet_scheduler.index import PlacementIndex
from gpufleet_scheduler.placement import NodeView, WorkerRequest, fit, rule_out
from gpufleet_scheduler.queue import Waiting, plan

MODELS = ("RTX 3090", "T4", "A100 80GB")


def instance(rng: random.Random) -> tuple[list[NodeView], list[WorkerRequest]]:
    nodes = []
    for i in range(rng.randint(3, 5)):
        g = rng.choice((1, 2, 4))
        nodes.append(
            NodeView(
                node_id=f"n{i}",
                minion_id=f"n{i}",
                region="r",
                owner="seller",
                state="active",
                gpu_model=rng.choice(MODELS),
                gpu_indices=tuple(range(g)),
                free_indices=tuple(range(g)),
                price_per_gpu_hour=Decimal(rng.choice(("0.10", "0.20", "0.35", "0.50", "0.90"))),
                allow_public_jobs=True,
                verified=True,  # the seller's GPU check passed: it may sell
            )
        )
    jobs = [
        WorkerRequest(
            job_id=f"j{k}",
            worker=0,
            owner="buyer",
            gpu_types=tuple(rng.sample(MODELS, rng.randint(1, 2))),
            gpu_count=rng.choice((1, 1, 2, 4)),
            max_price=rng.choice((None, None, Decimal("0.40"))),
        )
        for k in range(rng.randint(3, 6))
    ]
    return nodes, jobs


def cost_of(req: WorkerRequest, node: NodeView) -> Decimal | None:
    """The job's hourly cost on `node` if the node (fully free) could take it."""
    full = NodeView(**{**node.__dict__, "free_indices": node.gpu_indices})
    if rule_out(req, full) is not None:
        return None
    return fit(req, full)[1].rate * req.gpu_count


def exhaustive(nodes: list[NodeView], jobs: list[WorkerRequest]) -> dict[int, Decimal]:
    """Min total cost for each number of jobs placed (every assignment tried)."""
    best: dict[int, Decimal] = {}
    options = [[None, *range(len(nodes))] for _ in jobs]
    costs = [[cost_of(j, n) for n in nodes] for j in jobs]
    for assign in itertools.product(*options):
        used = [0] * len(nodes)
        total, placed, ok = Decimal(0), 0, True
        for k, a in enumerate(assign):
            if a is None:
                continue
            c = costs[k][a]
            if c is None:
                ok = False
                break
            used[a] += jobs[k].gpu_count
            if used[a] > len(nodes[a].gpu_indices):
                ok = False
                break
            total += c
            placed += 1
        if ok and (placed not in best or total < best[placed]):
            best[placed] = total
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=300)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    decision_gaps = 0
    decisions = 0
    same_count_gap: list[float] = []
    optimal_same_count = 0
    fewer_than_max = 0
    for _ in range(a.instances):
        nodes, jobs = instance(rng)
        index = PlacementIndex(nodes)
        # Per decision: compare with a scan at the moment of each decision.
        for req in jobs:
            view = list(index.nodes.values())
            feasible = [fit(req, n)[1].rate for n in view if rule_out(req, n) is None]
            got = index.place(req)
            decisions += 1
            if got is None:
                decision_gaps += bool(feasible)
                continue
            decision_gaps += got.rate != min(feasible)
            index.take(got)
        # Batch: our pass vs the optimum.
        result = plan(
            [Waiting(req=j, queued_ms=k) for k, j in enumerate(jobs)], PlacementIndex(nodes), 100
        )
        ours = sum((p.rate * w.req.gpu_count for w, p in result.placed), Decimal(0))
        n = len(result.placed)
        fewer_than_max += n < max(exhaustive(nodes, jobs))
        # The same jobs, every one placed, at the lowest total cost.
        same = [w.req for w, _ in result.placed]
        best = exhaustive(nodes, same)
        if n and best.get(n):
            gap = float((ours - best[n]) / best[n])
            same_count_gap.append(gap)
            optimal_same_count += gap == 0
    same_count_gap.sort()
    out = {
        "instances": a.instances,
        "decisions": decisions,
        "decisions_not_lowest_cost": decision_gaps,
        "batch_instances_compared": len(same_count_gap),
        "batch_optimal_share": round(optimal_same_count / max(1, len(same_count_gap)), 3),
        "batch_gap_mean_pct": round(100 * sum(same_count_gap) / max(1, len(same_count_gap)), 2),
        "batch_gap_p95_pct": round(100 * same_count_gap[int(0.95 * (len(same_count_gap) - 1))], 2)
        if same_count_gap
        else 0,
        "batch_gap_max_pct": round(100 * same_count_gap[-1], 2) if same_count_gap else 0,
        "instances_placing_fewer_jobs_than_possible": fewer_than_max,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
