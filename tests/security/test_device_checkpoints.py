"""Attack: a device reading a checkpoint that is not its configuration's (R-DEV-2). A device
asks for checkpoints on its own subject (`nrpc.scheduler.stage_device_checkpoint.<minion>`);
the scheduler grants a presigned read only of a checkpoint a configuration it was told to
run names, of its owner (or another account's public one, as a job reads them). Its owner's
checkpoint its configuration does not name, another account's private checkpoint named in
its configuration as `<owner>/<name>`, a checkpoint before any deployment and another
device's configuration's checkpoint are "not found"; another device's subject is refused by
the server.

On the real servers (NATS with its permissions, nx-27017, moto's S3) with device-fleet, the
provisioner, the scheduler and the datastore in-process; the package's `system` is not
needed (nor started) here.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from gpufleet_contracts import subjects
from gpufleet_contracts.devices import StageDeviceCheckpoint
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_devstack.storage import S3Server
from integration.datastore.test_platform_objects import made, s3_server  # noqa: F401
from integration.device_fleet.test_device_checkpoints import checkpointed_fleet, config
from integration.device_fleet.test_device_keys import device

from .attack import Client


async def test_a_device_gets_only_its_owner_s_checkpoints_its_configuration_names(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    other = f"other{uuid.uuid4().hex[:6]}"
    async with checkpointed_fleet(nats_server, mongo_server, db_prefix, s3_server) as (f, nc):
        mine = f.bus.account
        await made(nc, mine, "checkpoint", "weights", b"mine")
        await made(nc, mine, "checkpoint", "unnamed", b"mine too")
        await made(nc, other, "checkpoint", "secret", b"theirs")
        await made(nc, other, "checkpoint", "shared", b"theirs, public", public=True)
        named = ["weights", f"{other}/secret", f"{other}/shared"]
        await config(f, "cam", named, "sleep 60")
        await config(f, "plain", [], "sleep 60")
        a, b = await device(f, "a", "cam"), await device(f, "b", "plain")
        await f.enrolled("a", tmp_path)
        await f.enrolled("b", tmp_path)

        def body(name: str) -> dict[str, str]:
            return StageDeviceCheckpoint(name=name).model_dump(mode="json")

        on_a, on_b = (subjects.as_node(StageDeviceCheckpoint.SUBJECT, m) for m in (a, b))
        async with Client(nats_server.url, f.creds[a], name="device-a") as device_a:
            early = await device_a.request(on_a, body("weights"))
            assert early["error"]["code"] == "not_found", early  # set, not yet deployed
            for name in ("a", "b"):
                await f.ask("deploy", {"devices": [name]})
                await f.until(name, deploy_state="pending")

            granted = await device_a.request(on_a, body("weights"))
            assert (granted["account"], granted["method"]) == (mine, "GET"), granted
            public = await device_a.request(on_a, body(f"{other}/shared"))
            assert public["method"] == "GET", public
            for name in ("unnamed", f"{other}/secret", f"{mine}/unnamed", "absent"):
                refused = await device_a.request(on_a, body(name))
                assert refused["error"]["code"] == "not_found", (name, refused)

        async with Client(nats_server.url, f.creds[b], name="device-b") as device_b:
            await device_b.request_refused(on_a, body("weights"))  # a's subject
            theirs = await device_b.request(on_b, body("weights"))  # not b's configuration's
            assert theirs["error"]["code"] == "not_found", theirs
