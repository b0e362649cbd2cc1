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
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the shared fleetstack and cpuacct

from cpuacct import machine_cpu, proc_cpu  # noqa: E402
from fleetstack import (  # noqa: E402
    GPUS_PER_NODE,
    AgentSpec,
    Fleet,
    Watch,
    connect_admin,
    connect_user,
    payload,
    pct,
    stats_ms,
    submit,
)
from gpufleet_devstack import ServiceProcess  # noqa: E402
from gpufleet_node_agent.baseimage import default_containers_conf, podman_env  # noqa: E402
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_spec, run_argv  # noqa: E402
from gpufleet_node_agent.steps import disk  # noqa: E402
from gpufleet_node_agent.worker.spec import WorkerSpec  # noqa: E402

MODES = {
    # mode: (the nodes' owner and the jobs' account, the agents' runtime setting)
    "bare": ("rbbare", "own-jobs"),
    "container": ("rbctr", "no"),
}


# --- the system -----------------------------------------------------------------------


class System(Fleet):
    """The provisioner, the scheduler and `nodes` agents per mode (fleetstack.Fleet)."""

    def __init__(self, root: Path, nodes: int, poll_s: float) -> None:
        super().__init__(root)
        self.nodes = nodes
        self.poll_s = poll_s
        self.by_mode: dict[str, list[ServiceProcess]] = {}

    async def start(self) -> None:
        await self.start_servers()
        self.start_services(["provisioner", "scheduler"])
        await self.wait_services_up()
        for mode, (account, bare) in MODES.items():
            env = {
                "GPUFLEET_ALLOW_BARE_PROCESSES": bare,
                "GPUFLEET_WORKER_POLL_S": str(self.poll_s),
            }
            specs = [AgentSpec(f"rb-{mode}-{i:02d}", account, env) for i in range(self.nodes)]
            self.by_mode[mode] = await self.start_agents(specs)

    def cpu_by_process(self, mode: str) -> dict[str, float]:
        out = {name: proc_cpu(p.pid) for name, p in self.services.items()}
        out["nats-server"] = proc_cpu(self.nats.pid)
        out["mongod"] = proc_cpu(self.mongo.pid)
        out["agents"] = sum(proc_cpu(p.pid) for p in self.by_mode[mode])
        return out


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
        # The quota filesystem's directories (disk.py) as plain ones: podman's calls alone,
        # without the loop mount the agent makes before them.
        quota = [str(q.relative_to(wdir)) for q in disk.binds(wdir).values()]
        for sub in ("mnt/opt/ml/input", "mnt/opt/ml/models", "mnt/opt/ml/checkpoint", "output"):
            (wdir / sub).mkdir(parents=True, exist_ok=True)
            os.chown(wdir / sub, config.uid, config.uid)
        for sub in quota:
            (wdir / sub).mkdir(parents=True, exist_ok=True)
            os.chown(wdir / sub, config.uid, config.uid)
        spec = WorkerSpec(
            placement_id=placement,
            job_id=f"jbd{i}",
            job_name="bd",
            worker=0,
            command=("true",),
            gpu_indices=(0,),
        )
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
        nc_admin = await connect_admin(sysm)
        watch = Watch()
        await watch.subscribe(nc_admin)
        users = {mode: await connect_user(sysm, account) for mode, (account, _) in MODES.items()}
        await sysm.wait_nodes_up(nc_admin, [p.name for p in sysm.agents], limit_s=120)
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
