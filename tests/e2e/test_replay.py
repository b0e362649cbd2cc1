"""A full replay of the event history: what it must reproduce exactly (replay.py says which
states are derived from events and which are not).

After a mix of jobs (finished, failed, cancelled, one still running, one killed mid-flow
with the scheduler), each job's stored state is the last state the stream published for it,
each node's likewise, and a billing rebuilt on an empty database from the whole
GPUFLEET_EVENTS stream ends with exactly the live ledger's balances.
"""

from __future__ import annotations

from gpufleet_devstack import wait_for

from .conftest import System
from .invariants import stream_events, unpublished_outbox
from .replay import (
    job_states_from_events,
    ledger_balances,
    node_states_from_events,
    replay_billing,
    state_drift,
    stored_job_states,
    stored_node_states,
)


def test_replaying_the_history_reproduces_balances_job_and_node_states(
    fresh_system: System,
) -> None:
    system = fresh_system
    done = [system.submit("--", "sleep", "1", name=f"ok{i}") for i in range(3)]
    bad = system.submit("--", "sh", "-c", "exit 3", name="bad")
    system.kill("scheduler")  # mid-flow: its outbox resumes after the restart
    system.restart("scheduler")
    wait_for(lambda: system.cli("health", check=False).returncode == 0, timeout=180, interval=1)
    long = system.submit("--", "sleep", "600", name="long")
    cancelled = system.submit("--", "sleep", "600", name="cancelled")
    for job_id in [*done, bad]:
        system.wait_state(job_id, "finished", "failed", timeout=120)
    system.wait_state(long, "running", timeout=120)
    system.cli("job", "cancel", cancelled)
    system.wait_state(cancelled, "cancelled", "stopped", timeout=120)

    def no_drift() -> bool:
        if unpublished_outbox(system):
            return False
        events = stream_events(system)
        jobs = state_drift(stored_job_states(system), job_states_from_events(events))
        nodes = state_drift(stored_node_states(system), node_states_from_events(events))
        return not jobs and not nodes

    wait_for(no_drift, timeout=120, interval=1, message="stored states differ from the events")
    events = stream_events(system)
    states = job_states_from_events(events)
    assert {states[j] for j in done} == {"finished"} and states[bad] == "failed"
    assert states[long] == "running"
    assert len(node_states_from_events(events)) >= 1

    # Billing settled for every ended run, then rebuilt from nothing.
    ended = [*done, bad, cancelled]
    wait_for(lambda: len(ledger_balances(system)) > 0, timeout=120)
    wait_for(lambda: unpublished_outbox(system) == {}, timeout=120)
    live = ledger_balances(system)
    assert live and sum(live.values()) == 0, live
    assert replay_billing(system) == live, f"after {len(ended)} ended runs"
