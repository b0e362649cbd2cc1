"""Where a worker goes: a pure function of the request and the fleet (R-SCHED-1/2/4, R-RES-1).

A node can take a worker when it is `active`, has one of the job's GPU types, is in the
job's pinned region (if any), is the owner's own or another account's real (not simulated,
R-NODE-6) and verified node (its GPUs passed gpufleet's check: the provisioner's checks.py)
in a region open to public jobs, charges at most `max_price` per GPU-hour,
can receive the worker's secrets if it has any (a sealing key: sealing.py), offers the
worker's base environment (R-JOB-7: what its agent announced, environments.py), has enough
GPUs at all, is not held for an older job (anti-starvation, see queue.py) and has enough
free now. The rate is what the job's owner pays per GPU-hour: on the owner's own
node the usage fee of the GPU's class (R-BILL-1); on another account's node its asking price.

Among nodes that can: the owner's own nodes first, then the lowest cost for this worker
(the rate, times the share of the GPU a fractional worker gets), then the tightest fit (the
fewest free GPUs, or for a fractional worker the GPU with the fewest free shares that still
fit: large jobs keep finding room), then the node id (deterministic).

Fractional GPUs (R-SCHED-4): an operator divides each GPU of a node into `gpu_shares`
shares. A worker asking for fraction f gets ceil(f x shares) shares of one GPU (on an
undivided node: the whole GPU) and pays for what it gets.

CPU-only workers (R-JOB-2, `cpu_count`, no GPU): a node offers its operator's share of its
CPUs to them (`cpus`, its agent's GPUFLEET_CPU_JOB_CPUS; the rest feed its GPUs' workers, so
the two kinds never compete). The same rules, with CPUs for GPUs: a node that offers at
least `cpu_count` CPUs and has them free now; the rate is per CPU-hour (the catalogue's CPU
usage fee on the owner's own node, else its asking `price_per_cpu_hour`), and `max_price`
is per CPU-hour too. Among those: own first, lowest rate, fewest free CPUs, node id.

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
from gpufleet_contracts.environments import BUILT_IN, EnvironmentOffer, tag_of
from gpufleet_contracts.jobspec import BaseEnvironment

NO_CPUS = "offers no CPUs to CPU-only jobs"
UNSEALED = "cannot receive secrets (its agent sent no sealing key)"
# Another account's node for sale whose hardware did not pass (or has not had) its check.
NOT_VERIFIED = "another account's node, not verified"
# A removed node is gone for good: no reason counts it (the fleet keeps it for the work and
# claims it had).
REMOVED = "removed"


def no_environment(base: BaseEnvironment) -> str:
    """A node that does not offer the worker's base environment (R-JOB-7)."""
    return f"does not offer the base environment {tag_of(base)}"


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
    # Its hardware passed gpufleet's GPU check (the provisioner's NodeVerified): without
    # it, its owner's jobs only.
    verified: bool = False
    # CPU-only jobs (R-JOB-2): the CPUs it offers them, how many are free, their price.
    cpus: int = 0
    free_cpus: int = 0
    price_per_cpu_hour: Decimal | None = None
    # The public key a worker's secrets are sealed to (gpufleet_auth.sealing); None: its
    # agent sent none (or one nothing seals to), so it takes no job that carries secrets.
    sealing_key: str | None = None
    # The base environments it runs (R-JOB-7), as its agent announced them; an agent that
    # announced none: what every gpufleet node builds.
    environments: EnvironmentOffer = BUILT_IN
    # Where its proxy serves endpoints: a URL template with `{job}` (RegisterNode); None:
    # its agent serves none.
    proxy_url: str | None = None

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
    region: str | None = None  # pinned by a regional resource (R-RES-1): the owner's region
    fraction: Decimal | None = None  # R-SCHED-4
    cpu_count: int = 0  # a CPU-only worker's CPUs (gpu_types empty, gpu_count 0), R-JOB-2
    secrets: bool = False  # it carries secrets (env values, attached keys): sealed nodes only
    # Its base environment (R-JOB-7): only a node that offers it; None (a customer image, or
    # a job stored before it was kept): any node.
    environment: BaseEnvironment | None = None

    def shape(self) -> tuple[object, ...]:
        """What placement depends on, besides the job's identity."""
        return (
            self.owner,
            self.gpu_types,
            self.gpu_count,
            self.max_price,
            self.region,
            self.fraction,
            self.cpu_count,
            self.secrets,
            self.environment,
        )

    @property
    def size(self) -> int:
        """How much of a node it needs: its GPUs, or a CPU-only worker's CPUs."""
        return self.cpu_count or self.gpu_count


@dataclass(frozen=True)
class Placement:
    node: NodeView
    gpu_indices: tuple[int, ...]
    rate: Decimal  # what this worker pays per hour per GPU (or CPU) it holds
    charge: str  # "usage" | "market"
    rate_per_gpu_hour: Decimal = Decimal(0)
    shares: int = 0  # shares of gpu_indices[0] for a fractional worker; 0: whole GPUs
    cpus: int = 0  # a CPU-only worker's CPUs (no GPU; `rate` per CPU-hour)

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
    if node.allow_public_jobs and node.price_per_gpu_hour is not None and node.verified:
        return node.price_per_gpu_hour, "market"
    return None


def cpu_rate_for(node: NodeView, owner: str) -> tuple[Decimal, str] | None:
    """The CPU-hour rate `owner` pays on `node` for a CPU-only worker, or None."""
    if node.owner == owner:
        return catalog().usage_fee_per_cpu_hour, "usage"
    if node.simulated:
        return None  # a development node: its owner's jobs only, as for GPU jobs
    if node.allow_public_jobs and node.price_per_cpu_hour is not None and node.verified:
        return node.price_per_cpu_hour, "market"
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
    if req.cpu_count:
        if not node.cpus:
            return NO_CPUS
    elif node.gpu_model not in req.gpu_types:
        return f"no {' or '.join(req.gpu_types)}"
    if req.region is not None and (node.region != req.region or node.owner != req.owner):
        # A region is its owner's (names are unique per owner only): a pin is to a region of
        # the job's owner, never to another account's region of the same name (R-RES-1).
        return f"not in pinned region {req.region}"
    priced = cpu_rate_for(node, req.owner) if req.cpu_count else rate_for(node, req.owner)
    if priced is None and node.simulated:
        if req.cpu_count:
            return "another account's simulated node (its owner's jobs only)"
        return "another account's node with simulated GPUs"
    price = node.price_per_cpu_hour if req.cpu_count else node.price_per_gpu_hour
    if priced is None and node.allow_public_jobs and price is not None and not node.verified:
        return NOT_VERIFIED
    if priced is None:
        return "another account's node, region not open to public jobs"
    rate = priced[0]
    if req.max_price is not None and rate > req.max_price:
        return f"{_fmt(rate)} > max price {_fmt(req.max_price)}"
    if req.secrets and node.sealing_key is None:
        return UNSEALED
    if req.environment is not None and not node.environments.offers(req.environment):
        return no_environment(req.environment)
    if req.cpu_count and node.cpus < req.cpu_count:
        return f"offers {node.cpus} CPUs to CPU-only jobs, job needs {req.cpu_count}"
    if len(node.gpu_indices) < req.gpu_count:
        return f"has {len(node.gpu_indices)} GPUs, job needs {req.gpu_count}"
    holder = (reserved or {}).get(node.node_id)
    if holder is not None and holder != req.job_id:
        return "held for an older waiting job"
    if req.cpu_count:
        if node.free_cpus < req.cpu_count:
            return f"busy ({node.free_cpus} of {node.cpus} CPUs free, needs {req.cpu_count})"
        return None
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
    priced = cpu_rate_for(node, req.owner) if req.cpu_count else rate_for(node, req.owner)
    assert priced is not None
    rate, charge = priced
    own = 0 if node.owner == req.owner else 1
    if req.cpu_count:
        key = (own, rate, node.free_cpus, node.node_id)
        return key, Placement(
            node=node, gpu_indices=(), rate=rate, charge=charge, cpus=req.cpu_count
        )
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
            if node.state != REMOVED:
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
    """Every node but removed ones, counted under the reason that rules it out (for a
    waiting worker)."""
    reasons: Counter[str] = Counter()
    for node in nodes:
        if node.state != REMOVED:
            reasons[rule_out(req, node, reserved) or "free now"] += 1
    return NoPlacement(reasons)
