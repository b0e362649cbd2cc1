"""The Slurm side: the peer harness (`../shared/peers/slurm/run.sh`, its README) run with the
same N and M, its summary read back; and idle `slurmd`s, measured like idle node agents.

The harness keeps everything under its BASE directory and listens on CTLD_PORT and
SLURMD_PORT0..+N-1. We give it a BASE of our own run directory and free ports, so it never
meets another run of it (its clean-up stops only what points into its BASE, by pid).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from cpuacct import machine_cpu
from fleetstack import pct
from gpufleet_devstack import port_in_use

DEFAULT_HARNESS = Path("../shared/peers/slurm/run.sh")  # relative to the repository root


def own_base() -> Path:
    """A directory for the harness's BASE, open to all as munged requires (harness_env)."""
    return Path(tempfile.mkdtemp(prefix="gpufleet-lifebench-slurm-"))


def remove_base(base: Path, keep: bool) -> None:
    if not keep:
        shutil.rmtree(base, ignore_errors=True)


def find_harness(path: Path | None, repo: Path) -> tuple[Path | None, str]:
    """(run.sh, '') or (None, why not)."""
    candidate = path or (repo / DEFAULT_HARNESS)
    candidate = candidate if candidate.is_absolute() else (repo / candidate)
    if not candidate.is_file():
        return None, f"no Slurm harness at {candidate} (--slurm-harness PATH)"
    if os.geteuid() != 0:
        return None, "the Slurm harness runs its daemons as root (and may apt-get install Slurm)"
    return candidate.resolve(), ""


def free_ports(count: int) -> tuple[int, int]:
    """(slurmctld port, first of `count` consecutive slurmd ports), all free a moment ago."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count - 2)
        ports = range(base, base + count + 1)
        if not any(port_in_use(p) for p in ports):
            return base, base + 1
    raise RuntimeError(f"no {count + 1} consecutive free TCP ports")


def harness_env(base: Path, nodes: int, deadline_s: int) -> dict[str, str]:
    """munged wants every directory above its socket open to all (execute): `base` is made
    0755 (a directory of its own: the gpufleet run directory, with credentials, stays 0700)."""
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    ctld, slurmd0 = free_ports(nodes)
    return {
        **os.environ,
        "BASE": str(base),
        "CTLD_PORT": str(ctld),
        "SLURMD_PORT0": str(slurmd0),
        "DEADLINE_S": str(deadline_s),
    }


_PATTERNS = {
    "submit_per_s": r"submission.*?= ([\d.]+) jobs/s",
    "all_started_s": r"all started in ([\d.]+)s",
    "started_per_s": r"all started in [\d.]+s \(([\d.]+) jobs/s\)",
    "all_completed_s": r"all completed in ([\d.]+)s",
    "completed_per_s": r"all completed in [\d.]+s \(([\d.]+) jobs/s\)",
    "first_wave_s": r"first wave: \d+ jobs .*? within ([\d.]+)s",
    "cpu_busy_pct": r"mean CPU busy during measurement: ([\d.]+)%",
}


def parse_summary(text: str) -> dict[str, Any]:
    """The figures of the harness's printed summary (README: 'How it works')."""
    out: dict[str, Any] = {}
    for key, pattern in _PATTERNS.items():
        m = re.search(pattern, text)
        if m:
            out[key] = float(m.group(1))
    last = [ln for ln in text.splitlines() if ln.startswith("slurm: ")]
    if last:
        out["summary"] = last[-1]
    return out


def run_harness(
    harness: Path, base: Path, nodes: int, jobs: int, mode: str, deadline_s: int
) -> dict[str, Any]:
    """`run.sh -n N -m M --mode MODE`; its figures, or why there are none."""
    argv = ["bash", str(harness), "-n", str(nodes), "-m", str(jobs), "--mode", mode]
    try:
        env = harness_env(base, nodes, deadline_s)
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=deadline_s + 120, check=False
        )
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return {"ran": False, "why": f"{type(exc).__name__}: {exc}"}
    text = done.stdout + "\n" + done.stderr
    figures = parse_summary(done.stdout)
    if done.returncode != 0 or "completed_per_s" not in figures:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]
        return {"ran": False, "why": f"run.sh exited {done.returncode}: " + " | ".join(tail)}
    (base / "harness-output.txt").write_text(text)
    return {"ran": True, "nodes": nodes, "jobs": jobs, "mode": mode, **figures}


def idle_slurmd(harness: Path, base: Path, nodes: int, window_s: float) -> dict[str, Any]:
    """Start the harness's cluster of `nodes` slurmd with one job (`--keep`), then measure
    each idle slurmd's CPU % and RSS over `window_s`, and slurmctld's; then stop it."""
    env = harness_env(base, nodes, 240)
    argv = ["bash", str(harness), "-n", str(nodes), "-m", "1", "--keep"]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=360)
        if done.returncode != 0:
            tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-3:]
            return {
                "measured": False,
                "why": f"run.sh exited {done.returncode}: {' | '.join(tail)}",
            }
        time.sleep(5)  # the one job is gone; let the daemons settle
        return measure_daemons(base, window_s)
    finally:
        subprocess.run(
            ["bash", str(harness), "--stop"], env=env, capture_output=True, timeout=120, check=False
        )


def measure_daemons(base: Path, window_s: float) -> dict[str, Any]:
    """slurmd and slurmctld processes whose command line points into `base`."""
    procs: dict[str, list[psutil.Process]] = {"slurmd": [], "slurmctld": [], "munged": []}
    for p in psutil.process_iter(["name", "cmdline"]):
        name, line = p.info["name"], " ".join(p.info["cmdline"] or [])
        if name in procs and str(base) in line:
            procs[name].append(p)
    if not procs["slurmd"]:
        return {"measured": False, "why": "no slurmd of ours running after run.sh --keep"}
    before = {p.pid: _cpu(p) for ps in procs.values() for p in ps}
    busy0, _ = machine_cpu()
    time.sleep(window_s)
    busy1, _ = machine_cpu()
    out: dict[str, Any] = {
        "measured": True,
        "window_s": window_s,
        "machine_busy_cores": round((busy1 - busy0) / window_s, 3),
    }
    for name, ps in procs.items():
        cpu = [max(0.0, _cpu(p) - before[p.pid]) / window_s * 100 for p in ps]
        rss = [_rss(p) / 2**20 for p in ps]
        out[name] = per_process(cpu, rss)
    return out


def per_process(cpu_pct: list[float], rss_mib: list[float]) -> dict[str, Any]:
    return {
        "count": len(cpu_pct),
        "cpu_pct_mean": round(sum(cpu_pct) / len(cpu_pct), 3) if cpu_pct else None,
        "cpu_pct_p99": round(pct(cpu_pct, 0.99), 3) if cpu_pct else None,
        "rss_mib_mean": round(sum(rss_mib) / len(rss_mib), 1) if rss_mib else None,
        "rss_mib_p99": round(pct(rss_mib, 0.99), 1) if rss_mib else None,
    }


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system + t.children_user + t.children_system)


def _rss(p: psutil.Process) -> float:
    try:
        return float(p.memory_info().rss)
    except psutil.Error:
        return 0.0
