"""Item 5 of issue 15: what an idle node agent costs, next to an idle slurmd.

The machine's load is measured first with nothing of ours running (`--settle-s`: what the
other users of the machine cost), then the system starts as `just up` does with K idle
agents (simulated 8 GPUs each); once every node answers and `--settle-s` passed, each agent's
CPU (its own and its reaped children's times, psutil) and RSS are measured over
`--idle-window-s`, with the services' CPU (the heartbeats they handle) and the machine's.
With `--slurm`, the harness then starts K slurmd with one job and `--keep`, and the same is
measured of its idle slurmd (slurm.idle_slurmd).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import slurm
from cpuacct import CpuGroups, machine_cpu
from fleetstack import MODULES, AgentSpec, Fleet, connect_admin

ACCOUNT = "idlebench"
REPO = Path(__file__).resolve().parents[2]


async def machine_window(seconds: float) -> dict[str, float]:
    busy0, _ = machine_cpu()
    await asyncio.sleep(seconds)
    busy1, _ = machine_cpu()
    return {
        "busy_cores": round((busy1 - busy0) / seconds, 3),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def _cpu_rss(pid: int) -> tuple[float, float]:
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        return t.user + t.system + t.children_user + t.children_system, p.memory_info().rss
    except psutil.Error:
        return 0.0, 0.0


async def measure_agents(fleet: Fleet, groups: CpuGroups, window_s: float) -> dict[str, Any]:
    pids = [p.pid for p in fleet.agents if p.pid is not None]
    before = {pid: _cpu_rss(pid)[0] for pid in pids}
    services0 = groups.read()
    machine = await machine_window(window_s)
    services1 = groups.read()
    after = {pid: _cpu_rss(pid) for pid in pids}
    cpu = [max(0.0, after[p][0] - before[p]) / window_s * 100 for p in pids]
    rss = [after[p][1] / 2**20 for p in pids]
    return {
        "window_s": window_s,
        "node_agent": slurm.per_process(cpu, rss),
        "all_agents_cpu_pct": round(sum(cpu), 2),
        "services_cpu_pct": {
            g: round((services1[g] - services0.get(g, 0.0)) / window_s * 100, 2)
            for g in services1
            if g != "node-agents"
        },
        "machine_with_agents": machine,
    }


async def run(a: argparse.Namespace, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    k = a.idle_agents
    out: dict[str, Any] = {"kind": "idle", "settings": {"idle_agents": k, "cpus": os.cpu_count()}}
    log(f"machine before anything of ours: {a.settle_s:.0f}s")
    out["machine_before"] = await machine_window(a.settle_s)
    groups = CpuGroups(f"gpufleet-idlebench-{os.getpid()}")
    fleet = Fleet(root, on_start=groups.add)
    try:
        await fleet.start_servers()
        fleet.start_services(MODULES)
        await fleet.wait_services_up()
        specs = [
            AgentSpec(f"idle-{i:03d}", ACCOUNT, {"GPUFLEET_ALLOW_BARE_PROCESSES": "own-jobs"})
            for i in range(k)
        ]
        await fleet.start_agents(specs)
        admin = await connect_admin(fleet)
        loop = asyncio.get_running_loop()
        t = loop.time()
        await fleet.wait_nodes_up(admin, [s.minion for s in specs], limit_s=600)
        out["all_up_after_s"] = round(loop.time() - t, 1)
        log(f"{k} agents up after {out['all_up_after_s']}s; settling {a.settle_s:.0f}s")
        await asyncio.sleep(a.settle_s)
        out["gpufleet"] = await measure_agents(fleet, groups, a.idle_window_s)
        await admin.close()
    finally:
        fleet.stop()
        groups.close()
    if a.slurm:
        harness, why = slurm.find_harness(a.slurm_harness, REPO)
        if harness is None:
            out["slurm"] = {"measured": False, "why": why}
        else:
            log(f"idle slurmd: {harness} -n {k} -m 1 --keep")
            base = slurm.own_base()
            try:
                out["slurm"] = await asyncio.to_thread(
                    slurm.idle_slurmd, harness, base, k, a.idle_window_s
                )
            finally:
                slurm.remove_base(base, a.keep)
    return out
