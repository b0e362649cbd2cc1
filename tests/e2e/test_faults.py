"""Faults the skeleton survives, against real processes: kill -9 and restart.

After every fault: no job lost, no GPU given twice, no usage billed twice.
"""

from __future__ import annotations

import time

import pytest
from gpufleet_devstack import wait_for

from .conftest import System


def placements_per_job(system: System) -> dict[str, int]:
    """How many times each job's worker 0 was placed (from the billing ledger's view)."""
    entries = system.json("billing", "entries", "--limit", "1000")["entries"]
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["job_id"]] = counts.get(e["job_id"], 0) + 1
    return counts


def assert_gpus_never_shared(system: System, job_ids: list[str]) -> None:
    """No two workers held the same GPU of the node at overlapping times."""
    spans = []
    for job_id in job_ids:
        for w in system.job(job_id)["workers"]:
            if w["started_at"] and w["ended_at"]:
                for gpu in w["gpu_indices"]:
                    spans.append((gpu, w["started_at"], w["ended_at"], job_id))
    for gpu, start, end, job in spans:
        for gpu2, start2, end2, job2 in spans:
            if job != job2 and gpu == gpu2:
                assert end <= start2 or end2 <= start, f"GPU {gpu} shared by {job} and {job2}"


@pytest.mark.parametrize("victim", ["scheduler", "billing", "provisioner"])
def test_kill_9_of_a_service_mid_flow_loses_nothing(fresh_system: System, victim: str) -> None:
    system = fresh_system
    jobs = [system.submit("--", "sleep", "1", name=f"j{i}") for i in range(4)]
    time.sleep(0.5)  # two running, two waiting for GPUs
    system.kill(victim)
    time.sleep(1.5)  # the running ones end while the service is down
    system.restart(victim)
    for job_id in jobs:
        assert system.wait_state(job_id, "finished", "failed", timeout=60)["state"] == "finished"
    assert_gpus_never_shared(system, jobs)
    # Billing: one charge per run, whatever was redelivered or replayed.
    wait_for(lambda: set(placements_per_job(system)) >= set(jobs), timeout=20)
    assert all(n == 1 for n in placements_per_job(system).values())


def test_node_agent_restart_reattaches_a_running_worker(fresh_system: System) -> None:
    system = fresh_system
    job_id = system.submit(
        "--",
        "python",
        "-c",
        "import time; print('before'); time.sleep(4); print('after')",
        name="survivor",
    )
    system.wait_state(job_id, "running")
    system.kill("node-agent")
    time.sleep(1)
    system.restart("node-agent")
    job = system.wait_state(job_id, "finished", "failed", timeout=40)
    assert job["state"] == "finished"
    assert "after" in job["log_tail"]
    wait_for(lambda: job_id in placements_per_job(system), timeout=20)
    assert placements_per_job(system)[job_id] == 1
