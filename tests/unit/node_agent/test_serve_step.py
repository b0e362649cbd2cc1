"""Node agent: an endpoint's worker in its container (steps/serve.py): its socket directory
and gpufleet's server code bound, its command, its port 80, no network; endpoints never run
as bare processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from gpufleet_contracts.endpoints import Route
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.serving import Serving
from gpufleet_node_agent.runtimes.oci import oci_config
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_spec, run_argv
from gpufleet_node_agent.runtimes.policy import RuntimePolicy
from gpufleet_node_agent.steps.serve import ServeStep
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

ROUTE = Route.model_validate(
    {
        "verb": "POST",
        "path": "/add",
        "file": "m.py",
        "function": "add",
        "body": [{"name": "a", "type": "integer"}],
    }
)
SCHEDULERS_COMMAND = ["python", "-m", "gpufleet_endpoint", "--port", "80"]


def spec(kind: str, command: list[str], **kw: object) -> WorkerSpec:
    routes = [ROUTE] if kind == "routes" else []
    return WorkerSpec(
        placement_id="pl-1",
        job_id="j1",
        worker=0,
        command=tuple(command),
        serving=Serving(kind=kind, routes=routes),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_a_route_endpoint_runs_gpufleets_server_on_its_socket_without_a_network() -> None:
    wd = Path("/state/workers/pl-1")
    c = container_spec(spec("routes", SCHEDULERS_COMMAND), wd, "m1", PodmanConfig())
    assert c.network == "none"
    assert c.command == [
        "python3",
        "/opt/gpufleet/run.py",
        *("--routes", "/opt/gpufleet/routes.json", "--models", "/opt/ml/models"),
        *("--uds", "/run/gpufleet/http.sock"),
    ]
    binds = {b.target: (b.host, b.read_only) for b in c.binds}
    assert binds["/run/gpufleet"] == (wd / "serve", False)
    assert binds["/opt/gpufleet"] == (wd / "endpoint", True)
    assert "PYTHONPATH" not in c.env  # the job's own, if any, left as it is
    argv = run_argv(c)
    assert argv[argv.index("--sysctl") + 1] == "net.ipv4.ip_unprivileged_port_start=0"
    oci = oci_config(c, Path("/root"), init=Path("/init"))
    assert oci["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0"}
    assert {"type": "network"} in oci["linux"]["namespaces"]


def test_a_manual_server_runs_under_the_relay_and_another_job_is_as_before() -> None:
    wd = Path("/state/workers/pl-1")
    c = container_spec(spec("server", ["nginx", "-g", "daemon off;"]), wd, "m1", PodmanConfig())
    assert c.command == [
        *("python3", "/opt/gpufleet/run.py", "relay", "--uds", "/run/gpufleet/http.sock"),
        *("--to", "127.0.0.1:80", "--", "nginx", "-g", "daemon off;"),
    ]
    plain = WorkerSpec(placement_id="pl-1", job_id="j1", worker=0, command=("train",))
    c = container_spec(plain, wd, "m1", PodmanConfig())
    assert c.command == ["train"] and c.sysctls == {}
    assert not {b.target for b in c.binds} & {"/run/gpufleet", "/opt/gpufleet"}
    assert "--sysctl" not in run_argv(c)


async def test_the_step_ships_the_routes_and_the_server_and_runs_it_as_the_container_would(
    tmp_path: Path,
) -> None:
    w = Worker(spec("routes", SCHEDULERS_COMMAND), tmp_path)
    step = ServeStep(uid=os.getuid())
    await step.setup(w)
    await step.setup(w)  # again after a restart: the same
    assert json.loads((tmp_path / "endpoint" / "routes.json").read_text()) == [
        ROUTE.model_dump(mode="json")
    ]
    lib = tmp_path / "endpoint" / "lib" / "gpufleet_endpoint"
    assert (lib / "relay.py").is_file() and (lib / "serve.py").is_file()
    assert not (lib / "__pycache__").exists()
    assert (tmp_path / "serve").stat().st_mode & 0o777 == 0o700
    # run.py is `python -m gpufleet_endpoint` with the shipped copy importable, and nothing
    # of gpufleet's own environment (here: a bare interpreter, -I)
    run = [sys.executable, "-I", str(tmp_path / "endpoint" / "run.py"), "--help"]
    run_py = (tmp_path / "endpoint" / "run.py").read_text()
    (tmp_path / "endpoint" / "run.py").write_text(
        run_py.replace("/opt/gpufleet/lib", str(tmp_path / "endpoint" / "lib"))
    )
    done = await asyncio.to_thread(subprocess.run, run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--uds" in done.stdout
    (tmp_path / "serve" / "http.sock").write_text("")
    await step.teardown(w)
    await step.teardown(w)
    assert not (tmp_path / "serve" / "http.sock").exists()


def test_an_endpoint_of_the_owners_own_runs_in_a_container_all_the_same() -> None:
    def cmd(serving: Serving | None) -> StartWorker:
        return StartWorker(
            minion_id="m1",
            job_id="j1",
            job_name="e",
            worker=0,
            command=["x"],
            gpu_indices=[],
            placement_id="pl-1",
            owner="local",
            creator="local",
            serving=serving,
        )

    policy = RuntimePolicy(node_owner="local", allow_bare=True)
    endpoint = Serving(kind="server")
    assert policy.choose(cmd(None)).runtime == "process"
    assert policy.choose(cmd(endpoint)).runtime == "podman"
    policy.container_error = "podman is not installed"
    refused = policy.choose(cmd(endpoint))
    assert refused.runtime is None and "endpoints are served from containers only" in (
        refused.refused or ""
    )
