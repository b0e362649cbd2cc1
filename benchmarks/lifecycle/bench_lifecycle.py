"""The whole job lifecycle at fleet speed (issue 15): submit -> running -> finished -> billed.

    just bench-lifecycle [--nodes 10] [--jobs 500] [--runtime bare|container] [--slurm]
    just bench-lifecycle --idle-agents 100 [--slurm]      # item 5: what an idle agent costs
    just bench-lifecycle --trace-ratios 0,0.1,1 --rounds 2  # what one trace per job costs

A benchmark, not a test. It starts the system as `just up` does (nats-server with
authentication and JetStream, nx-27017, the five services, billing included) on free ports
in a run directory of its own, and `--nodes` simulated node agents of 8 GPUs each, owned by
one account; `--runtime bare` gives the agents the operator's opt-in
GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs (the owner's jobs run as bare processes), `container`
leaves the default (podman). After a warm-up wave, it submits `--jobs` one-GPU jobs running
`true`, as that account's user, as fast as the system accepts them (`--inflight` requests
at once), and reports what README.md lists: submit rate, started/s and finished/s, p50/p99
submit->running and submit->finished, the time from the last finish until billing's ledger
holds exactly one usage charge per run (and no run or job charged twice), CPU seconds per
job by process group, jobs run twice (at once), nodes marked lost. A run ends at
`--deadline-s` whatever happened, reports what was done, and stops everything it started.
`--slurm` then runs the Slurm harness with the same N and M (slurm.py).

JSON to results/lifecycle-<runtime>.json (or results/idle-agents.json; --json FILE), and a
markdown table to stdout.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import figures  # noqa: E402
import idle  # noqa: E402
import report  # noqa: E402
import slurm  # noqa: E402
import tracecost  # noqa: E402
from cpuacct import ConmonSampler, CpuGroups, machine_cpu, own_cpu  # noqa: E402
from fleetstack import (  # noqa: E402
    GPUS_PER_NODE,
    MODULES,
    AgentSpec,
    Fleet,
    Watch,
    connect_admin,
    connect_user,
    payload,
    submit,
)
from pymongo import AsyncMongoClient  # noqa: E402

AGENTS_ALONE = "of which the agent processes alone"  # a part of node-agents, not added
ACCOUNT = "lcbench"  # owns the nodes and submits the jobs (a simulated node runs only its owner's)
REPO = HERE.parent.parent
RUNTIMES = {"bare": "own-jobs", "container": "no"}  # GPUFLEET_ALLOW_BARE_PROCESSES


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def job_cpu_calibration(n: int = 200) -> float:
    """CPU seconds of one `true` (fork, exec, exit) started from Python: the job itself."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        subprocess.run(["true"], check=False)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / n


RUNC_CONTAINERS = "containers crun or runc started (their cgroups, exact)"
RUNC_CPUACCT = Path("/sys/fs/cgroup/cpuacct/gpufleet/cpuacct.usage")  # runc.py's parent


def runc_containers_cpu() -> float:
    """CPU seconds of every container crun or runc started (node-agent runc.py and
    cgroupv1.py: /gpufleet/<name>): cgroup v1 charges a child's time to its parents, so a
    deleted container's stays here. runc's init counts from when it joined the cgroup;
    with crun, crun itself counts too (its launcher joins the cgroups, then execs it)."""
    try:
        return int(RUNC_CPUACCT.read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


class Bench:
    def __init__(self, a: argparse.Namespace, root: Path) -> None:
        self.a = a
        self.root = root
        self.groups = CpuGroups(f"gpufleet-lifebench-{os.getpid()}")
        self.fleet = Fleet(root, on_start=self.groups.add)
        self.watch = Watch()
        self.conmon = ConmonSampler()
        self.sent: dict[str, float] = {}  # job id -> submit request sent (perf_counter)

    def agent_env(self) -> dict[str, str]:
        env = {"GPUFLEET_ALLOW_BARE_PROCESSES": RUNTIMES[self.a.runtime]}
        env.update(self.trace_env())
        env.update(kv.split("=", 1) for kv in self.a.agent_env)
        return env

    def trace_env(self) -> dict[str, str]:
        """Spans to <root>/traces as `just up` writes them; the ratio of `--trace-ratios`."""
        env = {"GPUFLEET_TRACE_DIR": str(self.root / "traces")}
        if self.a.trace_ratio is not None:
            env["GPUFLEET_TRACE_SAMPLE_RATIO"] = str(self.a.trace_ratio)
        return env

    async def start(self) -> tuple[Any, Any]:
        await self.fleet.start_servers()
        self.fleet.start_services(MODULES, self.trace_env())  # all five, as `just up`
        await self.fleet.wait_services_up()
        specs = [AgentSpec(f"lc-{i:03d}", ACCOUNT, self.agent_env()) for i in range(self.a.nodes)]
        await self.fleet.start_agents(specs)
        admin = await connect_admin(self.fleet)
        await self.watch.subscribe(admin)
        await self.fleet.wait_nodes_up(admin, [s.minion for s in specs])
        user = await connect_user(self.fleet, ACCOUNT)
        log(f"{self.a.nodes} nodes up ({self.a.runtime}); CPU by {self.groups.method}")
        return admin, user

    async def warm_up(self, user: Any) -> int:
        """A wave of jobs (imports, the container image check of each node), all ended."""
        ids = []
        for i in range(self.a.warmup):
            for _ in range(240):
                try:
                    ids.append((await submit(user, ACCOUNT, payload(f"warm{i}")))[0])
                    break
                except (RuntimeError, TimeoutError):
                    await asyncio.sleep(0.5)  # the scheduler does not know the nodes yet
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(self.watch.wait_ended(j, 1e9) for j in ids)), 180
            )
        ended = sum(1 for j in ids if j in self.watch.ended)
        log(f"warm-up: {ended}/{len(ids)} jobs ended")
        return ended

    async def submit_all(self, user: Any, acked: dict[str, float], errors: list[str]) -> None:
        bodies = [payload(f"lc{i}") for i in range(self.a.jobs)]  # made before the clock
        sem = asyncio.Semaphore(self.a.inflight)

        async def one(body: bytes) -> None:
            async with sem:
                try:
                    job_id, t = await submit(user, ACCOUNT, body)
                except Exception as exc:  # counted, never retried: the rate is the system's
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    return
                self.sent[job_id] = t
                acked[job_id] = time.perf_counter()

        await asyncio.gather(*(one(b) for b in bodies))

    async def sampler(self, every: float = 0.5) -> None:
        while True:
            self.groups.sample()
            if self.a.runtime == "container":
                await asyncio.to_thread(self.conmon.sample, set(self.sent))
            await asyncio.sleep(every)

    def cpu_now(self) -> dict[str, float]:
        cpu = self.groups.read()
        cpu[AGENTS_ALONE] = sum(own_cpu(p.pid) for p in self.fleet.agents if p.pid is not None)
        if self.a.runtime == "container":
            cpu["conmon + containers (sampled, lower bound)"] = self.conmon.total()
            cpu[RUNC_CONTAINERS] = runc_containers_cpu()
        t = os.times()
        cpu["this benchmark (submit, watch, sample)"] = t.user + t.system
        return cpu

    async def measure(self, user: Any) -> dict[str, Any]:
        acked: dict[str, float] = {}
        errors: list[str] = []
        cpu0, (busy0, _) = self.cpu_now(), machine_cpu()
        sampling = asyncio.create_task(self.sampler())
        t0 = time.perf_counter()
        deadline = t0 + self.a.deadline_s
        submitting = asyncio.create_task(self.submit_all(user, acked, errors))
        next_note = t0 + 10
        while time.perf_counter() < deadline:
            done = submitting.done() and all(j in self.watch.ended for j in self.sent)
            if done:
                break
            self.watch.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.watch.changed.wait(), 1.0)
            if time.perf_counter() > next_note:
                next_note += 10
                ended = sum(1 for j in self.sent if j in self.watch.ended)
                log(f"{time.perf_counter() - t0:.0f}s: {len(self.sent)} submitted, {ended} ended")
        t_end = time.perf_counter()
        cpu1, (busy1, _) = self.cpu_now(), machine_cpu()
        timed_out = not submitting.done()
        submitting.cancel()
        sampling.cancel()
        result = figures.lifecycle(self.sent, self.watch.at, t0)
        finished = result["finished"]
        wall = t_end - t0
        result["deadline_reached"] = t_end >= deadline
        result["submit"] = {
            "accepted": len(self.sent),
            "errors": len(errors),
            "error_examples": sorted(set(errors))[:3],
            "still_submitting_at_deadline": timed_out,
            "all_accepted_s": round(max(acked.values()) - t0, 2) if acked else None,
            "per_s": figures.rate(len(acked), max(acked.values()) - t0 if acked else None),
        }
        jobs = set(self.sent)
        result["doubled"] = figures.doubled(self.watch.runs.values(), jobs, datetime.now(UTC))
        result["jobs_requeued"] = figures.requeued(self.watch.states, jobs)
        result["nodes_lost"] = figures.nodes_lost(self.watch.node_states, t0)
        result["workers_not_finished"] = dict(self.watch.unfinished.most_common(10))
        result["cpu"] = {
            "method": self.groups.method,
            "window_s": round(wall, 1),
            "machine_busy_cores": round((busy1 - busy0) / wall, 2),
            "machine_cpu_s_per_job": round((busy1 - busy0) / max(1, finished), 4),
            "by_group": figures.cpu_per_job(cpu0, cpu1, finished, busy1 - busy0, AGENTS_ALONE),
        }
        result["billing"] = await self.billing(t_end)
        return result

    def expected_runs(self) -> dict[str, str]:
        """placement -> job of every run its node said started and ended."""
        return {
            p: r.job_id
            for p, r in self.watch.runs.items()
            if r.started_at is not None and r.finished
        }

    async def billing(self, t_end: float) -> dict[str, Any]:
        """Poll billing's ledger until it holds exactly one usage charge per run (of the
        whole run, warm-up included), or `--billing-wait-s` passed."""
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(self.fleet.mongo.url)
        ledger = client["gpufleet_billing"]["ledger"]
        query = {"account": ACCOUNT, "kind": "usage_fee"}
        fields = {"placement_id": 1, "job_id": 1, "stage": 1, "_id": 0}
        t_last = max(
            (at["finished"] for at in self.watch.at.values() if "finished" in at), default=t_end
        )
        cpu0 = self.groups.read().get("billing", 0.0)
        check = figures.check_ledger(self.expected_runs(), [])
        try:
            while True:
                expected = self.expected_runs()
                if await ledger.count_documents(query) >= len(expected):
                    entries = await ledger.find(query, fields).to_list(None)
                    check = figures.check_ledger(expected, entries)
                    if check.exact or check.entries > len(expected):
                        break
                if time.perf_counter() > t_end + self.a.billing_wait_s:
                    break
                await asyncio.sleep(0.25)
        finally:
            await client.close()
        t_billed = time.perf_counter()
        return {
            "exactly_one_usage_charge_per_run": check.exact,
            "billed_after_last_finish_s": round(t_billed - t_last, 2) if check.exact else None,
            "gave_up_after_s": None if check.exact else self.a.billing_wait_s,
            **check.__dict__,
            "billing_cpu_s_while_catching_up": round(
                self.groups.read().get("billing", 0.0) - cpu0, 2
            ),
        }

    def stop(self) -> None:
        self.fleet.stop()
        self.groups.close()


def settings(a: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(a).items() if k not in ("json",)} | {
        "gpus_per_node": GPUS_PER_NODE,
        "job": ["true"],
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }


async def lifecycle(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    bench = Bench(a, root)
    out: dict[str, Any] = {"kind": "lifecycle", "settings": settings(a)}
    try:
        admin, user = await bench.start()
        out["warmup_ended"] = await bench.warm_up(user)
        out["gpufleet"] = await bench.measure(user)
        for nc in (user, admin):
            await nc.close()
    finally:
        bench.stop()
    out["gpufleet"]["job_itself_cpu_s_calibrated"] = round(job_cpu_calibration(), 5)
    return out


async def trace_costs(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The lifecycle once per ratio of `--trace-ratios`, `--rounds` times (tracecost.py)."""
    runs: list[dict[str, Any]] = []
    for n in range(a.rounds):
        for ratio in tracecost.ratios(a.trace_ratios):
            log(f"round {n + 1}/{a.rounds}: sampling ratio {ratio:g} (uptime: {os.getloadavg()})")
            one = argparse.Namespace(**{**vars(a), "trace_ratio": ratio})
            run_root = root / f"round{n}-ratio{ratio:g}"
            run_root.mkdir(parents=True)
            out = await lifecycle(one, run_root)
            runs.append(tracecost.one(ratio, out, tracecost.spans_written(run_root / "traces")))
    return {
        "kind": "tracing",
        "settings": settings(a),
        "runs": runs,
        "summary": tracecost.summary(runs),
    }


def run_slurm(a: argparse.Namespace, root: Path, out: dict[str, Any]) -> None:
    harness, why = slurm.find_harness(a.slurm_harness, REPO)
    if harness is None:
        out["slurm"] = {"ran": False, "why": why}
        return
    log(f"Slurm harness: {harness} -n {a.nodes} -m {a.jobs}")
    base = slurm.own_base()
    try:
        out["slurm"] = slurm.run_harness(
            harness, base, a.nodes, a.jobs, a.slurm_mode, a.slurm_deadline_s
        )
    finally:
        slurm.remove_base(base, a.keep)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10, help="simulated node agents, 8 GPUs each")
    ap.add_argument("--jobs", type=int, default=500, help="one-GPU jobs running `true`")
    ap.add_argument("--runtime", choices=sorted(RUNTIMES), default="bare")
    ap.add_argument("--inflight", type=int, default=256, help="submit requests at once")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up jobs (default: N x 8)")
    ap.add_argument("--deadline-s", type=float, default=300, help="end of the measured phase")
    ap.add_argument("--billing-wait-s", type=float, default=60, help="after the deadline/end")
    ap.add_argument("--agent-env", action="append", default=[], metavar="K=V")
    ap.add_argument("--slurm", action="store_true", help="then the Slurm harness, same N, M")
    ap.add_argument("--slurm-harness", type=Path, default=None, help=str(slurm.DEFAULT_HARNESS))
    ap.add_argument("--slurm-mode", choices=["burst", "stream"], default="burst")
    ap.add_argument("--slurm-deadline-s", type=int, default=240)
    ap.add_argument("--idle-agents", type=int, default=0, metavar="K", help="item 5 instead")
    ap.add_argument("--settle-s", type=float, default=30, help="idle mode: before measuring")
    ap.add_argument("--idle-window-s", type=float, default=60, help="idle mode: measured")
    ap.add_argument("--trace-ratios", default=None, metavar="R,R,..", help="tracecost.py")
    ap.add_argument("--rounds", type=int, default=1, help="with --trace-ratios")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    a = ap.parse_args(argv)
    if a.warmup is None:
        a.warmup = a.nodes * GPUS_PER_NODE
    a.trace_ratio = None  # the services' default (GPUFLEET_TRACE_SAMPLE_RATIO)
    return a


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # everything started is stopped on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    a = parse()
    root = Path(tempfile.mkdtemp(prefix="gpufleet-lifebench-"))
    t0 = time.time()
    try:
        if a.idle_agents:
            out = asyncio.run(idle.run(a, root, log))
            name = "idle-agents"
        elif a.trace_ratios:
            out = asyncio.run(trace_costs(a, root))
            name = f"tracing-{a.runtime}"
        else:
            out = asyncio.run(lifecycle(a, root))
            if a.slurm:
                run_slurm(a, root, out)
            name = f"lifecycle-{a.runtime}"
    finally:
        if a.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    out["wall_s"] = round(time.time() - t0, 1)
    path = a.json or HERE / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(tracecost.markdown(out) if out["kind"] == "tracing" else report.markdown(out))
    log(f"JSON: {path}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
