"""A device configuration's attached keys (R-DEV-2) on the real servers, with the scheduler
(which holds the accounts' keys), device-fleet and the provisioner: the device agent asks on
its own subject with a fresh key, gets them sealed to it and gives them to its command as a
job's worker gets its own (files under SECRETS_PATH), never kept in its state or logged; a
key its account has not attached fails the deployment; a device asking for keys no
configuration it was told to run attaches gets none."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import Ports
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import DeviceKeys, GetDeviceKeys
from gpufleet_contracts.jobs import SecretFields
from gpufleet_contracts.keys import AttachKey
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app as build_scheduler
from gpufleet_scheduler.settings import SchedulerSettings
from nats.aio.client import Client

from ..conftest import broker_for, running, store_for
from .test_device_agent import agent
from .test_devices import Fleet, fleet

VALUE = "hf-device-s3cr3t"


@asynccontextmanager
async def keyed_fleet(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> AsyncIterator[Fleet]:
    """The fleet, the scheduler, and a huggingface key attached to the fleet's account."""
    scheduler = build_scheduler(
        Ports(
            broker_for("scheduler", nats_server),
            store_for("scheduler", mongo_server.url, db_prefix),
        ),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    async with fleet(nats_server, mongo_server, db_prefix) as f, running(scheduler):
        attached = await f.bus.user.request(
            subjects.as_account(AttachKey.SUBJECT, f.bus.account),
            json.dumps({"type": "huggingface", "secret": {"token": VALUE}}).encode(),
            timeout=10,
        )
        assert json.loads(attached.data)["fields"] == ["token"], attached.data
        await f.central("edge")
        yield f


async def config(
    f: Fleet, name: str, image: str, keys: list[str], command: str = "sleep 60"
) -> None:
    body = {"region": "edge", "name": name, "image": image, "model": "m", "start_command": command}
    assert (await f.ask("add_config", {**body, "keys": keys}))["name"] == name


async def device(f: Fleet, name: str, cfg: str) -> str:
    minion = f"jx-{uuid.uuid4().hex[:8]}"
    added = {"region": "edge", "name": name, "minion_id": minion, "model": "jetson-orin-nano"}
    assert (await f.ask("add_device", added))["name"] == name
    await f.ask("set_config", {"device": name, "config": cfg})
    return minion


async def ask_keys(nc: Client, minion: str, image: str, types: list[str], key: SealingKey) -> Any:
    body = GetDeviceKeys(image=image, types=types, public_key=key.public_key)
    subject = subjects.as_node(GetDeviceKeys.SUBJECT, minion)
    reply = await nc.request(subject, body.to_bytes(), timeout=10)
    assert VALUE.encode() not in reply.data  # sealed, whatever it says
    return json.loads(reply.data)


async def test_the_agent_gets_its_configuration_s_keys_sealed_as_files_never_kept(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with keyed_fleet(nats_server, mongo_server, db_prefix) as f:
        command = 'cat "$SECRETS_PATH/huggingface/token" > got; sleep 60'
        await config(f, "keyed", "cam:1", ["huggingface"], command)
        await config(f, "plain", "cam:1", [], 'echo "${SECRETS_PATH:-none}" > got; sleep 60')
        minion = await device(f, "cam", "keyed")
        await f.enrolled("cam", tmp_path)
        state = tmp_path / "state"
        (tmp_path / "boot_id").write_text("boot-1\n")
        got = state / "output" / "got"

        async with agent(f, minion, f.creds[minion], state):
            await f.until("cam", state="active")
            await f.ask("deploy", {"devices": ["cam"]})
            await f.until("cam", deploy_state="running", inference="running")
            await wait_for_async(lambda: got.exists() and got.read_text() == VALUE, timeout=5)
            token = state / "secrets" / "huggingface" / "token"
            assert token.read_text() == VALUE and token.stat().st_mode & 0o777 == 0o400
            assert VALUE not in (state / "desired.json").read_text()

            await f.ask("set_config", {"device": "cam", "config": "plain"})
            await f.ask("deploy", {"devices": ["cam"]})
            await wait_for_async(lambda: got.exists() and got.read_text() == "none\n", timeout=10)
            assert not (state / "secrets").exists()  # gone with the configuration
            await f.until("cam", deploy_state="running")  # its rollout over: another may begin

            await f.ask("set_config", {"device": "cam", "config": "keyed"})
            await f.ask("deploy", {"devices": ["cam"]})
            await wait_for_async(lambda: got.exists() and got.read_text() == VALUE, timeout=10)
            await f.until("cam", deploy_state="running")

            await config(f, "unattached", "cam:1", ["aws"])  # the account has no aws key
            await f.ask("set_config", {"device": "cam", "config": "unattached"})
            await f.ask("deploy", {"devices": ["cam"]})
            failed = await f.until("cam", deploy_state="failed")
            assert "aws" in failed["deploy_reason"], failed
        assert not (state / "secrets").exists()  # gone with the agent
        assert VALUE not in caplog.text


async def test_a_device_gets_only_keys_a_configuration_it_was_told_to_run_attaches(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with keyed_fleet(nats_server, mongo_server, db_prefix) as f:
        await config(f, "keyed", "cam:1", ["huggingface"])
        await config(f, "plain", "plain:1", [])
        a = await device(f, "a", "keyed")
        b = await device(f, "b", "plain")
        nc_a, nc_b = await f.enrolled("a", tmp_path), await f.enrolled("b", tmp_path)
        key = SealingKey.generate()

        # set but not deployed yet: not told, so no keys
        refused = await ask_keys(nc_a, a, "cam:1", ["huggingface"], key)
        assert refused["error"]["code"] == "not_found", refused
        for name in ("a", "b"):
            await f.ask("deploy", {"devices": [name]})
            await f.until(name, deploy_state="pending")

        reply = DeviceKeys.model_validate(await ask_keys(nc_a, a, "cam:1", ["huggingface"], key))
        opened = SecretFields.model_validate_json(key.open(reply.sealed.box, reply.sealed.key_id))
        assert opened.attached_keys == {"huggingface": {"token": VALUE}}

        # b's configuration attaches no key; a's configuration's keys are not b's
        for image in ("plain:1", "cam:1"):
            refused = await ask_keys(nc_b, b, image, ["huggingface"], key)
            assert refused["error"]["code"] == "not_found", refused
        # a key a's configuration does not attach, even with its image
        refused = await ask_keys(nc_a, a, "cam:1", ["aws"], key)
        assert refused["error"]["code"] == "not_found", refused
