"""`just up --data` (GPUFLEET_UP_DATA=1), as the `up` recipe runs it, with `--no-block`: the
storage servers start on their ports beside the stack, the node agent is told them, the
demo job is printed, and nothing of them is left once it stops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gpufleet_contracts.jobs import JobSpec
from gpufleet_devstack.children import SERVICES
from gpufleet_devstack.console import PlainOut
from gpufleet_devstack.processes import free_port, port_in_use
from gpufleet_devstack.stack import Stack
from gpufleet_devstack.storage.servers import StorageServers, free_storage_ports

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_node_agent_is_told_the_storage_servers(tmp_path: Path) -> None:
    ports = free_storage_ports()
    stack = Stack(PlainOut(), tmp_path, free_port(), free_port(), free_port(), ports.base)
    stack.storage = StorageServers(tmp_path / "storage", tmp_path / "logs", ports)  # not started
    for spec in SERVICES:
        env = stack.service_env(spec)
        if spec.name == "node-agent":
            assert env["GPUFLEET_STAGING_ALLOW"] == ",".join(
                f"127.0.0.1:{p}" for p in ports.named.values()
            )
            assert env["GPUFLEET_STAGING_CA_FILE"] == str(tmp_path / "storage" / "tls" / "ca.pem")
        else:
            assert "GPUFLEET_STAGING_ALLOW" not in env


def test_up_data_starts_prints_and_stops_the_storage_servers(tmp_path: Path) -> None:
    ports = free_storage_ports()
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_RUN_DIR=str(run_dir),
        GPUFLEET_NATS_PORT=str(free_port()),
        GPUFLEET_MONGO_PORT=str(free_port()),
        GPUFLEET_REGISTRY_PORT=str(free_port()),
        GPUFLEET_STORAGE_PORT=str(ports.base),
        GPUFLEET_CONFIG_DIR=str(tmp_path / "config"),
        GPUFLEET_UP_DATA="1",
        COLUMNS="250",
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet_devstack.up", "--no-block"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "storage servers up" in said and "stopping the storage servers" in said
    job_file = run_dir / "storage" / "demo-job.yaml"
    assert f"job submit -f {job_file}" in said
    spec = JobSpec.model_validate(yaml.safe_load(job_file.read_text()))
    assert spec.input_data is not None and spec.model is not None
    assert spec.input_data.endpoint == f"http://127.0.0.1:{ports.base}"
    assert spec.model.path == f"http://127.0.0.1:{ports.named['git-http']}/demo-model.git"
    assert (run_dir / "storage" / "git" / "demo-model.git" / "HEAD").is_file()
    for port in ports.named.values():
        assert not port_in_use(port), f"port {port} is still taken after the stack stopped"
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert left.stdout == "", f"left running: {left.stdout}"


@pytest.mark.parametrize("busy", ["s3", "ftp"])
def test_up_data_refuses_a_busy_storage_port(tmp_path: Path, busy: str) -> None:
    ports = free_storage_ports()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_RUN_DIR=str(tmp_path / "run"),
        GPUFLEET_NATS_PORT=str(free_port()),
        GPUFLEET_MONGO_PORT=str(free_port()),
        GPUFLEET_REGISTRY_PORT=str(free_port()),
        GPUFLEET_STORAGE_PORT=str(ports.base),
        GPUFLEET_CONFIG_DIR=str(tmp_path / "config"),
    )
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports.named[busy]))
        squatter.listen()
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet_devstack.up", "--no-block", "--data"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert f"port {ports.named[busy]} for the storage servers is busy" in done.stdout
    assert "GPUFLEET_STORAGE_PORT" in done.stdout
