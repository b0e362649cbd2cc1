"""Simulated node agents for emulated instances: one `python -m gpufleet_node_agent` each.

When an instance becomes RUNNING its "boot" starts an agent with the instance name as minion
id, the instance's region, the owner account from the instance's `gpufleet-account` label and
a simulated inventory matching its accelerators. Deleting or stopping the instance stops it
(SIGTERM); preemption kills it (SIGKILL), as a vanished machine would.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from .state import ACCELERATORS, InstanceRec

log = logging.getLogger("gpufleet.gcp_emulator")


# Node agent settings an instance's image carries, from the emulator's own environment.
IMAGE_SETTINGS = ("GPUFLEET_ALLOW_BARE_PROCESSES",)


class AgentLauncher:
    def __init__(self, nats_url: str, state_dir: Path, heartbeat_s: float = 1.0) -> None:
        self.nats_url = nats_url
        self.state_dir = state_dir
        self.heartbeat_s = heartbeat_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def inventory(self, rec: InstanceRec) -> list[dict[str, object]]:
        gpus: list[dict[str, object]] = []
        for acc in rec.body.get("guestAccelerators") or []:
            short = str(acc.get("acceleratorType", "")).rsplit("/", 1)[-1]
            _, nvml_name, memory_mb = ACCELERATORS[short]
            for _ in range(int(acc.get("acceleratorCount", 1))):
                i = len(gpus)
                gpus.append(
                    {
                        "index": i,
                        "uuid": f"GPU-gce-{rec.id}-{i}",
                        "nvml_name": nvml_name,
                        "memory_mb": memory_mb,
                        "pcie_gen": 3,
                        "pcie_width": 16,
                    }
                )
        return gpus

    def __call__(self, rec: InstanceRec, what: str) -> None:
        if what == "start":
            self.start(rec)
        else:
            self.stop(rec.name, kill=(what == "kill"))

    def start(self, rec: InstanceRec) -> None:
        home = self.state_dir / rec.name
        home.mkdir(parents=True, exist_ok=True)
        inv = home / "inventory.json"
        inv.write_text(json.dumps(self.inventory(rec)))
        labels = rec.body.get("labels") or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        env.update(
            GPUFLEET_NATS_URL=self.nats_url,
            GPUFLEET_MINION_ID=rec.name,
            GPUFLEET_NODE_NAME=rec.name,
            GPUFLEET_REGION=rec.region,
            GPUFLEET_ACCOUNT=str(labels.get("gpufleet-account", "local")),
            GPUFLEET_SIMULATED_GPUS=str(inv),
            GPUFLEET_AGENT_STATE_DIR=str(home / "agent"),
            GPUFLEET_HEARTBEAT_S=str(self.heartbeat_s),
            PYTHONUNBUFFERED="1",
        )
        # The instance image's runtime choice (containers unless the emulator was told).
        for name in IMAGE_SETTINGS:
            if name in os.environ:
                env[name] = os.environ[name]
        # The startup script of a real image reads the join token from the metadata server.
        items = (rec.body.get("metadata") or {}).get("items") or []
        token = next((i.get("value") for i in items if i.get("key") == "gpufleet-join-token"), None)
        if token:
            env["GPUFLEET_JOIN_TOKEN"] = str(token)
        logf = (home / "agent.log").open("ab")
        self.procs[rec.name] = subprocess.Popen(
            [sys.executable, "-m", "gpufleet_node_agent"],
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.info("instance %s booted: node agent pid %d", rec.name, self.procs[rec.name].pid)

    def stop(self, name: str, kill: bool = False) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            # The whole session: the agent and the workers it started, as a vanishing VM.
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)
