"""The node agent's worker runtime, end to end: containers (podman) versus bare processes.

    uv run python benchmarks/runtime/bench_runtime.py [--nodes 10] [--jobs 400]
    just bench-runtime --jobs 2000        # the issue's size (long on 2 cores: see README)

A benchmark, not a test (`just test` never runs it). It starts its own nats-server
(JetStream, authentication on) and embedded MongoDB (nx-27017) on free ports, the
provisioner and the scheduler as their own processes (`python -m ...`, as in production),
and 2 x `--nodes` node agents (`python -m gpufleet_node_agent`, each enrolled with a join
token) with simulated GPUs (GPUFLEET_SIMULATED_GPUS: a file of 8 x RTX 3090 each):

- `bare` nodes belong to account `rbbare` and run with GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs:
  that account's jobs (its own) run as bare supervised host processes;
- `container` nodes belong to account `rbctr` and run with the agent's default (no opt-in):
  that account's jobs run in podman containers (the base image, cached).

A simulated node serves only its owner's jobs, so each account's jobs land on its own nodes:
both modes run in the same run, against the same servers and scheduler, one after the other.
Jobs are submitted as a user of the account (SubmitJob on `<subject>.<account>`).

1. `latency`: `--latency-jobs` jobs (`true`) one at a time (the next one submitted when the
   previous one is finished); per job, from the submit request: WorkerPlaced arrives,
   WorkerStarted arrives (the node says the worker runs), the job's JobStateChanged to
   `running` (the scheduler recorded it) and to `finished`. p50/p90/p99/max.
2. `throughput`: `--jobs` jobs (`true`) submitted at once (256 requests in flight) onto the
   mode's nodes (8 GPUs each, so 8 x nodes at a time); jobs finished per second = jobs /
   (last `finished` - first submit). CPU: the whole machine's busy time (/proc/stat) during
   the phase, and that less the idle baseline measured before; and per process (scheduler,
   provisioner, nats-server, mongod, the mode's agents with their waited-for children, i.e.
   supervisors or `podman` CLI calls) from /proc/<pid>/stat. conmon and the containers are
   not children of anything we start, so only the machine-wide figure includes them.
3. `podman_breakdown`: the pieces of one container's life, timed alone (the agent's exact
   `podman run -d` argv, built by its own podman_args, for a worker directory made here):
   `podman run -d`, `podman ps` (one per watch round), `podman inspect`, `podman rm`, and
   the bare CLI start (`podman version`), wall and CPU (this process's waited-for children).

Everything prints as JSON; `--json FILE` (default results/bench_runtime.json) keeps it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    JobSpec,
    JobStateChanged,
    SubmitJob,
    WorkerPlaced,
    WorkerStarted,
)
from gpufleet_devstack import EmbeddedMongo, NatsServer, ServiceProcess, identities, wait_for_async
from gpufleet_node_agent.baseimage import default_containers_conf, podman_env
from gpufleet_node_agent.podman_args import PodmanConfig, container_spec, run_argv

HERE = Path(__file__).parent
GPUS_PER_NODE = 8
MODES = {
    # mode: (the nodes' owner and the jobs' account, the agents' runtime setting)
    "bare": ("rbbare", "own-jobs"),
    "container": ("rbctr", "no"),
}
TICKS = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def stats_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50_ms": round(pct(ms, 0.5)),
        "p90_ms": round(pct(ms, 0.9)),
        "p99_ms": round(pct(ms, 0.99)),
        "max_ms": round(max(ms)) if ms else float("nan"),
    }


# --- CPU accounting -------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS, idle / TICKS


def proc_cpu(pid: int | None) -> float:
    """utime + stime of `pid` and of its waited-for children, seconds (0 when gone)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = stat[stat.rindex(")") + 2 :].split()
    return sum(int(x) for x in f[11:15]) / TICKS


# --- the system -----------------------------------------------------------------------


def sim_inventory(path: Path) -> Path:
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-sim-3090-bench-0000-0000-{i:012d}",
            "nvml_name": "NVIDIA GeForce RTX 3090",
            "memory_mb": 24576,
            "pcie_gen": 4,
            "pcie_width": 16,
        }
        for i in range(GPUS_PER_NODE)
    ]
    # Enough for the provisioner's R-NODE-4 checks (else the node stays out of service).
    hardware = {
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
    }
    path.write_text(json.dumps({"gpus": gpus, "hardware": hardware}))
    return path


@dataclass
class System:
    root: Path
    nodes: int
    poll_s: float
    nats: NatsServer = field(init=False)
    mongo: EmbeddedMongo = field(init=False)
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    agents: dict[str, list[ServiceProcess]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nats = NatsServer(self.root / "nats")
        self.mongo = EmbeddedMongo(self.root / "mongo")

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            GPUFLEET_NATS_URL=self.nats.url,
            GPUFLEET_MONGO_URL=self.mongo.url,
            GPUFLEET_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        return env

    def minion(self, mode: str, i: int) -> str:
        return f"rb-{mode}-{i:02d}"

    async def start(self) -> None:
        self.nats.start()
        self.mongo.start()
        for name, module in (
            ("provisioner", "gpufleet_provisioner"),
            ("scheduler", "gpufleet_scheduler"),
        ):
            env = {**self.base_env(), **identities.service_env(self.nats, name)}
            proc = ServiceProcess(
                name, [sys.executable, "-m", module], env, self.root / "logs" / f"{name}.log"
            )
            proc.start()
            self.services[name] = proc
        inventory = sim_inventory(self.root / "8x-rtx3090.json")
        for mode, (account, bare) in MODES.items():
            self.agents[mode] = []
            for i in range(self.nodes):
                minion = self.minion(mode, i)
                state = self.root / "agents" / minion
                env = self.base_env()
                env.update(
                    GPUFLEET_MINION_ID=minion,
                    GPUFLEET_ACCOUNT=account,
                    GPUFLEET_AGENT_STATE_DIR=str(state),
                    GPUFLEET_SIMULATED_GPUS=str(inventory),
                    GPUFLEET_ALLOW_BARE_PROCESSES=bare,
                    GPUFLEET_WORKER_POLL_S=str(self.poll_s),
                )
                env.update(await identities.prepare_node(self.nats, minion, state, account))
                proc = ServiceProcess(
                    minion,
                    [sys.executable, "-m", "gpufleet_node_agent"],
                    env,
                    self.root / "logs" / f"{minion}.log",
                )
                proc.start()
                self.agents[mode].append(proc)

    def stop(self) -> None:
        for procs in self.agents.values():
            for p in procs:
                p.stop(timeout=10)
        for p in reversed(list(self.services.values())):
            p.stop(timeout=10)
        self.mongo.stop()
        self.nats.stop()
        # A container an agent had not removed yet (they are all ended by now).
        env = podman_env(default_containers_conf())
        for procs in self.agents.values():
            for p in procs:
                ids = subprocess.run(
                    ["podman", "ps", "-aq", "--filter", f"label=gpufleet.minion={p.name}"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
                if ids:
                    subprocess.run(["podman", "rm", "-f", *ids], env=env, check=False)

    def cpu_by_process(self, mode: str) -> dict[str, float]:
        out = {name: proc_cpu(p.pid) for name, p in self.services.items()}
        out["nats-server"] = proc_cpu(self.nats.pid)
        out["mongod"] = proc_cpu(self.mongo.pid)
        out["agents"] = sum(proc_cpu(p.pid) for p in self.agents[mode])
        return out


# --- watching the events --------------------------------------------------------------


class Watch:
    """Arrival time (perf_counter) of each job's events, by job id: `placed`, `started`
    (WorkerStarted), `running` and `finished`/`failed` (JobStateChanged)."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self.waiters: dict[str, asyncio.Event] = {}
        self.ended: set[str] = set()

    def _mark(self, job_id: str, what: str) -> None:
        self.at.setdefault(job_id, {}).setdefault(what, time.perf_counter())

    async def placed(self, msg: Any) -> None:
        self._mark(json.loads(msg.data)["job_id"], "placed")

    async def started(self, msg: Any) -> None:
        self._mark(json.loads(msg.data)["job_id"], "started")

    async def state(self, msg: Any) -> None:
        body = json.loads(msg.data)
        job_id, state = body["job_id"], body["state"]
        self._mark(job_id, state)
        if state in ("finished", "failed", "cancelled"):
            self.ended.add(job_id)
            if job_id in self.waiters:
                self.waiters[job_id].set()

    async def subscribe(self, nc: Any) -> None:
        await nc.subscribe(WorkerPlaced.SUBJECT, cb=self.placed)
        await nc.subscribe(WorkerStarted.SUBJECT.format(minion_id="*"), cb=self.started)
        await nc.subscribe(JobStateChanged.SUBJECT, cb=self.state)

    async def wait_ended(self, job_id: str, limit_s: float) -> None:
        if job_id in self.ended:
            return
        ev = self.waiters.setdefault(job_id, asyncio.Event())
        await asyncio.wait_for(ev.wait(), limit_s)


def payload(name: str) -> bytes:
    spec = JobSpec.model_validate(
        {"name": name, "gpu_types": ["RTX 3090"], "max_price": "1.0", "command": ["true"]}
    )
    return SubmitJob(spec=spec).to_bytes()


async def submit(nc: Any, account: str, body: bytes) -> tuple[str, float]:
    t = time.perf_counter()
    reply = await nc.request(subjects.as_account(SubmitJob.SUBJECT, account), body, timeout=60)
    data = json.loads(reply.data)
    if "id" not in data:
        raise RuntimeError(f"submit refused: {data}")
    return str(data["id"]), t


# --- the phases -----------------------------------------------------------------------


async def latency(nc: Any, account: str, watch: Watch, n: int) -> dict[str, Any]:
    spans: dict[str, list[float]] = {
        k: [] for k in ("placed", "started", "running", "finished", "started_to_finished")
    }
    failed = 0
    for i in range(n):
        job_id, t0 = await submit(nc, account, payload(f"lat{i}"))
        await watch.wait_ended(job_id, 120)
        at = watch.at[job_id]
        if "finished" not in at:
            failed += 1
            continue
        for k in ("placed", "started", "running", "finished"):
            if k in at:
                spans[k].append(at[k] - t0)
        if "started" in at:
            spans["started_to_finished"].append(at["finished"] - at["started"])
    return {
        "jobs": n,
        "failed": failed,
        **{f"submit_to_{k}": stats_ms(v) for k, v in spans.items() if k != "started_to_finished"},
        "worker_started_to_job_finished": stats_ms(spans["started_to_finished"]),
    }


async def throughput(
    sysm: System, nc: Any, mode: str, watch: Watch, m: int, idle_cores: float
) -> dict[str, Any]:
    account = MODES[mode][0]
    bodies = [payload(f"tp{i}") for i in range(m)]  # made before the clock starts
    sem = asyncio.Semaphore(256)
    ids: list[str] = []

    async def one(i: int) -> None:
        async with sem:
            job_id, _ = await submit(nc, account, bodies[i])
            ids.append(job_id)

    procs0 = sysm.cpu_by_process(mode)
    busy0, _ = machine_cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(m)))
    t_submitted = time.perf_counter() - t0
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(*(watch.wait_ended(j, 1e9) for j in ids)), max(600.0, m * 2.0)
        )
    busy1, _ = machine_cpu()
    procs1 = sysm.cpu_by_process(mode)
    done = [watch.at[j]["finished"] for j in ids if "finished" in watch.at.get(j, {})]
    elapsed = (max(done) if done else time.perf_counter()) - t0
    wall = time.perf_counter() - t0
    busy = busy1 - busy0
    return {
        "jobs": m,
        "nodes": sysm.nodes,
        "gpus": sysm.nodes * GPUS_PER_NODE,
        "finished": len(done),
        "not_finished": m - len(done),
        "all_submitted_s": round(t_submitted, 2),
        "elapsed_s": round(elapsed, 1),
        "jobs_finished_per_s": round(len(done) / elapsed, 2),
        "machine_cpu_busy_cores": round(busy / wall, 2),
        "machine_cpu_s_per_job": round(busy / max(1, len(done)), 3),
        "machine_cpu_s_per_job_less_idle": round((busy - idle_cores * wall) / max(1, len(done)), 3),
        "cpu_s_per_job_by_process": {
            k: round((procs1[k] - procs0[k]) / max(1, len(done)), 4) for k in procs1
        },
    }


async def idle_baseline(seconds: float) -> float:
    busy0, _ = machine_cpu()
    await asyncio.sleep(seconds)
    busy1, _ = machine_cpu()
    return (busy1 - busy0) / seconds


# --- podman, piece by piece -----------------------------------------------------------


def timed(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    """(wall, CPU of the waited-for children) seconds of one command; it must succeed."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {res.stderr.decode(errors='replace')}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def podman_breakdown(root: Path, n: int) -> dict[str, Any]:
    conf = default_containers_conf()
    env = podman_env(conf)
    config = PodmanConfig(containers_conf=conf)
    parts: dict[str, list[tuple[float, float]]] = {
        k: [] for k in ("version", "image_exists", "run_detached", "ps", "inspect", "rm", "total")
    }
    minion = f"rb-breakdown-{uuid.uuid4().hex[:6]}"
    ps = ["podman", "ps", "--all"]
    for i in range(n):
        placement = uuid.uuid4().hex
        wdir = root / "breakdown" / placement
        wdir.mkdir(parents=True)
        for sub in ("mnt/opt/ml/input", "mnt/opt/ml/models", "mnt/opt/ml/checkpoint", "output"):
            (wdir / sub).mkdir(parents=True, exist_ok=True)
            os.chown(wdir / sub, config.uid, config.uid)
        spec = {
            "placement_id": placement,
            "job_id": f"jbd{i}",
            "job_name": "bd",
            "worker": 0,
            "command": ["true"],
            "gpu_indices": [0],
            "mounts": [],
        }
        c = container_spec(spec, wdir, minion, config)
        t_all = 0.0
        for key, argv, cwd in (
            ("version", ["podman", "version"], None),
            ("image_exists", ["podman", "image", "exists", config.image], None),
            ("run_detached", run_argv(c, "podman"), wdir),
            ("ps", [*ps, "--filter", f"label=gpufleet.minion={minion}", "--format", "json"], None),
        ):
            w, cpu = timed(argv, env, cwd)
            parts[key].append((w, cpu))
            if key != "version":
                t_all += w
        # Wait for `true` to end (as the agent does, a round later), then inspect and remove.
        subprocess.run(["podman", "wait", c.name], env=env, capture_output=True, check=False)
        for key, argv in (
            ("inspect", ["podman", "inspect", "--type", "container", c.name]),
            ("rm", ["podman", "rm", "--force", c.name]),
        ):
            w, cpu = timed(argv, env)
            parts[key].append((w, cpu))
            t_all += w
        parts["total"].append((t_all, 0.0))
    out: dict[str, Any] = {"runs": n}
    for key, vals in parts.items():
        walls = [w for w, _ in vals]
        out[key] = {
            "wall_p50_ms": round(pct(walls, 0.5) * 1000),
            "wall_max_ms": round(max(walls) * 1000),
        }
        if key != "total":
            out[key]["cpu_ms_mean"] = round(sum(c for _, c in vals) / len(vals) * 1000)
    out["note"] = (
        "total: image_exists + run_detached + ps + inspect + rm, the podman calls of one "
        "worker's life (ps is one per watch round for all of a node's workers); cpu: the "
        "podman CLI process (and what it waited for), not conmon nor the container"
    )
    return out


# --- main -----------------------------------------------------------------------------


async def run(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    sysm = System(root, a.nodes, a.poll_s)
    version = await asyncio.to_thread(
        subprocess.run, ["podman", "--version"], capture_output=True, text=True, check=False
    )
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "podman": version.stdout.strip(),
        },
        "settings": {
            "nodes_per_mode": a.nodes,
            "gpus_per_node": GPUS_PER_NODE,
            "worker_poll_s": a.poll_s,
            "latency_jobs": a.latency_jobs,
            "throughput_jobs": a.jobs,
            "job": ["true"],
        },
    }
    await sysm.start()
    try:
        nc_admin = await nats.connect(sysm.nats.url, **sysm.nats.admin())
        watch = Watch()
        await watch.subscribe(nc_admin)
        users = {}
        for mode, (account, _) in MODES.items():
            creds = identities.user_creds(sysm.nats, account, "bench")
            users[mode] = await nats.connect(sysm.nats.url, **NatsServer.client(creds))

        async def up(minion: str) -> bool:
            try:
                reply = await nc_admin.request(subjects.node_health(minion), b"{}", timeout=2)
            except Exception:
                return False
            return bool(json.loads(reply.data).get("status") == "ok")

        for procs in sysm.agents.values():
            for p in procs:
                await wait_for_async(functools.partial(up, p.name), timeout=120, interval=0.5)
        # Warm-up: a job on every node of each mode (imports, the base image check of
        # each container agent), until they all finished.
        for mode, (account, _) in MODES.items():
            ids = []
            for i in range(a.nodes * GPUS_PER_NODE):
                for _ in range(120):
                    try:
                        job_id, _t = await submit(users[mode], account, payload(f"w{i}"))
                        break
                    except RuntimeError:
                        await asyncio.sleep(0.5)  # the scheduler does not know the nodes yet
                ids.append(job_id)
            for job_id in ids:  # TimeoutError: a node out of service? See --keep's logs
                await watch.wait_ended(job_id, 120)
            print(f"warmed up {mode}", file=sys.stderr, flush=True)

        results["latency"] = {}
        for mode, (account, _) in MODES.items():
            results["latency"][mode] = await latency(users[mode], account, watch, a.latency_jobs)
            print(json.dumps(results["latency"][mode]), file=sys.stderr, flush=True)

        idle = await idle_baseline(5.0)
        results["idle_machine_cpu_busy_cores"] = round(idle, 2)
        results["throughput"] = {}
        for mode in MODES:
            results["throughput"][mode] = await throughput(
                sysm, users[mode], mode, watch, a.jobs, idle
            )
            print(json.dumps(results["throughput"][mode]), file=sys.stderr, flush=True)
        for nc in users.values():
            await nc.close()
        await nc_admin.close()
    finally:
        sysm.stop()
    if a.breakdown:
        results["podman_breakdown"] = podman_breakdown(root, a.breakdown)
    return results


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the servers and agents are stopped on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10, help="simulated nodes per mode, 8 GPUs")
    ap.add_argument("--jobs", type=int, default=400, help="throughput jobs per mode")
    ap.add_argument("--latency-jobs", type=int, default=50, help="latency jobs per mode")
    ap.add_argument("--poll-s", type=float, default=0.5, help="GPUFLEET_WORKER_POLL_S")
    ap.add_argument("--breakdown", type=int, default=10, help="podman breakdown runs (0: none)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "bench_runtime.json")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    ap.add_argument("--modes", default=",".join(MODES), help="modes to run (comma-separated)")
    a = ap.parse_args()
    for mode in [m for m in MODES if m not in a.modes.split(",")]:
        del MODES[mode]  # e.g. `--modes bare`: the control plane's figures, no podman
    root = Path(tempfile.mkdtemp(prefix="gpufleet-rbench-"))
    t0 = time.time()
    try:
        results = asyncio.run(run(a, root))
    finally:
        if a.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    results["wall_s"] = round(time.time() - t0, 1)
    text = json.dumps(results, indent=2)
    print(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
