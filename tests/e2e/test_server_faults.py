"""The servers under the services killed mid-flow: nats-server (JetStream file store) and the
database (nx-27017), each `kill -9`-ed while jobs are queued, running and ending, then
restarted on the same port and store. Then a 3-node NATS cluster with R3 streams (the compose
topology in miniature) loses a member, and then the leader of the event stream.

After each: every acknowledged submission ran to its end, once; its facts (queued, placed,
started, finished) and every ledger entry's event are in the stream once; every charge
balances; no GPU was given twice; no outbox message is left unpublished; and the services
took new work without being restarted (they reconnected by themselves).
"""

from __future__ import annotations

import time

from gpufleet_contracts import subjects
from gpufleet_devstack import wait_for

from .conftest import System
from .invariants import (
    charges_per_job,
    gpus_given_twice,
    history_gaps,
    ledger_drift,
    unpublished_outbox,
)

JOB = ("--", "sleep", "1")


def submit_some(system: System, n: int, prefix: str) -> list[str]:
    return [system.submit(*JOB, name=f"{prefix}{i}") for i in range(n)]


def assert_survived(system: System, jobs: list[str]) -> None:
    """Every invariant of the module docstring, once the system has settled."""
    for job_id in jobs:
        job = system.wait_state(job_id, "finished", "failed", "cancelled", timeout=120)
        assert job["state"] == "finished", job
    wait_for(lambda: set(charges_per_job(system)) >= set(jobs), timeout=60, interval=0.5)
    wait_for(lambda: not unpublished_outbox(system), timeout=60, interval=0.5)
    charges = charges_per_job(system)
    assert {j: charges[j] for j in jobs if charges[j] != 1} == {}
    assert gpus_given_twice(system, jobs) == []
    assert ledger_drift(system) == []
    assert history_gaps(system, jobs) == []


def scheduler_answers(system: System) -> bool:
    """Does the scheduler answer a user's request (`job list`)?"""
    return system.cli("job", "list", "--json", check=False, timeout=30).returncode == 0


def test_kill_9_of_nats_server_mid_flow_loses_no_acknowledged_fact(
    fresh_system: System,
) -> None:
    system = fresh_system
    jobs = submit_some(system, 3, "before")  # two run, one waits for a GPU
    system.wait_state(jobs[0], "running", "finished")
    system.nats.kill()
    time.sleep(2)  # the running ones end while the bus is gone
    system.nats.start()  # same port, same store
    # The services reconnect by themselves (a retry a second, nats-py's backoff): until
    # then a request finds no responder, as a user's would while a service restarts.
    wait_for(lambda: scheduler_answers(system), timeout=30, interval=0.5)
    jobs += submit_some(system, 1, "after")  # answered: the scheduler reconnected
    assert_survived(system, jobs)


def test_kill_9_of_the_database_mid_flow_leaves_no_half_transaction(
    fresh_system: System,
) -> None:
    system = fresh_system
    jobs = submit_some(system, 3, "before")
    system.wait_state(jobs[0], "running", "finished")
    system.mongo.kill()
    time.sleep(2)  # workers end; their facts wait in the stream for the services
    system.mongo.start()
    jobs += submit_some(system, 1, "after")
    assert_survived(system, jobs)


def stream_leader(system: System) -> str:
    import asyncio

    import nats

    async def leader() -> str:
        nc = await nats.connect(
            servers=system.nats_url.split(","), connect_timeout=5, **system.nats.admin()
        )
        try:
            info = await nc.jetstream().stream_info(subjects.STREAM_EVENTS)
            assert info.config.num_replicas == 3, info.config
            assert info.cluster is not None and info.cluster.leader
            return str(info.cluster.leader)
        finally:
            await nc.close()

    return asyncio.run(leader())


def test_a_nats_cluster_loses_a_member_then_the_stream_leader(cluster_system: System) -> None:
    system = cluster_system
    assert system.cluster is not None
    jobs = submit_some(system, 2, "a")
    leader = stream_leader(system)
    follower = next(m for m in system.cluster.members if m.server_name != leader)
    follower.kill()
    jobs += submit_some(system, 2, "b")  # while a member is down
    time.sleep(1)
    follower.start()
    system.cluster.wait_healthy()
    leader_member = system.cluster.member(stream_leader(system))
    leader_member.kill()  # the events stream elects another leader
    jobs += submit_some(system, 2, "c")
    time.sleep(1)
    leader_member.start()
    system.cluster.wait_healthy()
    assert_survived(system, jobs)
