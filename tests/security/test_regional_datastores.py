"""Attack: another account's regional datastore (R-RES-2, R-TEN-2) and its SMB password, by
every path that reaches one: the attacker's user (show, remove, list, its own datastore
named into the victim's region), the attacker's node asking to mount it, the node and
service subjects a user may not publish; and a datastore path that climbs out of its root,
whether the job spec or a node is handed it.

On the real servers (NATS with its permissions, nx-27017) with the provisioner and the
datastore service in-process; the package's `system` is not needed (nor started) here.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.datastores import (
    AddDatastore,
    GetDatastore,
    GetNodeFacts,
    ListDatastores,
    MountDatastore,
    RemoveDatastore,
)
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.locations import DatastoreRef
from gpufleet_devstack import NatsServer
from gpufleet_node_agent.staging.datastores import Datastores
from gpufleet_node_agent.steps.base import WorkerFailed
from integration.conftest import as_user, connect
from integration.datastore.test_regional_datastores import (
    SECRET,
    SMB,
    admin,
    mount_as,
    services,  # noqa: F401  (fixture)
)
from integration.provisioner.test_nodes import Bus
from pydantic import ValidationError

ATTACKER, EVIL_NODE = "mallory", "evil"


async def test_another_accounts_datastore_and_its_password_are_not_found(
    services: Bus,  # noqa: F811
    nats_server: NatsServer,
) -> None:
    bus = services
    await admin(bus, "create_account", {"account": bus.account, "plan": "team"})
    await admin(bus, "create_account", {"account": ATTACKER, "plan": "team"})
    await bus.ask("enable_provider", {"provider": "physical"})
    await bus.ask("create_region", {"name": "lab-1"})
    node = f"m{uuid.uuid4().hex[:8]}"
    await bus.ask("add_node", {"region": "lab-1", "name": "box", "minion_id": node})
    async with as_user(nats_server, bus.account, "u") as victim:
        added = await victim.call(AddDatastore.SUBJECT, json.dumps(SMB).encode())
        assert added["password_set"], added

    said: list[str] = []
    async with as_user(nats_server, ATTACKER, "eve") as eve:
        body = json.dumps({"region": "lab-1", "name": "nas"}).encode()
        for subject in (GetDatastore.SUBJECT, RemoveDatastore.SUBJECT):
            got = await eve.call(subject, body)
            assert got["error"]["code"] == "not_found", got
            said.append(json.dumps(got))
        listed = await eve.call(ListDatastores.SUBJECT, b'{"region": "lab-1"}')
        assert listed["datastores"] == []
        # the victim's region name means nothing in the attacker's account
        own = await eve.call(AddDatastore.SUBJECT, json.dumps(SMB).encode())
        assert own["error"]["code"] == "not_found", own
        said.append(json.dumps(own))
    # the attacker's node (enrolled nowhere) asking to mount it
    got = await mount_as(nats_server, EVIL_NODE, ATTACKER, "nas")
    assert got["error"]["code"] == "not_found", got
    said.append(json.dumps(got))
    assert not any(SECRET in s for s in said)

    # a user may publish neither a node's subject nor the provisioner's service subject
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    user = await connect(
        nats_server, nats_server.creds("user", "eve", account=ATTACKER), error_cb=on_error
    )
    try:
        for subject, msg in (
            (subjects.as_node(MountDatastore.SUBJECT, node), {"name": "nas"}),
            (GetNodeFacts.SUBJECT, {"minion_id": node}),
        ):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await user.request(subject, json.dumps(msg).encode(), timeout=1)
    finally:
        await user.close()
    assert sum("permissions violation" in str(e).lower() for e in errors) >= 2

    # the victim still has it, untouched
    async with as_user(nats_server, bus.account, "u") as victim:
        kept = await victim.call(GetDatastore.SUBJECT, b'{"region": "lab-1", "name": "nas"}')
        assert kept["name"] == "nas" and kept["password_set"]


ESCAPES = ["/../etc", "/a/%2e%2e/%2e%2e/etc", "/%252e%252e/x", "/a\x00b", "//host/share"]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_job_naming_a_path_out_of_the_datastore_root_is_refused(path: str) -> None:
    data: dict[str, Any] = {"type": "regional_datastore", "path": path, "datastore": "nas"}
    with pytest.raises(ValidationError):
        JobSpec.model_validate(
            {
                "name": "j",
                "type": "inference",
                "gpu_types": ["RTX 3090"],
                "command": ["true"],
                "input_data": {**data, "region": "lab"},
            }
        )


@pytest.mark.parametrize("path", ESCAPES)
def test_a_node_handed_a_path_out_of_the_root_refuses_it(path: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "etc").mkdir()
    stores = Datastores({"nas": root}, "lab")
    with pytest.raises(WorkerFailed, match="could resolve outside its root"):
        stores.resolve(DatastoreRef(datastore="nas", path=path, region="lab"))
