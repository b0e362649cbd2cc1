"""A device configuration's checkpoints (R-DEV-2) on the real servers (NATS with its
permissions, nx-27017, moto's S3), with device-fleet, the provisioner, the scheduler and the
datastore: the device agent asks on its own subject for each checkpoint its configuration
names, gets a presigned read of its owner's object and stages it read-only where a job's
worker finds its own (`ML_CHECKPOINT_PATH`, `ML_CHECKPOINT_PATH_<NAME>`) before the command
starts; a checkpoint that does not exist fails the deployment with the reason; the staged
files go with the configuration and with the agent; the URL is in no log."""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from gpufleet_bus import Ports
from gpufleet_datastore.app import build_app as build_datastore
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_devstack.storage import S3Server
from gpufleet_scheduler.app import build_app as build_scheduler
from gpufleet_scheduler.settings import SchedulerSettings
from nats.aio.client import Client

from ..conftest import broker_for, connect, running, store_for
from ..datastore.test_platform_objects import made, s3_server, settings  # noqa: F401
from .test_device_agent import agent
from .test_device_keys import device
from .test_devices import Fleet, fleet

WEIGHTS = b"yolo weights v8"


def zipped(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


@asynccontextmanager
async def checkpointed_fleet(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, s3: S3Server
) -> AsyncIterator[tuple[Fleet, Client]]:
    """The fleet with its central region `edge`, the scheduler and the datastore (its store:
    moto's S3), and the scheduler's own connection to make platform objects with."""
    scheduler = build_scheduler(
        Ports(
            broker_for("scheduler", nats_server),
            store_for("scheduler", mongo_server.url, db_prefix),
        ),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    datastore = build_datastore(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        ),
        settings(s3),
    ).app
    nc = await connect(nats_server, nats_server.creds("service", "scheduler"))
    try:
        async with fleet(nats_server, mongo_server, db_prefix) as f, running(scheduler, datastore):
            await f.central("edge")
            yield f, nc
    finally:
        await nc.close()


async def config(f: Fleet, name: str, checkpoints: list[str], command: str) -> None:
    body = {"region": "edge", "name": name, "image": "cam:1", "model": "m"}
    made_ = await f.ask(
        "add_config", {**body, "start_command": command, "checkpoints": checkpoints}
    )
    assert made_["name"] == name, made_


async def test_the_agent_stages_its_configuration_s_checkpoints_read_only_before_the_command(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with checkpointed_fleet(nats_server, mongo_server, db_prefix, s3_server) as (f, nc):
        await made(nc, f.bus.account, "checkpoint", "yolo weights", zipped({"w.bin": WEIGHTS}))
        await made(nc, f.bus.account, "checkpoint", "lut", zipped({"t.csv": b"lookup"}))
        caplog.clear()  # the objects' own uploads above
        reads = 'cat "$ML_CHECKPOINT_PATH_YOLO_WEIGHTS/w.bin" "$ML_CHECKPOINT_PATH/lut/t.csv"'
        await config(f, "two", ["yolo weights", "lut"], f"{reads} > got; sleep 60")
        await config(f, "one", ["lut"], 'cat "$ML_CHECKPOINT_PATH/t.csv" > got; sleep 60')
        await config(f, "plain", [], 'echo "${ML_CHECKPOINT_PATH:-none}" > got; sleep 60')
        await config(f, "missing", ["absent"], "sleep 60")
        minion = await device(f, "cam", "two")
        await f.enrolled("cam", tmp_path)
        state = tmp_path / "state"
        (tmp_path / "boot_id").write_text("boot-1\n")
        got, staged = state / "output" / "got", state / "checkpoints"

        async with agent(f, minion, f.creds[minion], state):
            await f.until("cam", state="active")
            await f.ask("deploy", {"devices": ["cam"]})
            await f.until("cam", deploy_state="running", inference="running")
            await wait_for_async(lambda: got.exists() and got.read_bytes() == WEIGHTS + b"lookup")
            weights = staged / "yolo_weights" / "w.bin"
            assert weights.stat().st_mode & 0o777 == 0o444
            assert (staged / "yolo_weights").stat().st_mode & 0o777 == 0o555

            await f.ask("set_config", {"device": "cam", "config": "one"})
            await f.ask("deploy", {"devices": ["cam"]})
            await wait_for_async(lambda: got.exists() and got.read_bytes() == b"lookup")
            assert not (staged / "yolo_weights").exists()  # the other configuration's: gone
            await f.until("cam", deploy_state="running")

            await f.ask("set_config", {"device": "cam", "config": "plain"})
            await f.ask("deploy", {"devices": ["cam"]})
            await wait_for_async(lambda: got.exists() and got.read_text() == "none\n")
            assert not staged.exists()
            await f.until("cam", deploy_state="running")

            await f.ask("set_config", {"device": "cam", "config": "missing"})
            await f.ask("deploy", {"devices": ["cam"]})
            failed = await f.until("cam", deploy_state="failed")
            assert failed["deploy_reason"] == "checkpoint absent not found", failed

            await f.ask("set_config", {"device": "cam", "config": "one"})
            await f.ask("deploy", {"devices": ["cam"]})
            await f.until("cam", deploy_state="running", inference="running")
            assert (staged / "t.csv").read_bytes() == b"lookup"
        assert not staged.exists()  # gone with the agent
        # gpufleet's own lines and its HTTP clients' (botocore's DEBUG lines are the store
        # client's in the datastore service, which presigns here in the same process)
        ours = "\n".join(
            r.getMessage() for r in caplog.records if r.name.startswith(("gpufleet", "httpx"))
        )
        assert ours and "Signature" not in ours and "X-Amz" not in ours
