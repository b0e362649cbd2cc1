"""The node agent alone, at fleet speed: what one node costs per job and when idle.

    uv run python benchmarks/node_agent/bench_agent.py [--jobs 200] [--modes process,podman]
    just bench-agent --jobs 200

A benchmark, not a test. No control plane: a real nats-server (JetStream, authentication
on) and the agent's own worker side (`WorkerManager` with its watch loop, `run()`, as the
agent runs it), publishing its reports to JetStream as the agent does. This isolates the
node's part of issue 15's lifecycle (the scheduler, billing and the provisioner are
measured by benchmarks/lifecycle and benchmarks/runtime).

1. `latency`: `--latency-jobs` jobs (`true`) one at a time on an idle node: from the
   StartWorker handed to the agent to WorkerStarted and WorkerFinished acknowledged by
   JetStream. p50/p90/max.
2. `throughput`: `--jobs` jobs (`true`) on one node of 8 GPUs, 8 at a time (the next one
   handed over as soon as a WorkerFinished is acknowledged, as a scheduler would). Jobs
   per second, and CPU per job: this process (the agent's worker side and its NATS
   client) plus its waited-for children (bare-process supervisors, podman CLI calls), and
   the whole machine's busy time (/proc/stat; other users of the machine count too).
   conmon, runc, the containers and conmon's `podman container cleanup` are nobody's
   waited-for children: only the machine-wide figure has them.
3. `idle`: a real `python -m gpufleet_node_agent` (2 simulated GPUs, an enrolled node's
   credential), registered, no work: its CPU over `--idle-s` seconds and its memory (RSS,
   and PSS: its share of pages shared with other processes).

Modes: `process` (bare processes: the opt-in of README "Runtime policy") and `podman`
(containers of the cached base image). Prints JSON; `--json FILE` keeps it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats
from gpufleet_bus.streams import ensure_node_consumer, ensure_node_logs, ensure_streams
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker
from gpufleet_devstack import NatsServer
from gpufleet_node_agent.baseimage import (
    BASE_IMAGE,
    default_containers_conf,
    ensure_image,
    podman_env,
)
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.worker.manager import WorkerManager
from nats.aio.client import Client

HERE = Path(__file__).parent
GPUS = 8
TICK = os.sysconf("SC_CLK_TCK")


class Recorder:
    """The agent's publisher: JetStream, ack awaited; notes when each report is acked."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.acked: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Event] = {}
        self.podman_calls: dict[str, int] = {}  # podman CLI calls by subcommand

    async def publish(
        self,
        message: bytes,
        subject: str,
        *,
        headers: dict[str, str] | None = None,
        stream: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> object:
        if stream is None:
            await self.nc.publish(subject, message, headers=headers)
            return None
        ack = await self.js.publish(
            subject, message, headers=headers, stream=stream, timeout=timeout or 5.0
        )
        msg_id = (headers or {}).get("Nats-Msg-Id", "")
        self.acked.setdefault(msg_id, time.monotonic())
        if msg_id in self.waiters:
            self.waiters[msg_id].set()
        return ack

    async def until(self, msg_id: str, within: float = 120.0) -> float:
        if msg_id not in self.acked:
            ev = self.waiters.setdefault(msg_id, asyncio.Event())
            await asyncio.wait_for(ev.wait(), within)
        return self.acked[msg_id]


def cpu_now() -> float:
    return self_cpu() + children_cpu()


def self_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def children_cpu() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy (all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def job(minion: str, gpu: int, owner: str = "local") -> StartWorker:
    pid = uuid.uuid4().hex
    return StartWorker(
        minion_id=minion,
        job_id=f"job-{pid[:10]}",
        job_name="bench",
        worker=0,
        command=["true"],
        gpu_indices=[gpu],
        placement_id=pid,
        owner=owner,
        creator=owner,
    )


def manager(mode: str, state: Path, minion: str, rec: Recorder, parallel: int = 4) -> WorkerManager:
    if mode == "process":
        return WorkerManager(state, minion, rec, gpu_indices=range(GPUS), runtime=ProcessRuntime())
    config = PodmanConfig(image=BASE_IMAGE, containers_conf=default_containers_conf())
    if parallel != 4:  # an older PodmanConfig has no `parallel`: leave it out by default
        config = PodmanConfig(
            image=BASE_IMAGE,
            containers_conf=default_containers_conf(),
            parallel=parallel,  # type: ignore[call-arg,unused-ignore]
        )
    rt = PodmanRuntime(config, minion)
    rt.node_gpus = GPUS
    calls = rec.podman_calls
    podman = rt._podman

    async def counted(*args: str, **kw: Any) -> tuple[int, bytes, bytes]:
        calls[args[0]] = calls.get(args[0], 0) + 1
        return await podman(*args, **kw)

    rt._podman = counted  # type: ignore[method-assign]
    return WorkerManager(state, minion, rec, gpu_indices=range(GPUS), runtime=rt)


async def run_mode(mode: str, server: NatsServer, root: Path, args: argparse.Namespace) -> Any:
    nc = await nats.connect(server.url, **server.admin())
    rec = Recorder(nc)
    minion = f"ba-{mode}-{uuid.uuid4().hex[:6]}"
    m = manager(mode, root / minion, minion, rec, args.podman_parallel)
    loop = asyncio.create_task(m.run())
    out: dict[str, Any] = {}
    try:
        # warm-up (podman: the image check, once per node)
        c = job(minion, 0)
        m.start(c)
        await rec.until(f"finished:{c.placement_id}")
        started, finished = [], []
        for _ in range(args.latency_jobs):
            c = job(minion, 0)
            t0 = time.monotonic()
            m.start(c)
            t_fin = await rec.until(f"finished:{c.placement_id}")
            finished.append(t_fin - t0)
            started.append(rec.acked[f"started:{c.placement_id}"] - t0)
            await asyncio.sleep(0.05)
        out["latency_ms"] = (
            {}
            if not finished
            else {
                name: {
                    "p50": round(pct(v, 0.5) * 1000),
                    "p90": round(pct(v, 0.9) * 1000),
                    "max": round(max(v) * 1000),
                }
                for name, v in (("start_to_started", started), ("start_to_finished", finished))
            }
        )
        await asyncio.sleep(1.0)
        rec.podman_calls.clear()
        cpu0, busy0, t0 = cpu_now(), machine_busy(), time.monotonic()
        own0 = self_cpu()
        todo = args.jobs

        async def slot(gpu: int) -> None:
            nonlocal todo
            while todo > 0:
                todo -= 1
                c = job(minion, gpu)
                m.start(c)
                await rec.until(f"finished:{c.placement_id}")

        await asyncio.gather(*(slot(g) for g in range(GPUS)))
        wall = time.monotonic() - t0
        cpu, busy = cpu_now() - cpu0, machine_busy() - busy0
        own = self_cpu() - own0
        out["throughput"] = {
            "jobs": args.jobs,
            "jobs_per_s": round(args.jobs / wall, 2),
            "elapsed_s": round(wall, 1),
            "agent_cpu_ms_per_job": round(cpu / args.jobs * 1000, 1),
            "agent_own_cpu_ms_per_job": round(own / args.jobs * 1000, 1),  # without children
            "machine_cpu_ms_per_job": round(busy / args.jobs * 1000, 1),
            "machine_cores_busy": round(busy / wall, 2),
        }
        if rec.podman_calls:
            out["throughput"]["podman_calls_per_job"] = {
                k: round(v / args.jobs, 2) for k, v in sorted(rec.podman_calls.items())
            }
        n_started = sum(1 for k in rec.acked if k.startswith("started:"))
        n_finished = sum(1 for k in rec.acked if k.startswith("finished:"))
        out["reports"] = {"started": n_started, "finished": n_finished}
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await nc.close()
    return out


def proc_cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def proc_mem_kb(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    pss = 0
    rollup = Path(f"/proc/{pid}/smaps_rollup")
    if rollup.exists():
        for line in rollup.read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    threads = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("Threads"))
    return {"rss_kb": rss, "pss_kb": pss, "threads": threads}


async def idle_agent(server: NatsServer, root: Path, seconds: float) -> Any:
    minion = f"ba-idle-{uuid.uuid4().hex[:6]}"
    nc = await nats.connect(server.url, **server.admin())
    await ensure_node_consumer(nc.jetstream(), minion)
    await ensure_node_logs(nc.jetstream(), minion)
    beats = await nc.subscribe(subjects.heartbeat(minion))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_NATS_URL=server.url,
        GPUFLEET_NATS_CREDS=str(server.creds("node", minion)),
        GPUFLEET_MINION_ID=minion,
        GPUFLEET_AGENT_STATE_DIR=str(root / minion),
        GPUFLEET_SIMULATED_GPUS="1",
        GPUFLEET_ALLOW_BARE_PROCESSES="own-jobs",
    )
    log = (root / f"{minion}.log").open("wb")
    t_start = time.monotonic()
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited for here
        [sys.executable, "-m", "gpufleet_node_agent"], env=env, stdout=log, stderr=log
    )
    try:
        await beats.next_msg(timeout=60)  # a heartbeat: started and connected
        startup_s = time.monotonic() - t_start
        startup_cpu = proc_cpu(proc.pid)
        await asyncio.sleep(5)
        c0, t0 = proc_cpu(proc.pid), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = proc_cpu(proc.pid) - c0, time.monotonic() - t0
        return {
            "startup_s": round(startup_s, 2),
            "startup_cpu_s": round(startup_cpu, 2),
            "idle_cpu_pct": round(cpu / wall * 100, 3),
            "idle_cpu_ms_per_min": round(cpu / wall * 60_000, 1),
            **proc_mem_kb(proc.pid),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        await nc.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        root = Path(tmp)
        server = NatsServer(root / "nats")
        server.start()
        try:
            nc = await nats.connect(server.url, **server.admin())
            await ensure_streams(nc.jetstream())
            await nc.close()
            modes = [m for m in args.modes.split(",") if m]
            if "podman" in modes:
                err = await ensure_image(BASE_IMAGE, podman_env(default_containers_conf()))
                assert err is None, err
            for mode in modes:
                result[mode] = await run_mode(mode, server, root, args)
                print(mode, json.dumps(result[mode]), flush=True)
            if args.idle_s > 0:
                result["idle"] = await idle_agent(server, root, args.idle_s)
                print("idle", json.dumps(result["idle"]), flush=True)
        finally:
            server.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="throughput jobs per mode")
    ap.add_argument("--latency-jobs", type=int, default=20)
    ap.add_argument("--modes", default="process,podman")
    ap.add_argument("--podman-parallel", type=int, default=4, help="`podman run`s at once")
    ap.add_argument("--idle-s", type=float, default=30.0, help="idle agent measure (0: none)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = ap.parse_args()
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
