"""The whole system as real processes, driven through the `gpufleet` CLI.

`System` starts nats-server, the embedded MongoDB, every service and one node agent (the
same list `just up` starts, from gpufleet_devstack.up.SERVICES), each a separate process
that a test may kill -9 and restart. `System(root, nats_cluster=3)` runs NATS as a 3-node
cluster with R3 streams instead (the compose topology in miniature).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from gpufleet_auth.creds import connect_options
from gpufleet_cli.client import request_headers
from gpufleet_cli.ops import HEALTH
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import GetJob
from gpufleet_devstack import EmbeddedMongo, NatsServer, ServiceProcess, identities, wait_for
from gpufleet_devstack.children import CONSOLE, DEVICE_AGENT
from gpufleet_devstack.cluster import NatsCluster
from gpufleet_devstack.up import NODE_NAME, SERVICES, ServiceSpec

CLI = [str(Path(sys.executable).parent / "gpufleet")]


BARE_OWN_JOBS = {"GPUFLEET_ALLOW_BARE_PROCESSES": "own-jobs"}


class System:
    def __init__(
        self,
        root: Path,
        nats_cluster: int = 1,
        agent_env: dict[str, str] | None = None,
        service_env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        # the node agent's settings: by default the operator's opt-in to bare processes
        self.agent_env = dict(BARE_OWN_JOBS if agent_env is None else agent_env)
        self.service_env = dict(service_env or {})  # every service's (not the agent's)
        # Generous start deadlines: six other Pythons share two loaded cores.
        self.cluster = (
            NatsCluster(root / "nats", nats_cluster, start_timeout=60) if nats_cluster > 1 else None
        )
        # The server whose authority mints credentials (a cluster's members share it).
        self.nats = (
            self.cluster.members[0] if self.cluster else NatsServer(root / "nats", start_timeout=60)
        )
        self.mongo = EmbeddedMongo(root / "mongo", start_timeout=60)
        self.procs: dict[str, ServiceProcess] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment of a process of the system; the CLI's is user `dev` of `local`
        (`cli_env` for another identity)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            GPUFLEET_NATS_URL=self.nats_url,
            **self.mongo.service_env,
            GPUFLEET_LOG_LEVEL="INFO",
            GPUFLEET_CONFIG_DIR=str(self.root / "cli-config"),
            PYTHONUNBUFFERED="1",
            # every job's trace sampled, its spans in <root>/traces within half a second
            GPUFLEET_TRACE_SAMPLE_RATIO="1",
            OTEL_BSP_SCHEDULE_DELAY="500",
        )
        if self.cluster is not None:
            env.update(GPUFLEET_STREAM_REPLICAS=str(len(self.cluster.members)))
        return env

    @property
    def nats_url(self) -> str:
        """Every NATS server's URL, comma-separated (one unless a cluster)."""
        return self.cluster.url if self.cluster is not None else self.nats.url

    @property
    def cli_env(self) -> dict[str, str]:
        return {**self.env, "GPUFLEET_NATS_CREDS": str(identities.user_creds(self.nats))}

    def start(self) -> None:
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.nats.start()
        self.mongo.start()
        for spec in SERVICES:
            self._spawn(spec, spec.name)
        wait_for(
            self._ready,
            timeout=180,  # generous: a loaded 2-core machine starts six Pythons slowly
            interval=0.3,
            message=f"services not healthy; logs in {self.root / 'logs'}",
        )

    def _spawn(self, spec: ServiceSpec, name: str, extra: dict[str, str] | None = None) -> None:
        """Start a process of `spec` under `name` (its log is `logs/<name>.log`), with the
        service's identity and settings and `extra` on top (a node agent's
        GPUFLEET_MINION_ID and GPUFLEET_AGENT_STATE_DIR among them)."""
        env = self.env
        for k, v in spec.defaults.items():  # as `just up` (children.child_env)
            env.setdefault(k, v.format(run_dir=self.root))
        env.update({k: v.format(run_dir=self.root) for k, v in spec.env.items()})
        env.update(identities.service_env(self.nats, spec.name))
        if spec.name == "node-agent":
            env.update(GPUFLEET_SIMULATED_GPUS="1", GPUFLEET_HEARTBEAT_S="1")
            # as `just up`: the simulated node (16 CPUs) offers 8 to CPU-only jobs
            env.update(GPUFLEET_CPU_JOB_CPUS="8")
            # Every e2e job is the node owner's (`local`): bare processes, on the
            # operator's opt-in, keep the suite fast, but in test_runtime.py (containers,
            # the default). Another account's job always runs in a container.
            env.update(self.agent_env)
        else:
            env.update(self.service_env)
        env.update(extra or {})
        if spec.name == "node-agent":
            state = Path(env["GPUFLEET_AGENT_STATE_DIR"])
            minion = env["GPUFLEET_MINION_ID"]
            env.update(asyncio.run(identities.prepare_node(self.nats, minion, state)))
        proc = ServiceProcess(
            name, [sys.executable, "-m", spec.module], env, self.root / "logs" / f"{name}.log"
        )
        proc.start()
        self.procs[name] = proc

    def add(self, name: str, service: str, extra: dict[str, str]) -> None:
        """One more process of a service, once the system runs: a standby scheduler (its
        own GPUFLEET_SCHEDULER_INSTANCE; the same service credential, so the same
        permissions), a second node agent (its own minion id and state directory; it
        enrols with a join token of its own), the web console's gateway (`gateway`), an edge
        device's agent (`device-agent`, with its device's token)."""
        spec = next(s for s in (*SERVICES, CONSOLE, DEVICE_AGENT) if s.name == service)
        self._spawn(spec, name, extra)

    def _ready(self) -> bool:
        """Every service healthy and the node active: asked in this process while it starts,
        then once through the CLI."""
        healthy = all((self.ask(HEALTH[svc], b"{}") or {}).get("status") == "ok" for svc in HEALTH)
        nodes = self.ask(subjects.rpc("provisioner", "list_nodes"), b"{}") if healthy else None
        if nodes is None or not any(
            n["minion_id"] == NODE_NAME and n["state"] == "active" for n in nodes["nodes"]
        ):
            return False
        return self.cli("health", "--json", check=False).returncode == 0

    def ask(self, base: str, payload: bytes, timeout: float = 5) -> dict[str, Any] | None:
        """An account request as the CLI makes it, from this process (the user's credential,
        its account's subject); None when nobody answers or it is refused. For polling: a CLI
        process per poll costs seconds of CPU, which a 2-core machine takes from the system
        under test."""
        creds, account = identities.user_creds(self.nats), identities.LOCAL_ACCOUNT

        async def asked() -> bytes:
            nc = await nats.connect(
                servers=self.nats_url.split(","),  # a cluster's members, as the CLI takes them
                **connect_options(creds, acting_for=account),
                connect_timeout=timeout,
                allow_reconnect=False,
            )
            try:
                subject = subjects.as_account(base, account)
                msg = await nc.request(
                    subject, payload, timeout=timeout, headers=request_headers(base)
                )
                return bytes(msg.data)
            finally:
                await nc.close()

        try:
            data = asyncio.run(asked())
        except (nats.errors.Error, TimeoutError, OSError):
            return None  # a server or service restarting (the fault tests): asked again
        reply = json.loads(data) if data else None
        return reply if isinstance(reply, dict) and reply.get("ok") is not False else None

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop(timeout=5)
        self.mongo.stop()
        if self.cluster is not None:
            self.cluster.stop()
        else:
            self.nats.stop()

    def kill(self, name: str) -> None:
        self.procs[name].kill()

    def restart(self, name: str) -> None:
        self.procs[name].restart()

    def cli(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 90,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*CLI, *args],
            env=env if env is not None else self.cli_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"gpufleet {' '.join(args)} -> {result.returncode}\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        """Run a CLI command with --json (before any `--` COMMAND) and parse its output."""
        cut = args.index("--") if "--" in args else len(args)
        return json.loads(self.cli(*args[:cut], "--json", *args[cut:]).stdout)

    def submit(self, *args: str, name: str = "hello", gpus: int = 1) -> str:
        job = self.json(
            "job",
            "submit",
            "--name",
            name,
            "--gpu-type",
            "RTX 3090",
            "--gpu-count",
            str(gpus),
            "--max-price",
            "1.0",
            *args,
        )
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = self.json("job", "show", job_id)
        return data

    def wait_state(self, job_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
        """Poll `job show` until the job is in one of `states`; a service that is restarting
        (the CLI exits 1: nobody answered) is waited for too."""
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {"state": None}
        get = GetJob(job_id=job_id)
        while True:
            # polled from this process (`ask`); shown through the CLI once it is there
            job = self.ask(get.SUBJECT, get.to_bytes()) or job
            if job["state"] in states:
                shown = self.cli("job", "show", job_id, "--json", check=False)
                if shown.returncode == 0:
                    job = json.loads(shown.stdout)
                    if job["state"] in states:
                        return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {job['state']}, wanted {states}: {job}")
            time.sleep(0.2)

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")


def _running_system(
    tmp_path_factory: pytest.TempPathFactory,
    agent_env: dict[str, str] | None = None,
    service_env: dict[str, str] | None = None,
) -> Iterator[System]:
    system = System(tmp_path_factory.mktemp("system"), agent_env=agent_env, service_env=service_env)
    try:
        system.start()
        yield system
    finally:
        system.stop()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One system shared by a module's tests."""
    yield from _running_system(tmp_path_factory)


@pytest.fixture
def fresh_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A system of this test's own, for tests that kill and restart its processes."""
    yield from _running_system(tmp_path_factory)


@pytest.fixture
def cluster_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """A system of this test's own on a 3-node NATS cluster with R3 streams."""
    system = System(tmp_path_factory.mktemp("system"), nats_cluster=3)
    try:
        system.start()
        yield system
    finally:
        system.stop()
