"""The compose stack's node agent can run jobs (issue 25): its image has the container
runtime, its service the privileges of a node agent, and the agent's runtime policy, given
the settings it starts with in that container, puts the node owner's jobs and other
accounts' in containers. On the services' image (uid 10001, no podman) it refuses them all.

No Docker engine here: docker-compose.yml and deploy/Dockerfile are read as compose and
Docker read them (files.py), and the agent's own start-up code is run on what they say."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import StartWorker
from gpufleet_node_agent.__main__ import adopt_owner
from gpufleet_node_agent.agent import container_runtime, runtime_policy
from gpufleet_node_agent.runtimes.policy import Decision, RuntimePolicy, container_problem
from gpufleet_node_agent.settings import AgentSettings

from .files import (
    COMPOSE,
    GPU_OVERLAY,
    ROOT,
    Stage,
    Unset,
    built_stage,
    environment,
    interpolate,
    is_root,
    load_compose,
    service,
    stages,
)

# What an operator must set before `docker compose up` (the file refuses to start without).
OPERATOR_ENV = {"GPUFLEET_NATS_JETSTREAM_KEY": "k" * 64, "GPUFLEET_SECRET_KEY": "s" * 44}
AGENT = "node-agent"
# What the agent's container runtime calls (services/node-agent/README.md, "Container
# runtime", "Disk quota"; baseimage.py, disk.py, runc.py, cgroupv1.py), by Debian package.
RUNTIME_PACKAGES = {
    "podman",
    "crun",
    "runc",
    "catatonit",
    "mmdebstrap",
    "slirp4netns",
    "nftables",  # package builds' egress table (buildnet.py)
    "uidmap",
    "e2fsprogs",
    "mount",
    "util-linux",
}


@pytest.fixture
def model() -> dict[str, Any]:
    return load_compose(env=OPERATOR_ENV)


def job(owner: str, creator: str | None = None) -> StartWorker:
    return StartWorker(
        minion_id="compose-node-1",
        job_id="job-1",
        job_name="hello",
        worker=0,
        command=["python3", "-c", "print('hi')"],
        gpu_indices=[0],
        placement_id="pl-1",
        owner=owner,
        creator=creator or owner,
    )


def enrolled_account(model: Mapping[str, Any]) -> str:
    """The account the bootstrap's join token is for: the node's owner once enrolled."""
    command = " ".join(service(model, "bootstrap")["command"])
    found = re.search(r"node-token\s+--account\s+(\S+)", command)
    assert found, command
    return found[1]


def image_path(stage: Stage, tmp: Path) -> str:
    """A PATH holding what the stage's apt-get installs put on the image's (a program per
    package: podman, crun, runc, mmdebstrap are named as their packages)."""
    bin_dir = tmp / f"{stage.name}-bin"
    bin_dir.mkdir()
    for package in stage.apt_packages:
        program = bin_dir / package
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    return str(bin_dir)


def started_policy(
    env: Mapping[str, str],
    stage: Stage,
    user: str | None,
    owner: str,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> RuntimePolicy:
    """The runtime policy of an agent started with `env` in an image built from `stage`,
    running as `user`: its settings from the environment (__main__), the node's owner from
    its enrolment (adopt_owner), the policy and whether podman works as prepare() makes them,
    with the image's PATH and `user`'s uid (root's podman only: container_problem)."""
    for name in list(os.environ):
        if name.startswith("GPUFLEET_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = AgentSettings()
    adopt_owner(settings, owner)
    runtime = container_runtime(settings)
    policy = runtime_policy(settings)
    podman_env = {**runtime.env, "PATH": image_path(stage, tmp)}
    uid = 0 if is_root(user) else 10001
    policy.container_error = container_problem(runtime.config.podman, podman_env, uid)
    return policy


def agent_policy(
    model: Mapping[str, Any], svc: Mapping[str, Any], tmp: Path, mp: pytest.MonkeyPatch
) -> RuntimePolicy:
    stage = built_stage(svc)
    user = svc.get("user") or stage.user
    return started_policy(environment(svc), stage, user, enrolled_account(model), tmp, mp)


# --- the policy on the compose node agent ---------------------------------------------


def test_the_compose_node_agent_runs_the_owners_and_other_accounts_jobs_in_containers(
    model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = enrolled_account(model)
    policy = agent_policy(model, service(model, AGENT), tmp_path, monkeypatch)
    assert policy.node_owner == owner == "local"
    assert not policy.allow_bare
    assert policy.container_error is None
    assert policy.choose(job(owner)) == Decision("podman")  # the owner's own: a container too
    assert policy.choose(job("acme")) == Decision("podman")  # another account's
    assert policy.choose(job(owner, creator="acme")) == Decision("podman")  # federated


def test_on_the_services_image_the_node_agent_would_refuse_every_job(
    model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node agent as compose ran it before: the services' image (no podman, uid 10001)."""
    services_image = {**service(model, AGENT), "build": service(model, "scheduler")["build"]}
    services_image.pop("user")
    policy = agent_policy(model, services_image, tmp_path, monkeypatch)
    assert policy.container_error is not None
    assert "podman is not installed" in policy.container_error
    for cmd in (job(enrolled_account(model)), job("acme")):
        decision = policy.choose(cmd)
        assert decision.runtime is None
        assert decision.refused and "no working container runtime" in decision.refused


def test_the_policy_refuses_a_node_agent_that_is_not_root(
    model: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_service_user = {**service(model, AGENT), "user": "10001:10001"}
    policy = agent_policy(model, as_service_user, tmp_path, monkeypatch)
    assert policy.choose(job("acme")).runtime is None


# --- the image ------------------------------------------------------------------------


def test_the_node_agent_image_installs_the_container_runtime_and_runs_as_root(
    model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(model, AGENT)
    stage = built_stage(svc)
    assert stage.name == "node-agent"
    missing = RUNTIME_PACKAGES - stage.apt_packages
    assert not missing, missing
    assert "bookworm" in stage.base  # the Debian release the agent's runtime is tested on
    assert is_root(stage.user) and is_root(svc["user"])
    # gpufleet's containers.conf, where the settings name it and where the agent finds it
    # by itself (baseimage.default_containers_conf: deploy/podman/ above its source tree)
    conf = environment(svc)["GPUFLEET_PODMAN_CONTAINERS_CONF"]
    assert ("deploy/podman/containers.conf", conf) in stage.copies
    assert conf == f"{stage.workdir}/deploy/podman/containers.conf"
    assert ("services/", "services/") in stages()["build"].copies  # the source, in /app
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!deploy/podman/containers.conf" in ignore  # sent to the build


def test_the_services_image_is_unchanged_uid_10001_without_a_container_runtime(
    model: dict[str, Any],
) -> None:
    stage = built_stage(service(model, "scheduler"))
    assert stage.name == "runtime"
    assert stage.user == "gpufleet:gpufleet"
    assert any("--uid 10001" in run for run in stage.runs)
    assert not stage.apt_packages
    assert list(stages())[-1] == "runtime"  # `docker build` without --target builds it


# --- the service ----------------------------------------------------------------------


def test_the_node_agent_service_has_a_node_agents_privileges(model: dict[str, Any]) -> None:
    svc = service(model, AGENT)
    env = environment(svc)
    assert svc["privileged"] is True
    assert svc["cgroup"] == "host"
    assert "cap_drop" not in svc and "security_opt" not in svc
    volumes = {v.split(":")[1]: v for v in svc["volumes"]}
    assert volumes["/dev"] == "/dev:/dev"  # loop devices made after the start, GPU nodes
    assert volumes["/sys/fs/cgroup"] == "/sys/fs/cgroup:/sys/fs/cgroup:rw"
    for target in ("/var/lib/containers", env["GPUFLEET_AGENT_STATE_DIR"]):
        volume = volumes[target].split(":")[0]
        assert volume in model["volumes"], f"{target}: a named volume"
    assert any(t.split(":")[0] == "/run" for t in svc["tmpfs"])
    assert svc["networks"] == ["nodes"]
    assert env["GPUFLEET_WORKER_RUNTIME"] == "podman"
    assert env["GPUFLEET_ALLOW_BARE_PROCESSES"] == "no"


def test_only_the_node_agent_is_privileged(model: dict[str, Any]) -> None:
    for name, svc in model["services"].items():
        if name == AGENT:
            continue
        assert not svc.get("privileged"), name
        assert svc.get("cgroup") != "host", name
        assert not any(str(v).startswith("/dev") for v in svc.get("volumes", [])), name
        if "build" in svc:  # the gpufleet services: uid 10001, no capability
            assert built_stage(svc).name == "runtime", name
            assert "user" not in svc, name
            assert svc["cap_drop"] == ["ALL"], name
            assert "no-new-privileges:true" in svc["security_opt"], name


def test_the_gpu_overlay_hands_the_node_agent_the_hosts_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_compose(COMPOSE, GPU_OVERLAY, env=OPERATOR_ENV)
    svc = service(model, AGENT)
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert [d["driver"] for d in devices] == ["nvidia"]
    assert "gpu" in devices[0]["capabilities"]
    policy = agent_policy(model, svc, tmp_path, monkeypatch)
    settings = AgentSettings()  # as that agent read its environment
    assert settings.simulated_gpus is None  # NVML's GPUs
    assert settings.gpu_access == "devices"
    assert policy.choose(job("acme")) == Decision("podman")


# --- reading the files ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A:-x}", {}, "x"),
        ("${A:-x}", {"A": ""}, "x"),
        ("${A-x}", {"A": ""}, ""),
        ("${A:-x}", {"A": "1"}, "1"),
        ("${A}/$A", {"A": "v"}, "v/v"),
        ("$${A}", {"A": "v"}, "${A}"),
    ],
)
def test_interpolation_as_compose_does_it(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


def test_compose_refuses_to_start_without_the_operators_keys() -> None:
    with pytest.raises(Unset, match="GPUFLEET_NATS_JETSTREAM_KEY"):
        load_compose()
