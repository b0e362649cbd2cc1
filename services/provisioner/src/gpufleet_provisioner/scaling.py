"""Burst scaling decisions (R-SCHED-3), pure: like Bright's cm-scale, from plain data.

    plan_scale_up(demands, instances, regions, policy, now_ms)  -> [ScaleUp]
    plan_scale_down(instances, policy, now_ms)                  -> [ScaleDown]

A demand (one waiting worker no on-prem node can take, from the scheduler) gets one ephemeral
instance of its own, in the first of its owner's GCP regions (its pinned region only, when
pinned) that offers one of its GPU types within quota (R-REG-3), within the policy's limits.
A worker that already has an instance on the way gets no second one. An instance is deleted
once it has been idle (no worker) for `idle_s` after its agent registered, when its agent
never registered within `boot_timeout_s`, or at once when it failed or was preempted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet_contracts.jobs import Demand

from .quota import GcpData, Quotas, consume, fits, gcp_data, instance_needs

# Instance states the provisioner tracks (its view of Compute, from the audit log).
LIVE = frozenset({"requested", "provisioning", "running"})


@dataclass(frozen=True)
class ScalePolicy:
    """How much to burst. Stored per account on its gcp provider; these are the defaults."""

    max_nodes: int = 4  # ephemeral instances alive at once, all regions
    max_nodes_per_region: int = 4
    max_new_per_pass: int = 2  # how fast to burst: instances asked for in one decision
    idle_s: float = 300.0  # delete an instance idle this long
    min_age_s: float = 0.0  # never delete an instance younger than this
    boot_timeout_s: float = 600.0  # delete an instance whose agent never registered

    @classmethod
    def from_doc(cls, doc: Mapping[str, object] | None, default: ScalePolicy) -> ScalePolicy:
        if not doc:
            return default
        values = {k: doc[k] for k in cls.__dataclass_fields__ if doc.get(k) is not None}
        return ScalePolicy(**{**default.__dict__, **values})


@dataclass(frozen=True)
class Instance:
    name: str
    owner: str
    region: str
    gpu_type: str
    gpu_count: int
    state: str  # requested | provisioning | running | stopping | terminated | preempted | failed
    created_ms: int
    busy: bool = False  # runs a worker (from the node's heartbeats)
    idle_since_ms: int | None = None
    demand: str | None = None  # "<job_id>/<worker>" it was created for
    registered: bool = False  # its node agent registered (idle time counts from then)


@dataclass(frozen=True)
class Region:
    owner: str
    name: str
    zones: Sequence[str]
    quotas: Quotas
    active: bool = True


@dataclass(frozen=True)
class ScaleUp:
    owner: str
    region: str
    zone: str
    gpu_type: str
    gpu_count: int
    demand: str


@dataclass(frozen=True)
class ScaleDown:
    name: str
    reason: str


@dataclass
class _Counts:
    total: dict[str, int] = field(default_factory=dict)
    region: dict[tuple[str, str], int] = field(default_factory=dict)


def demand_key(d: Demand) -> str:
    return f"{d.job_id}/{d.worker}"


def plan_scale_up(
    demands: Sequence[Demand],
    instances: Sequence[Instance],
    regions: Sequence[Region],
    policy: ScalePolicy,
    now_ms: int,
    data: GcpData | None = None,
) -> list[ScaleUp]:
    data = data or gcp_data()
    live = [i for i in instances if i.state in LIVE]
    covered = {i.demand for i in live if i.demand}
    counts = _Counts()
    for i in live:
        counts.total[i.owner] = counts.total.get(i.owner, 0) + 1
        key = (i.owner, i.region)
        counts.region[key] = counts.region.get(key, 0) + 1
    quotas = {(r.owner, r.name): r.quotas for r in regions}
    plan: list[ScaleUp] = []
    for d in sorted(demands, key=lambda d: (d.waiting_since, d.job_id, d.worker)):
        if len(plan) >= policy.max_new_per_pass:
            break
        if not d.burst_allowed or demand_key(d) in covered:
            continue
        if counts.total.get(d.owner, 0) >= policy.max_nodes:
            continue
        for r in regions:
            if r.owner != d.owner or not r.active or (d.region and d.region != r.name):
                continue
            if counts.region.get((r.owner, r.name), 0) >= policy.max_nodes_per_region:
                continue
            q = quotas[(r.owner, r.name)]
            gpu_type = next((t for t in d.gpu_types if fits(t, d.gpu_count, q, data)), None)
            if gpu_type is None or not r.zones:
                continue
            plan.append(ScaleUp(d.owner, r.name, r.zones[0], gpu_type, d.gpu_count, demand_key(d)))
            quotas[(r.owner, r.name)] = consume(q, instance_needs(gpu_type, d.gpu_count, data))
            counts.total[d.owner] = counts.total.get(d.owner, 0) + 1
            counts.region[(r.owner, r.name)] = counts.region.get((r.owner, r.name), 0) + 1
            break
    return plan


def plan_scale_down(
    instances: Sequence[Instance], policy: ScalePolicy, now_ms: int
) -> list[ScaleDown]:
    out: list[ScaleDown] = []
    for i in instances:
        if i.state in {"preempted", "failed", "terminated"}:
            out.append(ScaleDown(i.name, f"instance {i.state}"))
            continue
        if i.state != "running" or i.busy:
            continue
        if not i.registered:
            if now_ms - i.created_ms >= policy.boot_timeout_s * 1000:
                out.append(ScaleDown(i.name, "its node agent never registered"))
            continue
        if now_ms - i.created_ms < policy.min_age_s * 1000:
            continue
        since = i.idle_since_ms if i.idle_since_ms is not None else i.created_ms
        idle_ms = now_ms - since
        if idle_ms >= policy.idle_s * 1000:
            out.append(ScaleDown(i.name, f"idle for {idle_ms / 1000:.0f}s"))
    return out
