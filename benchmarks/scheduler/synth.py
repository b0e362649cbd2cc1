"""A synthetic fleet and workload: mixed GPU types, prices, regions, owners, shares."""

from __future__ import annotations

import random
from decimal import Decimal

from gpufleet_scheduler.placement import NodeView, WorkerRequest

MODELS = (
    "RTX 3090",
    "RTX A4000",
    "RTX A6000",
    "T4",
    "V100",
    "A100 40GB",
    "A100 80GB",
    "H100 80GB",
)
REGIONS = tuple(f"r{i:02d}" for i in range(20))
OWNERS = tuple(f"acct{i:03d}" for i in range(200))
PRICES = tuple(Decimal(p) for p in ("0.05", "0.10", "0.25", "0.40", "0.80", "1.20", "2.10"))


def fleet(n: int, seed: int = 1) -> list[NodeView]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gpus = rng.choice((1, 2, 4, 4, 8, 8))
        idx = tuple(range(gpus))
        out.append(
            NodeView(
                node_id=f"n{i:05d}",
                minion_id=f"m{i:05d}",
                region=rng.choice(REGIONS),
                owner=rng.choice(OWNERS),
                state=rng.choices(("active", "maintenance", "lost"), (94, 4, 2))[0],
                gpu_model=rng.choice(MODELS),
                gpu_indices=idx,
                free_indices=idx,
                price_per_gpu_hour=rng.choice(PRICES),
                allow_public_jobs=rng.random() < 0.7,
                verified=True,  # a marketplace of nodes whose GPU check passed
                gpu_shares=rng.choice((1, 1, 1, 2, 4)),
                gpu_memory_mb=24576,
            )
        )
    return out


def workload(n: int, seed: int = 2) -> list[tuple[WorkerRequest, int]]:
    """(request, queued_ms) of n single-worker jobs, oldest first."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        frac = rng.random() < 0.1
        out.append(
            (
                WorkerRequest(
                    job_id=f"j{i:06d}",
                    worker=0,
                    owner=rng.choice(OWNERS),
                    gpu_types=tuple(rng.sample(MODELS, rng.choice((1, 1, 2, 3)))),
                    gpu_count=1 if frac else rng.choice((1, 1, 1, 2, 4, 8)),
                    max_price=rng.choice((None, Decimal("0.30"), Decimal("1.00"), Decimal("3"))),
                    region=rng.choice((None,) * 8 + REGIONS[:2]),
                    fraction=rng.choice((Decimal("0.25"), Decimal("0.5"))) if frac else None,
                ),
                1_000_000 + i,
            )
        )
    return out
