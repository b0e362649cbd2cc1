"""Edge devices through the running system and the CLI (R-DEV-1..3): a central region with its
storage node, three simulated Jetson devices enrolled with their own one-time tokens (device
agents as processes), one configuration rolled out to all three canary first, each `running`;
one device rebooted (its agent restarted under another boot id) runs its command again; a
command that exits by itself stays `stopped`, also across an agent restart in the same boot."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpufleet_contracts import subjects
from gpufleet_devstack import wait_for

from .conftest import System

COMMAND = "echo run >> runs; while [ ! -f stop ]; do sleep 0.2; done"


def ask(system: System, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = system.ask(subjects.rpc("device-fleet", verb), json.dumps(body).encode())
    assert reply is not None, verb
    return reply


def device(system: System, name: str) -> dict[str, Any]:
    return ask(system, "show_device", {"device": name})


def runs(state: Path) -> int:
    path = state / "output" / "runs"
    return path.read_text().count("run") if path.exists() else 0


def test_devices_enrolled_rolled_out_rebooted_and_stopped(system: System, tmp_path: Path) -> None:
    region = "edge-e2e"
    system.cli("provider", "enable", "physical", check=False)  # enabled already: a conflict
    system.json("region", "create", region, "--storage-mode", "central")
    system.json(
        "node",
        "add",
        "--region",
        region,
        "--name",
        "st-e2e",
        "--minion-id",
        "st-e2e",
        "--kind",
        "storage",
    )
    names = [f"cam-{i}" for i in range(3)]
    added = system.json(
        "device",
        "add",
        names[0],
        "--region",
        region,
        "--minion-id",
        "jetson-0",
        "--model",
        "jetson-orin-nano",
    )
    assert added["state"] == "provisioning"
    for i in (1, 2):
        body = {
            "region": region,
            "name": names[i],
            "minion_id": f"jetson-{i}",
            "model": "jetson-agx-orin",
        }
        assert ask(system, "add_device", body)["state"] == "provisioning"
    system.json(
        "device",
        "config",
        "add",
        "yolo",
        "--region",
        region,
        "--image",
        "nvcr.io/nvidia/l4t-ml:r36",
        "--model",
        "yolov8n",
        "--start-command",
        COMMAND,
        "-e",
        "FPS=30",
    )
    system.json("device", "set-config", names[0], "yolo")
    for name in names[1:]:
        assert ask(system, "set_config", {"device": name, "config": "yolo"})["config"] == "yolo"

    states, boots = [], []
    for i, name in enumerate(names):
        token = (
            system.json("device", "token", name)["token"]
            if i == 0
            else ask(system, "issue_token", {"device": name})["token"]
        )
        state, boot = tmp_path / name, tmp_path / f"{name}.boot_id"
        boot.write_text("boot-1\n")
        states.append(state)
        boots.append(boot)
        system.add(
            name,
            "device-agent",
            {
                "GPUFLEET_MINION_ID": f"jetson-{i}",
                "GPUFLEET_JOIN_TOKEN": token,
                "GPUFLEET_DEVICE_STATE_DIR": str(state),
                "GPUFLEET_BOOT_ID_FILE": str(boot),
                "GPUFLEET_DEVICE_WATCH_S": "0.5",
            },
        )
    wait_for(
        lambda: all(device(system, n)["state"] == "active" for n in names),
        timeout=90,
        message="devices not active",
    )

    rollout = system.json(
        "device",
        "deploy",
        "--config",
        "yolo",
        "--region",
        region,
        "--canary",
        "1",
        "--batch-size",
        "2",
    )
    assert [(d["wave"], d["state"]) for d in rollout["devices"]] == [
        (0, "pending"),
        (1, "waiting"),
        (1, "waiting"),
    ]
    rid = rollout["rollout_id"]
    wait_for(
        lambda: ask(system, "show_rollout", {"rollout_id": rid})["phase"] == "succeeded",
        timeout=60,
        message="rollout not done",
    )
    listed = system.json("device", "list", "--region", region)["devices"]
    assert [(d["deploy_state"], d["inference"]) for d in listed] == [("running", "running")] * 3
    assert all(d["deployed_at"] for d in listed)
    assert all(runs(s) == 1 for s in states)

    # cam-0 rebooted: its agent starts again in another boot, and so does its command
    boots[0].write_text("boot-2\n")
    system.restart(names[0])
    wait_for(lambda: runs(states[0]) == 2, timeout=60, message="not run again after a reboot")

    # cam-1's command exits by itself: stopped, not restarted, not even by an agent restart
    (states[1] / "output" / "stop").touch()
    wait_for(
        lambda: device(system, names[1])["inference"] == "stopped",
        timeout=30,
        message="exit not reported",
    )
    (states[1] / "output" / "stop").unlink()
    system.restart(names[1])
    time.sleep(3)
    assert runs(states[1]) == 1
    assert device(system, names[1])["inference"] == "stopped"
    assert device(system, names[0])["inference"] == "running"
