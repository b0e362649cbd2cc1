"""On a node with an NVIDIA GPU and podman: the node agent's real code (NVML inventory,
gpu_access, mps, the podman runtime and the worker manager) runs CUDA jobs in containers and
says what each saw. A development check, not a test: CI has no GPU (README.md here).

    python -m gpufleet_gpucheck [--json FILE] [--no-disk-quota]

Needs: the driver, podman (+ runc), gcc and the CUDA headers (to build the probe image),
nvidia-cuda-mps-control (for the shares). Run as root, like the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gpufleet_contracts.jobs import StartWorker, WorkerFinished
from gpufleet_node_agent.baseimage import default_containers_conf, podman_env
from gpufleet_node_agent.host.gpu_access import find_driver_dir, host_access
from gpufleet_node_agent.host.inventory import read_nvml
from gpufleet_node_agent.host.mps import Mps, find_control
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.manager import WorkerManager

HERE = Path(__file__).parent
IMAGE = "localhost/gpufleet/cudacheck:1"
UID = 10000
MPS_DIR = Path("/run/gpufleet-gpucheck/mps")


class Recorder:
    """The worker manager's broker: keeps what it publishes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(
        self, message: bytes, subject: str, headers: dict[str, str] | None = None, **_: Any
    ) -> None:
        self.sent.append((subject, message, headers or {}))

    def finished(self) -> dict[str, WorkerFinished]:
        out = {}
        for _, m, h in self.sent:
            if h.get("ce-type") == WorkerFinished.TYPE:
                e = WorkerFinished.from_bytes(m)
                out[e.placement_id] = e
        return out


def build_image(env: dict[str, str]) -> None:
    """The probe (cudacheck.c, CUDA driver API) and the few host files it needs, as an image:
    the driver's libraries come from the agent's GPU access, not from the image."""
    work = Path(tempfile.mkdtemp(prefix="cudacheck-"))
    exe = work / "cudacheck"
    driver = find_driver_dir()
    subprocess.run(
        ["gcc", "-O2", "-I/usr/local/cuda/include", "-o", str(exe), str(HERE / "cudacheck.c"),
         f"-L{driver}", "-l:libcuda.so.1"],
        check=True,
    )  # fmt: skip
    root = work / "root"
    for d in ("bin", "tmp", "dev", "proc", "sys", "etc"):
        (root / d).mkdir(parents=True)
    tools = [str(exe), "/bin/sh", "/bin/ls", "/bin/cat", "/usr/bin/id"]
    for t in tools:
        shutil.copy(t, root / "bin" / Path(t).name)
    libs = set()
    for t in tools:
        out = subprocess.run(["ldd", t], capture_output=True, text=True, check=False).stdout
        libs |= {w for w in out.split() if w.startswith("/") and "libcuda" not in w}
    for lib in libs:
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, target)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(["podman", "import", "-", IMAGE], stdin=tar.stdout, env=env, check=True,
                   capture_output=True)  # fmt: skip
    tar.wait()
    shutil.rmtree(work)


def command(placement: str, gpus: list[int], shell: str, **kw: Any) -> StartWorker:
    return StartWorker(
        minion_id="gpucheck",
        job_id=f"job-{placement[:6]}",
        job_name="gpucheck",
        worker=0,
        command=["/bin/sh", "-c", shell],
        gpu_indices=gpus,
        placement_id=placement,
        **kw,
    )


async def run_all(m: WorkerManager, cmds: list[StartWorker], within: float) -> None:
    for c in cmds:
        assert m.start(c), c.placement_id
    deadline = time.monotonic() + within
    want = {c.placement_id for c in cmds}
    broker: Recorder = m.broker  # type: ignore[assignment]
    while time.monotonic() < deadline and not want <= set(broker.finished()):
        await m.poll_once()
        await asyncio.sleep(0.2)


async def run_rounds(m: WorkerManager, rounds: list[list[StartWorker]]) -> None:
    for r in rounds:
        await run_all(m, r, 240)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-disk-quota", action="store_true")
    args = ap.parse_args()
    inv = read_nvml()
    report: dict[str, Any] = {
        "inventory": inv.describe(),
        "gpus": [g.model_dump(mode="json") for g in inv.gpus],
    }
    print("agent inventory:", inv.describe())
    if not inv.gpus:
        print("no GPU: nothing to check")
        return 1
    conf = default_containers_conf()
    env = podman_env(conf)
    build_image(env)
    state = Path(tempfile.mkdtemp(prefix="gpucheck-state-"))
    gpu = host_access("auto", None)
    report["gpu_access"] = gpu.describe()
    total = gpu.gpus[0].memory_mb
    config = PodmanConfig(image=IMAGE, containers_conf=conf, memory_mb=1024, cpus=2,
                          disk_quota=not args.no_disk_quota)  # fmt: skip
    rt = PodmanRuntime(config, "gpucheck", gpu=gpu, mps=Mps(MPS_DIR, find_control(), UID))
    rt.node_gpus = len(inv.gpus)
    broker = Recorder()
    m = WorkerManager(
        state / "workers", "gpucheck", broker, gpu_indices=[g.index for g in inv.gpus], runtime=rt
    )
    half = total // 2
    ids = {k: uuid.uuid4().hex for k in ("whole", "none", "a", "b", "c", "d", "e")}
    share = {"gpu_fraction": "0.5", "gpu_memory_limit_mb": half}
    rounds = [
        [  # a whole GPU, and a worker with no GPU on the same node
            command(ids["whole"], [0], "ls /dev; id; /bin/cudacheck 4096"),
            command(ids["none"], [], "ls /dev; /bin/cudacheck 64"),
        ],
        [  # two 0.5 shares of GPU 0 at once, each within its share, holding it 8 s
            command(ids["a"], [0], f"/bin/cudacheck {half * 8 // 10} 8", **share),
            command(ids["b"], [0], f"/bin/cudacheck {half * 8 // 10} 8", **share),
        ],
        [  # two 0.5 shares: one asks for more than its share, one tries to raise its limit
            command(ids["c"], [0], f"/bin/cudacheck {half * 12 // 10}", **share),
            command(
                ids["d"],
                [0],
                f"/bin/cudacheck {half * 12 // 10}",
                env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={total}M"},
                **share,
            ),
        ],
    ]
    t0 = time.monotonic()
    asyncio.run(run_rounds(m, rounds))
    report["seconds"] = round(time.monotonic() - t0, 1)
    done = broker.finished()
    report["workers"] = {}
    for name, pid in ids.items():
        if name == "e":
            continue
        e = done.get(pid)
        report["workers"][name] = {
            "state": e.state.value if e else "not finished",
            "exit_code": e.exit_code if e else None,
            "reason": e.reason if e else None,
            "log": e.log_tail if e else "",
        }
        seen = report["workers"][name]
        print(f"--- {name}: {seen['state']} (exit {seen['exit_code']})")
        print(seen["log"].rstrip())
    logs = sorted(MPS_DIR.glob("*/log/*.log"))
    report["mps_logs"] = {str(p.relative_to(MPS_DIR)): p.read_text()[-2000:] for p in logs}
    left = subprocess.run(["pgrep", "-a", "nvidia-cuda-mps"], capture_output=True, text=True).stdout
    report["mps_processes_left"] = left.strip()
    print("MPS processes left after the workers ended:", left.strip() or "none")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
