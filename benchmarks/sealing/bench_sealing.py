"""What sealing a worker's secrets to its node costs, per worker, beside the clear send.

A benchmark, not a test (`just test` never runs it). In one process, no servers: the
scheduler's real `placing.place_worker` (a placed worker's fields, its WorkerPlaced, its
StartWorker, the outbox row sealed with the scheduler's Fernet key: everything a placement
writes but the database round trip) into an in-memory transaction, `--workers` workers per
round, for three payloads:

- `none`:    a job without secrets (nothing sealed; the same in both);
- `typical`: 3 env values, a huggingface key, a docker registry credential (~200 bytes);
- `large`:   56 env values of 1 KB each, and the same keys (~58 KB: a spec is at most 64 KB).

`--old FILE` loads the module as it was before sealing (a copy from git history, e.g.
`git show 62831ba:services/scheduler/src/gpufleet_scheduler/placing.py > /tmp/placing_old.py`:
the secrets in StartWorker's clear fields) and alternates the two, old first, `--runs`
rounds each; the summary gives each one's median (and best) microseconds per worker. The
node's side (`gpufleet_node_agent.sealing.opened`: one X25519 and XSalsa20-Poly1305 open
and the fields validated) is timed on the boxes the current code made.

    uv run python benchmarks/sealing/bench_sealing.py --old /tmp/placing_old.py --runs 9
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from cryptography.fernet import Fernet
from gpufleet_auth.sealing import SealingKey
from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import JobSpec, StartWorker
from gpufleet_node_agent import sealing as node_sealing
from gpufleet_scheduler import placing
from gpufleet_scheduler.keyuse import WorkerSecrets
from gpufleet_scheduler.placement import NodeView, Placement
from gpufleet_store import SecretBox, Transaction

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KEY = SealingKey.generate()
NODE = NodeView(
    node_id="n-bench",
    minion_id="bench-node",
    region="local",
    owner="acme",
    state="active",
    gpu_model="RTX 3090",
    gpu_indices=(0, 1),
    free_indices=(0, 1),
    gpu_memory_mb=24576,
    sealing_key=KEY.public_key,
)
KEYS = {"huggingface": {"token": "hf_" + "x" * 37}}
AUTH = RegistryAuth(username="me", password="p" * 40)
PAYLOADS = {
    "none": WorkerSecrets(env={}),
    "typical": WorkerSecrets(
        env={"HF_HOME": "/opt/ml/hf", "WANDB_PROJECT": "demo", "API_TOKEN": "t" * 40},
        registry_auth=AUTH,
        attached=KEYS,
    ),
    "large": WorkerSecrets(
        env={f"VAR_{i}": "v" * 1024 for i in range(56)}, registry_auth=AUTH, attached=KEYS
    ),
}


def load_module(path: Path) -> ModuleType:
    """A copy of placing.py as `gpufleet_scheduler._placing_bench_old` (its relative
    imports resolve against the installed gpufleet_scheduler)."""
    name = "gpufleet_scheduler._placing_bench_old"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def job(secrets: WorkerSecrets) -> tuple[dict[str, Any], JobSpec]:
    spec = JobSpec.model_validate(
        {
            "name": "bench",
            "gpu_types": ["RTX 3090"],
            "command": ["python", "train.py"],
            "env": secrets.env,
            "environment": {"keys": sorted(KEYS)} if secrets.any else {},
        }
    )
    return {"_id": "job-bench", "name": "bench", "owner": "acme", "creator": "acme"}, spec


def round_us(module: ModuleType, secrets: WorkerSecrets, workers: int, box: SecretBox) -> float:
    """Microseconds per worker of `module.place_worker`, over `workers` workers."""
    doc, spec = job(secrets)
    d = Placement(node=NODE, gpu_indices=(0,), rate=Decimal("0.05"), charge="usage")
    slots = [("n-bench:0", 0, 0)]
    tx = Transaction(session=cast(Any, None), box=box)
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(workers):
            w: dict[str, Any] = {"index": 0, "state": "waiting"}
            module.place_worker(tx, doc, spec, w, d, slots, NOW, 1, secrets)
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
    assert len(tx.outbox) == 2 * workers  # WorkerPlaced and StartWorker each
    return elapsed / workers * 1e6


def opened_us(secrets: WorkerSecrets, workers: int, box: SecretBox) -> tuple[float, int, int]:
    """The node's side: microseconds per StartWorker opened; its size sealed and in clear."""
    doc, spec = job(secrets)
    d = Placement(node=NODE, gpu_indices=(0,), rate=Decimal("0.05"), charge="usage")
    tx = Transaction(session=cast(Any, None), box=box)
    placing.place_worker(tx, doc, spec, {"index": 0}, d, [("n-bench:0", 0, 0)], NOW, 1, secrets)
    raw = tx.outbox[-1]["payload"]
    payload = box.open(raw) if tx.outbox[-1].get("sealed") else raw
    cmd = StartWorker.from_bytes(payload)
    clear = cmd.model_copy(
        update={
            "env": secrets.env,
            "registry_auth": secrets.registry_auth,
            "attached_keys": secrets.attached,
            "sealed_secrets": None,
        }
    )
    t0 = time.perf_counter()
    for _ in range(workers):
        got = node_sealing.opened(cmd, KEY)
    elapsed = time.perf_counter() - t0
    assert got.env == secrets.env and got.attached_keys == secrets.attached
    return elapsed / workers * 1e6, len(payload), len(clear.to_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2000, help="workers placed per round")
    ap.add_argument("--runs", type=int, default=7, help="rounds of each implementation")
    ap.add_argument("--old", type=Path, help="a copy of placing.py from before sealing")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    args = ap.parse_args()
    box = SecretBox(Fernet.generate_key())
    impls: list[tuple[str, ModuleType]] = []
    if args.old is not None:
        impls.append(("clear (old)", load_module(args.old)))
    impls.append(("sealed (new)", placing))
    summary: dict[str, Any] = {"workers": args.workers, "runs": args.runs, "payloads": {}}
    for name, secrets in PAYLOADS.items():
        for _, module in impls:  # an untimed round of each first
            round_us(module, secrets, max(100, args.workers // 10), box)
        times: dict[str, list[float]] = {label: [] for label, _ in impls}
        for _ in range(args.runs):
            for label, module in impls:
                times[label].append(round_us(module, secrets, args.workers, box))
        medians = {label: statistics.median(t) for label, t in times.items()}
        best = {label: min(t) for label, t in times.items()}
        node_us, sealed_bytes, clear_bytes = opened_us(secrets, args.workers, box)
        summary["payloads"][name] = {
            "place_worker_us": medians,
            "place_worker_best_us": best,
            "runs_us": times,
            "node_opens_us": node_us,
            "start_worker_bytes": {"sealed": sealed_bytes, "clear": clear_bytes},
        }
        line = ", ".join(
            f"{label} {us:.1f} (best {best[label]:.1f})" for label, us in medians.items()
        )
        print(
            f"{name:8} place_worker us/worker: {line}; node opens: {node_us:.1f} us; "
            f"StartWorker {clear_bytes} B in clear, {sealed_bytes} B sealed"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
