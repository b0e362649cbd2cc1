"""Where a worker goes: a pure function of the request and the fleet (R-SCHED-1/2/4, R-RES-1).

A node can take a worker when it is `active`, has one of the job's GPU types, is in the
job's pinned region (if any), is the owner's own or another account's real (not simulated,
R-NODE-6) node in a region open to public jobs, charges at most `max_price` per GPU-hour,
has enough GPUs at all, is not held for an older job (anti-starvation, see queue.py) and
has enough free now. The rate is what the job's owner pays per GPU-hour: on the owner's own
node the usage fee of the GPU's class (R-BILL-1); on another account's node its asking price.

Among nodes that can: the owner's own nodes first, then the lowest cost for this worker
(the rate, times the share of the GPU a fractional worker gets), then the tightest fit (the
fewest free GPUs, or for a fractional worker the GPU with the fewest free shares that still
fit: large jobs keep finding room), then the node id (deterministic).

Fractional GPUs (R-SCHED-4): an operator divides each GPU of a node into `gpu_shares`
shares. A worker asking for fraction f gets ceil(f x shares) shares of one GPU (on an
undivided node: the whole GPU) and pays for what it gets.

`place` is the plain linear scan, the reference. `PlacementIndex` (index.py) gives the same
answers from buckets and is what the scheduler uses; tests check they agree.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
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
    free_indices: tuple[int, ...]  # GPUs with every share free
    price_per_gpu_hour: Decimal | None = None
    allow_public_jobs: bool = False
    gpu_shares: int = 1  # shares per GPU (R-SCHED-4)
    partial: tuple[tuple[int, int], ...] = ()  # (GPU, free shares) of GPUs partly in use
    gpu_memory_mb: int | None = None
    # Its GPUs come from a simulated inventory (development, R-NODE-6): its owner's jobs only.
    simulated: bool = False

    def share_slots(self) -> list[tuple[int, int]]:
        """(free shares, GPU) of every GPU with some room, ascending."""
        slots = [(self.gpu_shares, i) for i in self.free_indices]
        slots += [(s, i) for i, s in self.partial if s > 0]
        return sorted(slots)


@dataclass(frozen=True)
class WorkerRequest:
    job_id: str
    worker: int
    owner: str
    gpu_types: tuple[str, ...]
    gpu_count: int
    max_price: Decimal | None
    region: str | None = None  # pinned by a regional resource (R-RES-1)
    fraction: Decimal | None = None  # R-SCHED-4

    def shape(self) -> tuple[object, ...]:
        """What placement depends on, besides the job's identity."""
        return (
            self.owner,
            self.gpu_types,
            self.gpu_count,
            self.max_price,
            self.region,
            self.fraction,
        )


@dataclass(frozen=True)
class Placement:
    node: NodeView
    gpu_indices: tuple[int, ...]
    rate: Decimal  # what this worker pays per hour per GPU it holds (the share's rate)
    charge: str  # "usage" | "market"
    rate_per_gpu_hour: Decimal = Decimal(0)
    shares: int = 0  # shares of gpu_indices[0] for a fractional worker; 0: whole GPUs

    @property
    def fraction(self) -> Decimal | None:
        if not self.shares:
            return None
        return Decimal(self.shares) / Decimal(self.node.gpu_shares)


@dataclass(frozen=True)
class NoPlacement:
    reasons: Counter[str] = field(default_factory=Counter)

    def explain(self) -> str:
        return explain(self.reasons)

    def structured(self) -> list[dict[str, object]]:
        return [{"reason": r, "nodes": n} for r, n in _ordered(self.reasons)]


def _ordered(reasons: Counter[str]) -> list[tuple[str, int]]:
    return sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))


def explain(reasons: Counter[str]) -> str:
    """ "12 nodes: no RTX 3090; 3 nodes: 2.10 > max price 1.50; 1 node: busy (...)"."""
    if not reasons:
        return "no nodes registered"
    return "; ".join(f"{n} node{'s' if n != 1 else ''}: {r}" for r, n in _ordered(reasons))


def rate_for(node: NodeView, owner: str) -> tuple[Decimal, str] | None:
    """The GPU-hour rate `owner` pays on `node`, or None when the node is not for them."""
    if node.gpu_model is None:
        return None
    if node.owner == owner:
        return catalog().usage_fee_per_gpu_hour(node.gpu_model), "usage"
    if node.simulated:
        return None  # another account's job would "run" on GPUs that do not exist
    if node.allow_public_jobs and node.price_per_gpu_hour is not None:
        return node.price_per_gpu_hour, "market"
    return None


def shares_needed(fraction: Decimal, gpu_shares: int) -> int:
    return max(1, math.ceil(fraction * gpu_shares))


def effective_rate(rate: Decimal, shares: int, gpu_shares: int) -> Decimal:
    """The share's rate: `rate` x shares / gpu_shares, to the micro-credit."""
    return (rate * shares / gpu_shares).quantize(Decimal("0.000001"))


def _fmt(d: Decimal) -> str:
    return f"{d:.2f}" if d == d.quantize(Decimal("0.01")) else str(d.normalize())


def rule_out(
    req: WorkerRequest, node: NodeView, reserved: Mapping[str, str] | None = None
) -> str | None:
    """Why `node` cannot take `req` now, or None."""
    if node.state != "active":
        return f"{node.state}, not active"
    if node.gpu_model not in req.gpu_types:
        return f"no {' or '.join(req.gpu_types)}"
    if req.region is not None and node.region != req.region:
        return f"not in pinned region {req.region}"
    priced = rate_for(node, req.owner)
    if priced is None and node.simulated:
        return "another account's node with simulated GPUs"
    if priced is None:
        return "another account's node, region not open to public jobs"
    rate = priced[0]
    if req.max_price is not None and rate > req.max_price:
        return f"{_fmt(rate)} > max price {_fmt(req.max_price)}"
    if len(node.gpu_indices) < req.gpu_count:
        return f"has {len(node.gpu_indices)} GPUs, job needs {req.gpu_count}"
    holder = (reserved or {}).get(node.node_id)
    if holder is not None and holder != req.job_id:
        return "held for an older waiting job"
    if req.fraction is not None:
        need = shares_needed(req.fraction, node.gpu_shares)
        if not any(s >= need for s, _ in node.share_slots()):
            return f"busy (no GPU with {need} of {node.gpu_shares} shares free)"
        return None
    if len(node.free_indices) < req.gpu_count:
        return (
            f"busy ({len(node.free_indices)} of {len(node.gpu_indices)} GPUs free, "
            f"needs {req.gpu_count})"
        )
    return None


def fit(req: WorkerRequest, node: NodeView) -> tuple[tuple[object, ...], Placement]:
    """The sort key and placement of `req` on `node`, which `rule_out` accepted."""
    priced = rate_for(node, req.owner)
    assert priced is not None
    rate, charge = priced
    own = 0 if node.owner == req.owner else 1
    if req.fraction is not None:
        need = shares_needed(req.fraction, node.gpu_shares)
        free, gpu = next((s, i) for s, i in node.share_slots() if s >= need)
        eff = effective_rate(rate, need, node.gpu_shares)
        return (own, eff, free, node.node_id), Placement(
            node=node,
            gpu_indices=(gpu,),
            rate=eff,
            charge=charge,
            rate_per_gpu_hour=rate,
            shares=need,
        )
    chosen = tuple(sorted(node.free_indices)[: req.gpu_count])
    key = (own, rate, len(node.free_indices), node.node_id)
    return key, Placement(
        node=node, gpu_indices=chosen, rate=rate, charge=charge, rate_per_gpu_hour=rate
    )


def place(
    req: WorkerRequest, nodes: list[NodeView], reserved: Mapping[str, str] | None = None
) -> Placement | NoPlacement:
    """The reference placer: one linear scan over every node."""
    best: tuple[tuple[object, ...], Placement] | None = None
    reasons: Counter[str] = Counter()
    for node in nodes:
        reason = rule_out(req, node, reserved)
        if reason is not None:
            reasons[reason] += 1
            continue
        key, placement = fit(req, node)
        if best is None or key < best[0]:
            best = (key, placement)
    if best is None:
        return NoPlacement(reasons)
    return best[1]


def why_not(
    req: WorkerRequest, nodes: list[NodeView], reserved: Mapping[str, str] | None = None
) -> NoPlacement:
    """Every node, counted under the reason that rules it out (for a waiting worker)."""
    reasons: Counter[str] = Counter()
    for node in nodes:
        reasons[rule_out(req, node, reserved) or "free now"] += 1
    return NoPlacement(reasons)
