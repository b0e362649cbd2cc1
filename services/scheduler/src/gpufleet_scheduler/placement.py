"""Where a worker goes: a pure function of the request and the fleet (R-SCHED-1, R-SCHED-2).

Candidates are the `active` nodes with enough free GPUs of one of the job's types whose rate
for this job is within its `max_price`. The rate is what the job's owner pays per GPU-hour:
on the owner's own node the usage fee of the GPU's class (R-BILL-1); on another account's node
its asking price, and only in regions that allow public jobs. Among candidates: the owner's
own nodes first, then the lowest rate, then the node left fullest (so large jobs still find
room), then the node id (deterministic).

Each node that cannot take the worker is counted under the reason that ruled it out, so a
queued job can say why it waits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from gpufleet_contracts.catalog import catalog


@dataclass(frozen=True)
class NodeView:
    node_id: str
    minion_id: str
    region: str
    owner: str
    state: str
    gpu_model: str | None
    gpu_indices: tuple[int, ...]
    free_indices: tuple[int, ...]
    price_per_gpu_hour: Decimal | None = None
    allow_public_jobs: bool = False


@dataclass(frozen=True)
class WorkerRequest:
    job_id: str
    worker: int
    owner: str
    gpu_types: tuple[str, ...]
    gpu_count: int
    max_price: Decimal | None


@dataclass(frozen=True)
class Placement:
    node: NodeView
    gpu_indices: tuple[int, ...]
    rate: Decimal
    charge: str  # "usage" | "market"


@dataclass(frozen=True)
class NoPlacement:
    reasons: Counter[str] = field(default_factory=Counter)

    def explain(self) -> str:
        if not self.reasons:
            return "no nodes registered"
        parts = []
        for reason, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            parts.append(f"{n} node{'s' if n != 1 else ''}: {reason}")
        return "; ".join(parts)


def rate_for(node: NodeView, owner: str) -> tuple[Decimal, str] | None:
    """The GPU-hour rate `owner` pays on `node`, or None when the node is not for them."""
    if node.gpu_model is None:
        return None
    if node.owner == owner:
        return catalog().usage_fee_per_gpu_hour(node.gpu_model), "usage"
    if node.allow_public_jobs and node.price_per_gpu_hour is not None:
        return node.price_per_gpu_hour, "market"
    return None


def _rule_out(req: WorkerRequest, node: NodeView) -> tuple[str | None, Decimal, str]:
    """The reason `node` cannot take `req`, or None and the rate it would charge."""
    if node.state != "active":
        return f"{node.state}, not active", Decimal(0), ""
    if node.gpu_model not in req.gpu_types:
        return f"no {' or '.join(req.gpu_types)}", Decimal(0), ""
    priced = rate_for(node, req.owner)
    if priced is None:
        return "another account's node, region not open to public jobs", Decimal(0), ""
    rate, charge = priced
    if req.max_price is not None and rate > req.max_price:
        return f"{rate} > max price {req.max_price}", rate, charge
    if len(node.gpu_indices) < req.gpu_count:
        return f"has {len(node.gpu_indices)} GPUs, job needs {req.gpu_count}", rate, charge
    if len(node.free_indices) < req.gpu_count:
        return (
            f"busy ({len(node.free_indices)} of {len(node.gpu_indices)} GPUs free, "
            f"needs {req.gpu_count})",
            rate,
            charge,
        )
    return None, rate, charge


def place(req: WorkerRequest, nodes: list[NodeView]) -> Placement | NoPlacement:
    best: tuple[tuple[int, Decimal, int, str], Placement] | None = None
    reasons: Counter[str] = Counter()
    for node in nodes:
        reason, rate, charge = _rule_out(req, node)
        if reason is not None:
            reasons[reason] += 1
            continue
        key = (0 if node.owner == req.owner else 1, rate, len(node.free_indices), node.node_id)
        if best is None or key < best[0]:
            chosen = tuple(sorted(node.free_indices)[: req.gpu_count])
            best = (key, Placement(node=node, gpu_indices=chosen, rate=rate, charge=charge))
    if best is None:
        return NoPlacement(reasons)
    return best[1]
