"""The scheduler's series: queued and running jobs by region and account, the oldest wait."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from gpufleet_contracts.jobs import JobType
from gpufleet_scheduler.jobrequest import JobRequest
from gpufleet_scheduler.metrics import placement_family, queue_families

REQ = JobRequest(
    gpu_types=("H100",),
    gpu_count=1,
    max_price=Decimal(1),
    region=None,
    fraction=None,
    project="p",
    allow_burst=False,
    type=JobType.training,
)


def test_queue_and_running_by_region_and_account() -> None:
    jobs = [
        {"_id": "q1", "state": "queued", "owner": "bob", "queued_ms": 10_000},
        {"_id": "q2", "state": "queued", "owner": "bob", "queued_ms": 4_000},
        {"_id": "q3", "state": "queued", "owner": "bob", "queued_ms": 9_000},
        {
            "_id": "r1",
            "state": "running",
            "owner": "amy",
            "workers": [{"region": None}, {"region": "us"}],
        },
        {"_id": "s1", "state": "starting", "owner": "amy"},
    ]
    requests = {"q1": REQ, "q2": REQ, "q3": replace(REQ, region="eu")}
    depth, wait, running = queue_families(jobs, requests, 20_000)
    assert {(s.labels["region"], s.labels["account"]): s.value for s in depth.samples} == {
        ("", "bob"): 2,
        ("eu", "bob"): 1,
    }
    assert {(s.labels["region"], s.labels["account"]): s.value for s in wait.samples} == {
        ("", "bob"): 16.0,
        ("eu", "bob"): 11.0,
    }
    assert [(s.labels, s.value) for s in running.samples] == [
        ({"region": "us", "account": "amy"}, 1)
    ]
    placed = placement_family({"eu": 3})
    assert [(s.name, s.value) for s in placed.samples] == [("gpufleet_placements_total", 3)]
