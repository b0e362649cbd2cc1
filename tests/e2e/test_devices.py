"""Edge devices through the running system and the CLI (R-DEV-1..3): a central region with its
storage node, three simulated Jetson devices enrolled with their own one-time tokens (device
agents as processes), one configuration rolled out to all three canary first, each `running`;
one device rebooted (its agent restarted under another boot id) runs its command again; a
command that exits by itself stays `stopped`, also across an agent restart in the same boot."""

from __future__ import annotations

import calendar
import json
import time
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from gpufleet_contracts import subjects
from gpufleet_contracts.billing import EntriesQuery
from gpufleet_devstack import wait_for
from gpufleet_devstack.identities import LOCAL_ACCOUNT

from .conftest import System

COMMAND = "echo run >> runs; while [ ! -f stop ]; do sleep 0.2; done"
REGION = "edge-e2e"
NAMES = [f"cam-{i}" for i in range(3)]
IN_PROGRESS = {"waiting", "pending", "downloading", "starting"}


def ask(system: System, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = system.ask(subjects.rpc("device-fleet", verb), json.dumps(body).encode())
    assert reply is not None, verb
    return reply


def device(system: System, name: str) -> dict[str, Any]:
    return ask(system, "show_device", {"device": name})


def state_dir(system: System, name: str) -> Path:
    """A device's state directory (its command's output in `output/`), shared by the tests."""
    return system.root / "devices" / name


def runs(state: Path) -> int:
    path = state / "output" / "runs"
    return path.read_text().count("run") if path.exists() else 0


def test_devices_enrolled_rolled_out_rebooted_and_stopped(system: System, tmp_path: Path) -> None:
    region = REGION
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
    names = NAMES
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
        state, boot = state_dir(system, name), tmp_path / f"{name}.boot_id"
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
                "GPUFLEET_DEVICE_START_GRACE_S": "1",
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
    # heartbeats, like compute nodes': online, seen lately, with telemetry
    assert all(d["presence"] == "online" and d["telemetry"] for d in listed)
    seen = [datetime.fromisoformat(d["last_seen"]) for d in listed]
    assert all(datetime.now(UTC) - t < timedelta(seconds=60) for t in seen), seen
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


def listed(system: System) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in system.json("device", "list", "--region", REGION)["devices"]}


def test_a_failed_canary_stops_the_rollout_before_the_rest(system: System) -> None:
    """On the devices of the test above: a configuration whose start command fails fails
    its canary, and the other devices are never told (their commands run on untouched)."""
    system.json(
        "device",
        "config",
        "add",
        "broken",
        "--region",
        REGION,
        "--image",
        "nvcr.io/nvidia/l4t-ml:r36",
        "--model",
        "yolov8n",
        "--start-command",
        "echo broken >> broken; exit 3",
    )
    for name in NAMES:  # as the CLI's `device set-config` asks (shown in the test above)
        assert ask(system, "set_config", {"device": name, "config": "broken"})["config"] == "broken"
    before = {n: runs(state_dir(system, n)) for n in NAMES}
    rollout = system.json(
        "device", "deploy", "--config", "broken", "--region", REGION, "--canary", "1"
    )
    assert [(d["name"], d["wave"]) for d in rollout["devices"]] == [
        ("cam-0", 0),
        ("cam-1", 1),
        ("cam-2", 1),
    ]
    rid = rollout["rollout_id"]
    wait_for(
        lambda: ask(system, "show_rollout", {"rollout_id": rid})["phase"] != "canary",
        timeout=30,
        message="the canary's failure not seen",
    )
    shown = system.json("device", "rollout", "show", rid)
    assert shown["phase"] == "stopped", shown
    assert "failed: the start command exited with status 3" in shown["reason"], shown
    assert [d["state"] for d in shown["devices"]] == ["failed", "cancelled", "cancelled"]

    devices = listed(system)
    assert (devices["cam-0"]["deploy_state"], devices["cam-0"]["inference"]) == (
        "failed",
        "failed",
    )
    assert devices["cam-0"]["deploy_reason"] == "the start command exited with status 3"
    for name in NAMES[1:]:
        assert devices[name]["deploy_state"] == "cancelled", devices[name]
        assert not (state_dir(system, name) / "output" / "broken").exists()
    assert (state_dir(system, "cam-0") / "output" / "broken").read_text() == "broken\n"
    # the rest kept what they ran: cam-1 stopped (it exited above), cam-2 running, not restarted
    assert (devices["cam-1"]["inference"], devices["cam-2"]["inference"]) == (
        "stopped",
        "running",
    )
    assert {n: runs(state_dir(system, n)) for n in NAMES[1:]} == {n: before[n] for n in NAMES[1:]}


def test_a_rollout_cancelled_mid_way_leaves_no_device_in_progress(system: System) -> None:
    """cam-2's agent is down, so the second wave hangs with it `pending` (the anchors'
    "stuck in progress"): `device rollout cancel` ends it, and nothing is left in progress,
    neither then nor once cam-2 comes back and finds the command waiting for it."""
    for name in NAMES:
        assert ask(system, "set_config", {"device": name, "config": "yolo"})["config"] == "yolo"
    system.procs["cam-2"].stop(timeout=15)  # its command stops with it
    rollout = system.json(
        "device", "deploy", *NAMES, "--canary", "1", "--batch-size", "2", "--timeout-s", "600"
    )
    rid = rollout["rollout_id"]

    def second_wave() -> bool:
        states = {
            d["name"]: d["state"]
            for d in ask(system, "show_rollout", {"rollout_id": rid})["devices"]
        }
        return states == {"cam-0": "running", "cam-1": "running", "cam-2": "pending"}

    wait_for(second_wave, timeout=30, message="the second wave not under way")
    assert device(system, "cam-2")["deploy_state"] == "pending"

    cancelled = system.json("device", "rollout", "cancel", rid)
    assert cancelled["phase"] == "cancelled", cancelled
    assert [d["state"] for d in cancelled["devices"]] == ["running", "running", "cancelled"]
    devices = listed(system)
    assert not {n for n, d in devices.items() if d["deploy_state"] in IN_PROGRESS}, devices
    assert devices["cam-2"]["deploy_reason"] == "stopped: cancelled by its owner"

    # back: its command runs again (the agent went down while it ran), it is told to
    # deploy, then to go back to what it ran before (yolo): four runs, and still cancelled
    system.procs["cam-2"].start()
    wait_for(lambda: runs(state_dir(system, "cam-2")) == 4, timeout=60, message="cam-2 not back")
    time.sleep(2)  # its reports of the cancelled deployment and of going back arrive
    devices = listed(system)
    assert not {n for n, d in devices.items() if d["deploy_state"] in IN_PROGRESS}, devices
    assert (devices["cam-2"]["deploy_state"], devices["cam-2"]["inference"]) == (
        "cancelled",
        "running",
    )
    assert ask(system, "show_rollout", {"rollout_id": rid})["phase"] == "cancelled"


def fee_micro(devices: int, day: date) -> int:
    """R-BILL-3: 15 x devices / days in that month, in micro-credits (rounded half even)."""
    fee = Decimal(15 * devices) / calendar.monthrange(day.year, day.month)[1]
    return int((fee * 1_000_000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def device_fees(system: System) -> dict[str, int]:
    """The account's device fees per day, from its ledger (corrections summed)."""
    query = EntriesQuery(limit=1000)
    entries = (system.ask(query.SUBJECT, query.to_bytes()) or {}).get("entries", [])
    fees: dict[str, int] = {}
    for e in entries:
        if e["kind"] == "device_fee":
            fees[e["day"]] = fees.get(e["day"], 0) + e["amount_micro"]
    return fees


def test_the_device_fee_of_a_day_follows_r_bill_3(system: System) -> None:
    """The three devices were added today; cam-1 is removed today: today is charged for
    three (removing lowers the next day's charge, not today's), tomorrow for two, cam-2
    offline or not. Billing charges a day once it is over: it restarts two days ahead."""
    system.json("device", "remove", "cam-1")
    today = datetime.now(UTC).date()
    tomorrow = today + timedelta(days=1)
    ahead = datetime.combine(today + timedelta(days=2), datetime.min.time(), UTC)
    offset = (ahead - datetime.now(UTC)).total_seconds() + 600  # 00:10 two days on
    system.procs["billing"].stop(timeout=15)
    system.add(
        "billing",
        "billing",
        {"GPUFLEET_CLOCK_OFFSET_S": f"{offset:.0f}", "GPUFLEET_BILLING_TICK_S": "1"},
    )
    want = {today.isoformat(): -fee_micro(3, today), tomorrow.isoformat(): -fee_micro(2, tomorrow)}
    wait_for(
        lambda: device_fees(system) == want,
        timeout=60,
        message=f"device fees not {want}: {device_fees(system)}",
    )
    entries = system.json("billing", "entries", "--limit", "1000")["entries"]
    fees = [e for e in entries if e["kind"] == "device_fee"]
    assert {e["day"] for e in fees} == set(want), fees
    assert sum(e["amount_micro"] for e in fees) == sum(want.values())
    assert {e["account"] for e in fees} == {LOCAL_ACCOUNT}
