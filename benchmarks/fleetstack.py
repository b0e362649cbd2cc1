"""The real gpufleet system, started for a benchmark: shared by benchmarks/runtime and
benchmarks/lifecycle (import it after `sys.path.insert(0, <benchmarks/>)`).

- `Fleet`: nats-server (JetStream, authentication on, streams applied as `just up` does)
  and nx-27017 on free ports under a run directory, the services of `just up` that a
  benchmark asks for (`python -m <module>`, each with its own credential), and simulated
  node agents (`python -m gpufleet_node_agent`, each enrolled with a join token, its GPUs
  from a simulated inventory file). `on_start(group, pid)` is told of every process it
  starts, so a caller can account for its CPU (benchmarks/cpuacct.py). `stop()` stops only
  what it started, by pid, and removes the containers of its own nodes.
- `Watch`: the arrival time of every job's and worker's events, as an operator sees them.
- `payload`/`submit`: a one-GPU job of the node owner's account, submitted as its user.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    JobSpec,
    JobStateChanged,
    SubmitJob,
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
)
from gpufleet_contracts.nodes import NodeStateChanged
from gpufleet_devstack import EmbeddedMongo, NatsServer, ServiceProcess, identities, wait_for_async
from gpufleet_devstack.children import SERVICES

GPUS_PER_NODE = 8
MODULES = {s.name: s.module for s in SERVICES if s.name != "node-agent"}  # `just up`'s services
DEFAULTS = {s.name: dict(s.defaults) for s in SERVICES}  # `just up`'s development defaults
ENDED = ("finished", "failed", "cancelled")


def pct(values: Iterable[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def stats_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 0.5)),
        "p90_ms": round(pct(ms, 0.9)),
        "p99_ms": round(pct(ms, 0.99)),
        "max_ms": round(max(ms)) if ms else float("nan"),
    }


def sim_inventory(path: Path, gpus: int = GPUS_PER_NODE) -> Path:
    """A simulated node of `gpus` x RTX 3090 whose hardware passes R-NODE-4 (else the
    provisioner keeps it out of service)."""
    inventory = {
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-sim-3090-bench-0000-0000-{i:012d}",
                "nvml_name": "NVIDIA GeForce RTX 3090",
                "memory_mb": 24576,
                "pcie_gen": 4,
                "pcie_width": 16,
            }
            for i in range(gpus)
        ],
        "hardware": {
            "drives": [
                {"name": "nvme0n1", "kind": "nvme", "size_gb": 4000},
                {"name": "nvme1n1", "kind": "nvme", "size_gb": 4000},
                {"name": "sda", "kind": "sata", "size_gb": 4000, "rotational": True},
                {"name": "sdb", "kind": "sata", "size_gb": 4000, "rotational": True},
                {"name": "sdc", "kind": "sata", "size_gb": 4000, "rotational": True},
            ],
            "tpm_version": "2.0",
            "nics": [{"name": "eth0", "speed_mbps": 10000}],
            "memory_mb": 524288,
            "cpu_cores": 64,
            "gpu_form_factor": "pcie",
        },
    }
    path.write_text(json.dumps(inventory))
    return path


@dataclass
class AgentSpec:
    """One simulated node: its minion id, its owner, its extra settings (runtime opt-in...)."""

    minion: str
    account: str
    env: dict[str, str] = field(default_factory=dict)


def _ignore(group: str, pid: int) -> None:
    return None


class Fleet:
    """Everything a benchmark started, stopped in reverse order by `stop()`."""

    def __init__(self, root: Path, on_start: Callable[[str, int], None] = _ignore) -> None:
        self.root = root
        self.on_start = on_start
        # each enrolled node reserves its log stream's 256 MiB: room for ~250 (idle) agents
        self.nats = NatsServer(root / "nats", max_file_store="64GB")
        self.mongo = EmbeddedMongo(root / "mongo")
        self.services: dict[str, ServiceProcess] = {}
        self.agents: list[ServiceProcess] = []
        self.inventory = sim_inventory(root / f"{GPUS_PER_NODE}x-rtx3090.json")

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            GPUFLEET_NATS_URL=self.nats.url,
            **self.mongo.service_env,
            GPUFLEET_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        return env

    async def start_servers(self) -> None:
        self.nats.start()
        await identities.apply_streams(self.nats)  # as `just up` does
        self.mongo.start()
        for group, pid in (("nats-server", self.nats.pid), ("database", self.mongo.pid)):
            if pid is not None:
                self.on_start(group, pid)

    def start_services(self, names: Iterable[str], extra: dict[str, str] | None = None) -> None:
        for name in names:
            env = {
                # e.g. the provisioner activates new nodes at once; spans go to <root>/traces
                **{k: v.format(run_dir=self.root) for k, v in DEFAULTS.get(name, {}).items()},
                **self.base_env(),
                **identities.service_env(self.nats, name),
                **(extra or {}),
            }
            proc = ServiceProcess(
                name,
                [sys.executable, "-m", MODULES[name]],
                env,
                self.root / "logs" / f"{name}.log",
            )
            proc.start()
            self.services[name] = proc
            if proc.pid is not None:
                self.on_start(name, proc.pid)

    async def start_agents(self, specs: Iterable[AgentSpec]) -> list[ServiceProcess]:
        started = []
        for spec in specs:
            state = self.root / "agents" / spec.minion
            env = self.base_env()
            env.update(
                GPUFLEET_MINION_ID=spec.minion,
                GPUFLEET_ACCOUNT=spec.account,
                GPUFLEET_AGENT_STATE_DIR=str(state),
                GPUFLEET_SIMULATED_GPUS=str(self.inventory),
                **spec.env,
            )
            env.update(await identities.prepare_node(self.nats, spec.minion, state, spec.account))
            proc = ServiceProcess(
                spec.minion,
                [sys.executable, "-m", "gpufleet_node_agent"],
                env,
                self.root / "logs" / f"{spec.minion}.log",
            )
            proc.start()
            if proc.pid is not None:
                self.on_start("node-agents", proc.pid)
            self.agents.append(proc)
            started.append(proc)
        return started

    async def wait_services_up(self, limit_s: float = 300) -> None:
        """Until every service started answers its health request (a loaded machine may take
        minutes; the agents' enrolment asks the provisioner with a shorter patience)."""
        from gpufleet_devstack.health import health_subject

        nc = await connect_admin(self, acting_for=identities.LOCAL_ACCOUNT)  # health_subject's

        async def up(name: str) -> bool:
            try:
                await nc.request(health_subject(name), b"{}", timeout=2)
            except Exception:
                return False
            return True

        try:
            for name in self.services:
                await wait_for_async(functools.partial(up, name), timeout=limit_s, interval=0.5)
        finally:
            await nc.close()

    async def wait_nodes_up(self, nc: Any, minions: Iterable[str], limit_s: float = 180) -> None:
        """Until every node answers its health request (it enrolled and connected)."""

        async def up(minion: str) -> bool:
            try:
                reply = await nc.request(subjects.node_health(minion), b"{}", timeout=2)
            except Exception:
                return False
            return bool(json.loads(reply.data).get("status") == "ok")

        for minion in minions:
            await wait_for_async(functools.partial(up, minion), timeout=limit_s, interval=0.5)

    def stop(self) -> None:
        for p in self.agents:  # all told at once: 100 agents stopping one by one take minutes
            if p.alive and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        for p in self.agents:
            p.stop(timeout=10)
        for p in reversed(list(self.services.values())):
            p.stop(timeout=10)
        self.mongo.stop()
        self.nats.stop()
        self.remove_containers()

    def remove_containers(self) -> None:
        """The containers of our own nodes an agent had not removed yet (label gpufleet.minion)."""
        if not self.agents or shutil.which("podman") is None:
            return
        from gpufleet_node_agent.baseimage import default_containers_conf, podman_env

        env = podman_env(default_containers_conf())
        for p in self.agents:
            ids = subprocess.run(
                ["podman", "ps", "-aq", "--filter", f"label=gpufleet.minion={p.name}"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.split()
            if ids:
                subprocess.run(["podman", "rm", "-f", *ids], env=env, check=False)


# --- watching the events --------------------------------------------------------------


@dataclass
class Run:
    """One placement of a job's worker: what its node and the scheduler said about it."""

    job_id: str
    minion: str = ""
    started_at: datetime | None = None  # the node's clock (WorkerStarted / WorkerFinished)
    ended_at: datetime | None = None  # the latest WorkerFinished's
    finished: list[str] = field(default_factory=list)  # states of the WorkerFinished seen


class Watch:
    """Arrival time (perf_counter) of each job's events, by job id: `placed` (WorkerPlaced),
    `started` (WorkerStarted), `worker_finished` and every JobStateChanged state (the first
    of each); every placement's run (`runs`), the job's state transitions (`states`) and the
    nodes' state changes (`node_states`: time, minion, state, previous) and how many
    workers ended otherwise than `finished`, by state and reason (`unfinished`)."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self.states: dict[str, list[str]] = {}
        self.runs: dict[str, Run] = {}
        self.node_states: list[tuple[float, str, str, str | None]] = []
        self.unfinished: Counter[str] = Counter()
        self.waiters: dict[str, asyncio.Event] = {}
        self.ended: set[str] = set()
        self.changed = asyncio.Event()  # set on every job state change

    def _mark(self, job_id: str, what: str) -> None:
        self.at.setdefault(job_id, {}).setdefault(what, time.perf_counter())

    def _run(self, body: dict[str, Any]) -> Run:
        run = self.runs.setdefault(body["placement_id"], Run(body["job_id"]))
        run.minion = str(body.get("minion_id") or run.minion)
        return run

    async def placed(self, msg: Any) -> None:
        body = json.loads(msg.data)
        self._run(body)
        self._mark(body["job_id"], "placed")

    async def started(self, msg: Any) -> None:
        body = json.loads(msg.data)
        run = self._run(body)
        run.started_at = run.started_at or datetime.fromisoformat(body["started_at"])
        self._mark(body["job_id"], "started")

    async def worker_finished(self, msg: Any) -> None:
        body = json.loads(msg.data)
        run = self._run(body)
        if body.get("started_at") and run.started_at is None:
            run.started_at = datetime.fromisoformat(body["started_at"])
        ended = datetime.fromisoformat(body["ended_at"])
        run.ended_at = max(ended, run.ended_at) if run.ended_at else ended
        run.finished.append(str(body.get("state")))
        if body.get("state") != "finished":
            self.unfinished[f"{body.get('state')}: {body.get('reason') or ''}"[:300]] += 1
        self._mark(body["job_id"], "worker_finished")

    async def state(self, msg: Any) -> None:
        body = json.loads(msg.data)
        job_id, state = body["job_id"], body["state"]
        self._mark(job_id, state)
        self.states.setdefault(job_id, []).append(state)
        if state in ENDED:
            self.ended.add(job_id)
            if job_id in self.waiters:
                self.waiters[job_id].set()
        self.changed.set()

    async def node_state(self, msg: Any) -> None:
        body = json.loads(msg.data)
        self.node_states.append(
            (time.perf_counter(), body["minion_id"], body["state"], body.get("previous"))
        )

    async def subscribe(self, nc: Any) -> None:
        await nc.subscribe(WorkerPlaced.SUBJECT, cb=self.placed)
        await nc.subscribe(WorkerStarted.SUBJECT.format(minion_id="*"), cb=self.started)
        await nc.subscribe(WorkerFinished.SUBJECT.format(minion_id="*"), cb=self.worker_finished)
        await nc.subscribe(JobStateChanged.SUBJECT, cb=self.state)
        await nc.subscribe(NodeStateChanged.SUBJECT, cb=self.node_state)

    async def wait_ended(self, job_id: str, limit_s: float) -> None:
        if job_id in self.ended:
            return
        ev = self.waiters.setdefault(job_id, asyncio.Event())
        await asyncio.wait_for(ev.wait(), limit_s)


def payload(name: str, command: list[str] | None = None) -> bytes:
    """A one-GPU RTX 3090 job (`true` unless told otherwise)."""
    spec = JobSpec.model_validate(
        {
            "name": name,
            "gpu_types": ["RTX 3090"],
            "max_price": "1.0",
            "command": command or ["true"],
        }
    )
    return SubmitJob(spec=spec).to_bytes()


async def submit(nc: Any, account: str, body: bytes, limit_s: float = 60) -> tuple[str, float]:
    """SubmitJob as a user of `account`: (job id, perf_counter when the request was sent)."""
    t = time.perf_counter()
    reply = await nc.request(subjects.as_account(SubmitJob.SUBJECT, account), body, timeout=limit_s)
    data = json.loads(reply.data)
    if "id" not in data:
        raise RuntimeError(f"submit refused: {data}")
    return str(data["id"]), t


async def connect_user(fleet: Fleet, account: str, user: str = "bench") -> Any:
    creds = identities.user_creds(fleet.nats, account, user)
    return await nats.connect(fleet.nats.url, **NatsServer.client(creds))


async def connect_admin(fleet: Fleet, acting_for: str | None = None) -> Any:
    """An operator's connection (`acting_for` an account: its requests are answered)."""
    return await nats.connect(fleet.nats.url, **fleet.nats.admin(acting_for))
