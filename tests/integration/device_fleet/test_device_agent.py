"""The device agent (node agent in device mode, simulated Jetson profile) against the real
servers, device-fleet and the provisioner: enrolled with its device's token, it runs the
configuration deployed to it and reports it `running` (its heartbeats make it `online`); its
command exiting by itself stays stopped, also across an agent restart; after a reboot
(another boot id) it runs again."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts import subjects
from gpufleet_contracts.datastores import AddDatastore
from gpufleet_datastore.app import build_app as build_datastore
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_node_agent.device.app import build_device_app
from gpufleet_node_agent.device.settings import DeviceSettings
from gpufleet_node_agent.enrol import enrol

from ..conftest import broker_for, running, store_for
from ..datastore.test_regional_datastores import admin
from .test_devices import Fleet, fleet


@asynccontextmanager
async def agent(
    f: Fleet, minion: str, creds: Path, state: Path, bind_root: Path | None = None
) -> AsyncIterator[None]:
    bus = BusSettings(nats_url=f.bus.server.url, nats_creds=creds)
    settings = DeviceSettings(
        minion_id=minion,
        device_state_dir=state,
        device_runtime="simulated",
        boot_id_file=state.parent / "boot_id",
        device_watch_s=0.2,
        datastore_mounter="bind",
        datastore_bind_root=bind_root or state.parent / "bind",
        datastore_probe_s=0.5,
        device_start_grace_s=0.5,  # `running` once the command outlived it (3 s by default)
    )
    svc = build_device_app(
        Ports(make_broker("device-agent", bus, dead_letters_as=f"node-{minion}"), bus=bus),
        settings,
    )
    async with running(svc.app):
        yield


async def test_the_command_runs_stays_stopped_when_it_exits_and_runs_again_after_a_reboot(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        await f.central("edge")
        minion = f"jx-{uuid.uuid4().hex[:8]}"
        await f.ask(
            "add_device",
            {"region": "edge", "name": "cam", "minion_id": minion, "model": "jetson-orin-nano"},
        )
        issued = await f.ask("issue_token", {"device": "cam"})
        creds = tmp_path / "device.creds"
        await enrol([nats_server.url], issued["token"], minion, creds, attempts=3)
        state = tmp_path / "state"
        boot = tmp_path / "boot_id"
        boot.write_text("boot-1\n")
        out = state / "output"
        # runs until told to stop from inside (the file `stop`), counting its starts
        command = "echo run >> runs; while [ ! -f stop ]; do sleep 0.1; done"
        await f.ask(
            "add_config",
            {"region": "edge", "name": "c", "image": "i", "model": "m", "start_command": command},
        )
        await f.ask("set_config", {"device": "cam", "config": "c"})

        async with agent(f, minion, creds, state):
            await f.until("cam", state="active")
            await f.until("cam", presence="online")  # a status report or its first heartbeat

            async def beat_stored() -> bool:  # heartbeats are stored in rounds (heartbeats.py)
                return (await f.device("cam"))["telemetry"] is not None

            await wait_for_async(beat_stored, timeout=10)
            heard = await f.device("cam")
            assert heard["last_seen"] and heard["telemetry"]["ram_total_mb"]
            assert heard["telemetry"]["gpu"]["index"] == 0  # the simulated Jetson's SoC GPU
            rollout = await f.ask("deploy", {"devices": ["cam"]})
            shown = await f.until("cam", deploy_state="running", inference="running")
            assert shown["deployment_id"] == rollout["rollout_id"] and shown["deployed_at"]
            assert (await f.rollout(rollout["rollout_id"]))["phase"] == "succeeded"
            await wait_for_async(lambda: (out / "runs").exists(), timeout=5)
            (out / "stop").touch()  # it exits by itself
            await f.until("cam", inference="stopped")
            await asyncio.sleep(1.0)  # five watch rounds: not started again
            assert (out / "runs").read_text().count("run") == 1

        (out / "stop").unlink()
        async with agent(f, minion, creds, state):  # the agent restarted, same boot
            await asyncio.sleep(1.0)
            assert (out / "runs").read_text().count("run") == 1
            assert (await f.device("cam"))["inference"] == "stopped"

        boot.write_text("boot-2\n")  # the device rebooted
        async with agent(f, minion, creds, state):
            await wait_for_async(lambda: (out / "runs").read_text().count("run") == 2, timeout=5)
            await f.until("cam", inference="running")


async def test_the_configuration_s_datastore_is_mounted_at_its_output_path(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    """R-DEV-2: the datastore (bind adapter: `<bind root>/<address>/<root>`) asked of the
    datastore service on the device's own subject, its path joined to its root as a job's
    is; a path that is not there fails the deployment with the reason."""
    datastore = build_datastore(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        )
    ).app
    async with fleet(nats_server, mongo_server, db_prefix) as f, running(datastore):
        await admin(f.bus, "create_account", {"account": f.bus.account, "plan": "team"})
        await f.central("edge")
        minion = f"jx-{uuid.uuid4().hex[:8]}"
        await f.ask(
            "add_device",
            {"region": "edge", "name": "cam", "minion_id": minion, "model": "jetson-orin-nx"},
        )
        share = tmp_path / "bind" / "10.9.8.7" / "exports" / "edge"
        (share / "cams" / "cam").mkdir(parents=True)
        nas = {
            "region": "edge",
            "name": "nas",
            "type": "nfs",
            "address": "10.9.8.7",
            "root_path": "/exports/edge",
        }
        added = await f.bus.user.request(
            subjects.as_account(AddDatastore.SUBJECT, f.bus.account),
            json.dumps(nas).encode(),
            timeout=10,
        )
        assert json.loads(added.data)["name"] == "nas", added.data
        config = {"region": "edge", "image": "i", "model": "m", "datastore": "nas"}
        command = "echo run >> runs; sleep 60"
        await f.ask(
            "add_config",
            {**config, "name": "c", "start_command": command, "datastore_path": "/cams/cam"},
        )
        await f.ask(
            "add_config",
            {**config, "name": "gone", "start_command": command, "datastore_path": "/nowhere"},
        )
        await f.ask("set_config", {"device": "cam", "config": "c"})
        issued = await f.ask("issue_token", {"device": "cam"})
        creds = tmp_path / "device.creds"
        await enrol([nats_server.url], issued["token"], minion, creds, attempts=3)
        state = tmp_path / "state"
        (tmp_path / "boot_id").write_text("boot-1\n")

        async with agent(f, minion, creds, state):
            await f.until("cam", state="active")
            await f.ask("deploy", {"devices": ["cam"]})
            await f.until("cam", deploy_state="running", inference="running")
            await wait_for_async(lambda: (share / "cams" / "cam" / "runs").exists(), timeout=5)
            assert not (state / "output" / "runs").exists()

            await f.ask("set_config", {"device": "cam", "config": "gone"})
            await f.ask("deploy", {"devices": ["cam"]})
            failed = await f.until("cam", deploy_state="failed")
            assert failed["deploy_reason"] == "datastore nas:/nowhere not found", failed
