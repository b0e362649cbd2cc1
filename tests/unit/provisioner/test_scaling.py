"""Burst scale-up / scale-down decisions (R-SCHED-3): pure functions of plain data."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet_contracts.jobs import Demand
from gpufleet_provisioner.quota import Quota
from gpufleet_provisioner.scaling import (
    Instance,
    Region,
    ScalePolicy,
    plan_scale_down,
    plan_scale_up,
)

NOW = 1_000_000_000


def demand(job: str, worker: int = 0, **kw: Any) -> Demand:
    base: dict[str, Any] = {
        "job_id": job,
        "worker": worker,
        "owner": "acme",
        "project": "p",
        "gpu_types": ["V100"],
        "gpu_count": 1,
        "burst_allowed": True,
        "waiting_since": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return Demand(**{**base, **kw})


def quotas(v100: float = 4, cpus: float = 64, ssd: float = 3000) -> dict[str, Quota]:
    return {
        "NVIDIA_V100_GPUS": Quota("NVIDIA_V100_GPUS", v100, 0),
        "NVIDIA_T4_GPUS": Quota("NVIDIA_T4_GPUS", 4, 0),
        "CPUS": Quota("CPUS", cpus, 0),
        "LOCAL_SSD_TOTAL_GB": Quota("LOCAL_SSD_TOTAL_GB", ssd, 0),
    }


def region(name: str = "us-central1", **kw: Any) -> Region:
    return Region("acme", name, [f"{name}-a"], kw.pop("q", quotas()), **kw)


def inst(name: str, **kw: Any) -> Instance:
    base: dict[str, Any] = {
        "name": name,
        "owner": "acme",
        "region": "us-central1",
        "gpu_type": "V100",
        "gpu_count": 1,
        "state": "running",
        "created_ms": NOW - 1_000_000,
        "registered": True,
    }
    return Instance(**{**base, **kw})


POLICY = ScalePolicy(max_nodes=4, max_nodes_per_region=4, max_new_per_pass=4, idle_s=60)


def test_one_instance_per_waiting_worker() -> None:
    plan = plan_scale_up([demand("j1"), demand("j1", 1)], [], [region()], POLICY, NOW)
    assert [(p.demand, p.zone, p.gpu_type) for p in plan] == [
        ("j1/0", "us-central1-a", "V100"),
        ("j1/1", "us-central1-a", "V100"),
    ]


def test_a_worker_with_an_instance_on_the_way_gets_no_second_one() -> None:
    on_the_way = inst("gf-1", state="provisioning", demand="j1/0")
    assert plan_scale_up([demand("j1")], [on_the_way], [region()], POLICY, NOW) == []
    gone = inst("gf-1", state="preempted", demand="j1/0")  # lost: burst again
    assert len(plan_scale_up([demand("j1")], [gone], [region()], POLICY, NOW)) == 1


def test_not_allowed_or_other_accounts_do_not_burst() -> None:
    d = [demand("j1", burst_allowed=False), demand("j2", owner="other")]
    assert plan_scale_up(d, [], [region()], POLICY, NOW) == []


def test_quota_limits_the_burst() -> None:
    demands = [demand(f"j{i}") for i in range(4)]
    plan = plan_scale_up(demands, [], [region(q=quotas(v100=2))], POLICY, NOW)
    assert [p.demand for p in plan] == ["j0/0", "j1/0"]
    # no CPU quota: nothing (R-REG-3)
    assert plan_scale_up(demands, [], [region(q=quotas(cpus=0))], POLICY, NOW) == []


def test_first_gpu_type_that_fits_and_next_region() -> None:
    d = demand("j1", gpu_types=["A100 40GB", "T4"])
    plan = plan_scale_up([d], [], [region()], POLICY, NOW)
    assert plan[0].gpu_type == "T4"
    full = region("us-central1", q=quotas(v100=0))
    plan = plan_scale_up([demand("j2")], [], [full, region("europe-west4")], POLICY, NOW)
    assert plan[0].region == "europe-west4"


def test_pinned_region_only() -> None:
    d = demand("j1", region="europe-west4")
    plan = plan_scale_up([d], [], [region(), region("europe-west4")], POLICY, NOW)
    assert [p.region for p in plan] == ["europe-west4"]
    assert plan_scale_up([demand("j1", region="on-prem")], [], [region()], POLICY, NOW) == []


def test_policy_limits_nodes_and_pace() -> None:
    demands = [demand(f"j{i}") for i in range(6)]
    assert len(plan_scale_up(demands, [], [region()], ScalePolicy(max_new_per_pass=2), NOW)) == 2
    two_alive = [inst("a"), inst("b")]
    policy = ScalePolicy(max_nodes=3, max_new_per_pass=10)
    assert len(plan_scale_up(demands, two_alive, [region()], policy, NOW)) == 1
    per_region = ScalePolicy(max_nodes=10, max_nodes_per_region=1, max_new_per_pass=10)
    plan = plan_scale_up(demands, [], [region(), region("europe-west4")], per_region, NOW)
    assert sorted(p.region for p in plan) == ["europe-west4", "us-central1"]


def test_oldest_demand_first() -> None:
    old = demand("late", waiting_since=datetime(2025, 1, 1, tzinfo=UTC))
    plan = plan_scale_up([demand("j1"), old], [], [region()], ScalePolicy(max_new_per_pass=1), NOW)
    assert plan[0].demand == "late/0"


def test_scale_down_idle_instances_only() -> None:
    instances = [
        inst("busy", busy=True),
        inst("idle-long", idle_since_ms=NOW - 61_000),
        inst("idle-short", idle_since_ms=NOW - 10_000),
        inst("starting", state="provisioning"),
    ]
    assert [d.name for d in plan_scale_down(instances, POLICY, NOW)] == ["idle-long"]


def test_scale_down_failed_and_preempted_at_once() -> None:
    instances = [inst("p", state="preempted", busy=True), inst("f", state="failed")]
    down = plan_scale_down(instances, POLICY, NOW)
    assert [(d.name, d.reason) for d in down] == [
        ("p", "instance preempted"),
        ("f", "instance failed"),
    ]


def test_min_age_and_policy_from_data() -> None:
    young = inst("young", created_ms=NOW - 5_000, idle_since_ms=NOW - 5_000)
    policy = ScalePolicy.from_doc({"idle_s": 1, "min_age_s": 30}, POLICY)
    assert policy.idle_s == 1 and policy.max_nodes == 4
    assert plan_scale_down([young], policy, NOW) == []
    assert ScalePolicy.from_doc(None, POLICY) is POLICY


def test_an_instance_is_idle_only_once_its_agent_registered() -> None:
    booting = inst("boot", registered=False, created_ms=NOW - 120_000)
    assert plan_scale_down([booting], POLICY, NOW) == []
    never = inst("never", registered=False, created_ms=NOW - 601_000)
    assert [d.reason for d in plan_scale_down([never], POLICY, NOW)] == [
        "its node agent never registered"
    ]
