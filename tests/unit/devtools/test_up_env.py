"""`just up`'s child environments (devtools/devstack): simulated GPUs are asked for explicitly."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_devstack.children import SERVICES, ServiceSpec, child_env
from gpufleet_provisioner.settings import ProvisionerSettings

AGENT = next(s for s in SERVICES if s.name == "node-agent")
STACK = {"GPUFLEET_NATS_URL": "nats://127.0.0.1:4333"}


def test_just_up_switches_simulated_gpus_on_for_its_node_agent() -> None:
    env = child_env(AGENT, {"PATH": "/bin"}, STACK, Path("/run"))
    assert env["GPUFLEET_SIMULATED_GPUS"] == "1"
    assert env["GPUFLEET_CPU_JOB_CPUS"] == "8"  # CPU-only jobs run under `just up` too
    assert env["GPUFLEET_AGENT_STATE_DIR"] == "/run/agent"
    assert env["GPUFLEET_NATS_URL"] == "nats://127.0.0.1:4333" and env["PATH"] == "/bin"


def test_the_user_may_turn_simulated_gpus_off() -> None:
    env = child_env(AGENT, {"GPUFLEET_SIMULATED_GPUS": "0"}, STACK, Path("/run"))
    assert env["GPUFLEET_SIMULATED_GPUS"] == "0"


def test_only_the_node_agent_gets_simulated_gpus() -> None:
    for spec in SERVICES:
        if spec is not AGENT:
            assert "GPUFLEET_SIMULATED_GPUS" not in child_env(spec, {}, STACK, Path("/run"))


def test_the_spec_and_the_stack_win_over_our_environment() -> None:
    spec = ServiceSpec("x", "x", None, env={"GPUFLEET_REGION": "local"})
    ours = {"GPUFLEET_REGION": "eu", "GPUFLEET_NATS_URL": "nats://elsewhere:4222"}
    env = child_env(spec, ours, STACK, Path("/run"))
    assert env["GPUFLEET_REGION"] == "local"
    assert env["GPUFLEET_NATS_URL"] == "nats://127.0.0.1:4333"


def test_the_local_node_goes_with_the_stack_unless_the_user_says_otherwise() -> None:
    env = child_env(AGENT, {}, STACK, Path("/run"))
    assert env["GPUFLEET_STOP_WORKERS_ON_EXIT"] == "1"
    assert AGENT.stop_timeout > 10  # its workers' grace period, then their reports
    kept = child_env(AGENT, {"GPUFLEET_STOP_WORKERS_ON_EXIT": "0"}, STACK, Path("/run"))
    assert kept["GPUFLEET_STOP_WORKERS_ON_EXIT"] == "0"


def test_just_up_activates_new_nodes_but_a_provisioner_left_alone_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R-NODE-2: production's new node waits in maintenance for its operator; the dev stack
    (and the e2e system) activates it at once, unless the user says otherwise."""
    provisioner = next(s for s in SERVICES if s.name == "provisioner")
    env = child_env(provisioner, {}, STACK, Path("/run"))
    assert env["GPUFLEET_AUTO_ACTIVATE_NODES"] == "true"
    mine = child_env(provisioner, {"GPUFLEET_AUTO_ACTIVATE_NODES": "false"}, STACK, Path("/run"))
    assert mine["GPUFLEET_AUTO_ACTIVATE_NODES"] == "false"
    monkeypatch.delenv("GPUFLEET_AUTO_ACTIVATE_NODES", raising=False)
    assert ProvisionerSettings().auto_activate_nodes is False
