"""A node's base environments (R-JOB-7), and where its proxy serves endpoints (R-JOB-6):
what its agent announces in RegisterNode is kept with the node, shown by `node show`, and
carried to the scheduler in NodeRegistered."""

from __future__ import annotations

import uuid

from gpufleet_contracts.environments import EnvironmentOffer
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async

from .test_nodes import node, provisioner, registration

OFFER = EnvironmentOffer(
    python_versions=("3.11",),
    frameworks=("deep_learning", "pytorch", "tensorflow"),
    mapped=("py3.10-pytorch-2.1",),
)


async def test_a_nodes_environments_reach_the_scheduler(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        new, old = f"new-{uuid.uuid4().hex[:6]}", f"old-{uuid.uuid4().hex[:6]}"
        proxy = "http://{job}.lab.example:8480"
        await bus.send(registration(new, bus.account, "lab", environments=OFFER, proxy_url=proxy))
        await bus.send(registration(old, bus.account, "lab"))  # an agent older than that

        async def announced() -> bool:
            return len([e for e in bus.events if "gpus" in e]) == 2

        await wait_for_async(announced, timeout=10)
        told = {e["minion_id"]: e["environments"] for e in bus.events if "gpus" in e}
        assert told == {new: OFFER.model_dump(mode="json"), old: None}
        proxies = {e["minion_id"]: e.get("proxy_url") for e in bus.events if "gpus" in e}
        assert proxies == {new: proxy, old: None}
        assert (await node(bus, new))["environments"] == OFFER.model_dump(mode="json")
        assert "environments" not in await node(bus, old)
