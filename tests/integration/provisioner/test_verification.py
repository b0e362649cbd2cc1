"""Verified nodes over the real bus and database: the provisioner asks each registered node
for a GPU check with a nonce, and takes only that node's answer to that check, with that
nonce, in time; what it decided is kept on the node and published (NodeVerified).

The node here is the test, with the node's own credential: it reads its command stream
and answers as an agent would, honestly or not.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_bus import publish_raw
from gpufleet_bus.streams import node_consumer
from gpufleet_contracts import subjects
from gpufleet_contracts.nodes import GpuInfo
from gpufleet_contracts.verification import (
    CheckedGpu,
    GpuCheck,
    GpuCheckReported,
    NodeVerified,
    VerifyGpus,
)
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async

from ..conftest import JsPublisher, store_for
from .test_nodes import Bus, node, provisioner, registration

REGION = "lab"


class Checks:
    """The node's side of its GPU checks, and the verdicts the provisioner publishes."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.verdicts: list[NodeVerified] = []

    async def start(self) -> Checks:
        async def on_verdict(msg: Any) -> None:
            self.verdicts.append(NodeVerified.model_validate_json(msg.data))

        await self.bus.nc.subscribe(NodeVerified.SUBJECT, cb=on_verdict)
        await self.bus.ask("enable_provider", {"provider": "physical"})
        await self.bus.ask("create_region", {"name": REGION})
        return self

    async def register(self, minion: str, **kw: Any) -> None:
        await self.bus.send(registration(minion, self.bus.account, REGION, simulated=False, **kw))

    async def asked(self, minion: str, wait_s: float = 10) -> VerifyGpus:
        """The next GPU check this node is asked for (read from its own consumer)."""
        nc = await self.bus.node(minion, REGION)
        sub = await nc.jetstream().pull_subscribe_bind(
            node_consumer(minion), subjects.STREAM_COMMANDS
        )
        try:
            while True:
                for msg in await sub.fetch(1, timeout=wait_s):
                    await msg.ack()
                    if msg.subject.endswith(".verify_gpus"):
                        return VerifyGpus.from_bytes(msg.data)
        finally:
            await sub.unsubscribe()

    async def answer(self, minion: str, cmd: VerifyGpus, result: GpuCheck, **kw: Any) -> None:
        """Node `minion` answers `cmd` on its own subject (`kw` forges fields, the node
        named in the body among them)."""
        report = GpuCheckReported(
            minion_id=minion,
            check_id=cmd.check_id,
            nonce=cmd.nonce,
            result=result,
            at=datetime.now(UTC),
        ).model_copy(update=kw)
        nc = await self.bus.node(minion, REGION)
        own = GpuCheckReported.SUBJECT.format(minion_id=minion)
        await publish_raw(
            JsPublisher(nc),
            own,
            report.to_bytes(),
            type_=report.TYPE,
            source="test",
            msg_id=uuid.uuid4().hex,
        )

    async def verification(self, minion: str) -> dict[str, Any]:
        shown = await node(self.bus, minion)
        v: dict[str, Any] = shown["verification"]
        return v

    async def until(self, minion: str, done: Any, wait_s: float = 10) -> dict[str, Any]:
        async def reached() -> bool:
            return bool(done(await self.verification(minion)))

        await wait_for_async(reached, timeout=wait_s)
        return await self.verification(minion)


def honest(gpus: list[GpuInfo] | None = None, **kw: Any) -> GpuCheck:
    """What the check finds on the node `registration()` describes (2 x RTX 3090)."""
    gpus = gpus or registration("x", "a", REGION).gpus
    found = [
        CheckedGpu(
            index=g.index,
            uuid=g.uuid,
            nvml_name=g.nvml_name,
            memory_total_mb=g.memory_mb,
            pcie_gen=g.pcie_gen,
            pcie_width=g.pcie_width,
            allocated_mb=24_000,
            bandwidth_gbps=820.0,
        )
        for g in gpus
    ]
    return GpuCheck(gpus=found, cpu_count=16, memory_mb=131072, **kw)


def for_minion(minion: str) -> GpuCheck:
    return honest(registration(minion, "a", REGION).gpus)


@asynccontextmanager
async def checked(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, **settings: Any
) -> AsyncIterator[Checks]:
    # the test's nodes send no heartbeats: they stay live (a lost node is not checked)
    settings = {"node_lost_min_s": 600.0, **settings}
    async with provisioner(nats_server, mongo_server, db_prefix, **settings) as bus:
        yield await Checks(bus).start()


async def test_a_node_answering_with_what_it_registered_is_verified(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with checked(nats_server, mongo_server, db_prefix) as c:
        m = f"v-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        cmd = await c.asked(m)
        assert cmd.minion_id == m and len(cmd.nonce) >= 32 and 0 < cmd.timeout_s < 300
        pending = await c.until(m, lambda v: v.get("pending"))
        assert (pending["verified"], pending["reason"]) == (False, "not checked yet")
        await c.answer(m, cmd, for_minion(m))
        v = await c.until(m, lambda v: v["verified"])
        assert v["reason"] is None and "pending" not in v and v["checked_at"]
        assert "ok: 2 GPUs, the UUIDs registered" in v["checks"]
        assert v["next_check"]  # a day on
        await wait_for_async(lambda: bool(c.verdicts), timeout=5)
        (verdict,) = c.verdicts
        assert (verdict.minion_id, verdict.verified, verdict.verification_rev) == (m, True, 1)
        # the nonce is nowhere in what the account is shown, nor stored in clear
        shown = json.dumps(await node(c.bus, m))
        assert cmd.nonce not in shown
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        assert cmd.nonce not in json.dumps(await db.nodes.find_one({"minion_id": m}), default=str)
        listed = (await c.bus.ask("list_nodes"))["nodes"]
        assert [(n["minion_id"], n["verified"]) for n in listed] == [(m, True)]


async def test_forged_answers_are_ignored_and_figures_below_the_claim_fail(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A node answers with a guessed nonce, for a check it was not asked, for another node
    (on its own subject), then honestly but with less memory than a 3090 has: the first
    three change nothing, the last is judged and fails. Its nonce is then spent: a replay
    of a perfect answer changes nothing."""
    async with checked(nats_server, mongo_server, db_prefix) as c:
        victim, forger = f"v-{uuid.uuid4().hex[:6]}", f"f-{uuid.uuid4().hex[:6]}"
        await c.register(victim)
        await c.register(forger)
        cmd = await c.asked(forger)
        theirs = await c.asked(victim)
        await c.answer(forger, cmd, for_minion(forger), nonce="guessed-" + "x" * 32)
        await c.answer(forger, cmd, for_minion(forger), check_id=uuid.uuid4().hex)
        # the victim's check answered by the forger, on the forger's own subject
        await c.answer(forger, theirs, for_minion(victim), minion_id=victim)
        await asyncio.sleep(1.0)
        for m in (forger, victim):
            v = await c.verification(m)
            assert (v["verified"], v["reason"]) == (False, "not checked yet") and v["pending"]
        assert c.verdicts == []

        small = for_minion(forger)
        gpus = [g.model_copy(update={"allocated_mb": 11_000}) for g in small.gpus]
        await c.answer(forger, cmd, small.model_copy(update={"gpus": gpus}))
        v = await c.until(forger, lambda v: "pending" not in v)
        assert not v["verified"] and "11.5 GB allocated; a RTX 3090 has 24 GB" in v["reason"]
        assert any(check.startswith("failed: GPU 0") for check in v["checks"])
        assert v["next_check"] is None  # not retried: only a registration or a request
        await c.answer(forger, cmd, for_minion(forger))  # the spent nonce, replayed
        await asyncio.sleep(1.0)
        assert not (await c.verification(forger))["verified"]
        assert [(x.minion_id, x.verified) for x in c.verdicts] == [(forger, False)]
        assert (await c.verification(victim))["pending"]


async def test_no_answer_or_a_late_one_is_not_verified(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """No answer by the deadline: not verified, asked again after the retry period. An
    answer that arrives after its deadline (the round not run yet): judged late."""
    async with checked(
        nats_server,
        mongo_server,
        db_prefix,
        node_check_deadline_s=1.0,
        node_check_round_s=0.3,
        node_check_retry_s=2.0,
    ) as c:
        m = f"s-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        first = await c.asked(m)
        v = await c.until(m, lambda v: "pending" not in v)
        assert not v["verified"] and v["reason"].startswith("no answer to the GPU check within")
        await c.answer(m, first, for_minion(m))  # too late: no such check any more
        again = await c.asked(m)  # asked again after node_check_retry_s
        assert again.check_id != first.check_id and again.nonce != first.nonce
        await c.answer(m, again, for_minion(m))
        assert (await c.until(m, lambda v: v["verified"]))["verified"]
    async with checked(
        nats_server, mongo_server, db_prefix, node_check_deadline_s=0.5, node_check_round_s=60
    ) as c:
        m = f"l-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        cmd = await c.asked(m)
        await asyncio.sleep(1.5)
        await c.answer(m, cmd, for_minion(m))
        v = await c.until(m, lambda v: "pending" not in v)
        assert (
            not v["verified"] and "answered" in v["reason"] and "after its deadline" in v["reason"]
        )


async def test_other_hardware_is_unverified_at_once_and_checked_again(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A verified node registers again with the same GPUs: still verified while checked
    again. With one GPU swapped for another: unverified at once (its NodeRegistered
    says so, with a newer verification_rev), until a new check passes."""
    async with checked(nats_server, mongo_server, db_prefix) as c:
        m = f"h-{uuid.uuid4().hex[:6]}"
        registered: list[dict[str, Any]] = []

        async def on_registered(msg: Any) -> None:
            body = json.loads(msg.data)
            if body["minion_id"] == m:
                registered.append(body)

        await c.bus.nc.subscribe(subjects.event("node", "registered"), cb=on_registered)
        await c.register(m)
        await c.answer(m, await c.asked(m), for_minion(m))
        await c.until(m, lambda v: v["verified"])
        await c.register(m)
        same = await c.asked(m)
        assert (await c.verification(m))["verified"]  # unchanged hardware, checked again
        gpus = registration(m, "a", REGION).gpus
        swapped = [gpus[0], gpus[1].model_copy(update={"uuid": "GPU-another-card"})]
        await c.register(m, gpus=swapped)
        v = await c.until(m, lambda v: not v["verified"])
        assert v["reason"] == "its hardware changed since it was checked; checking again"
        await c.answer(m, same, for_minion(m))  # the check of the old hardware: spent
        newer = await c.asked(m)
        await asyncio.sleep(0.5)
        assert not (await c.verification(m))["verified"]
        await wait_for_async(lambda: len(registered) == 3, timeout=5)
        assert [(r["verified"], r["verification_rev"]) for r in registered] == [
            (False, 0),
            (True, 1),
            (False, 2),
        ]
        await c.answer(m, newer, honest(swapped))
        assert (await c.until(m, lambda v: v["verified"]))["checks"]


async def test_the_owner_or_an_operator_asks_for_a_check_now(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with checked(nats_server, mongo_server, db_prefix) as c:
        m = f"o-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        await c.answer(m, await c.asked(m), for_minion(m))
        await c.until(m, lambda v: v["verified"])
        asked = await c.bus.ask("verify_node", {"node": m})
        assert asked["verification"]["pending"]["why"] == "asked by its owner"
        again = await c.bus.ask("verify_node", {"node": m})
        assert again["error"]["code"] == "conflict" and "has until" in again["error"]["message"]
        cmd = await c.asked(m)
        await c.answer(m, cmd, for_minion(m))
        await c.until(m, lambda v: "pending" not in v)

        reply = await c.bus.nc.request(
            subjects.admin("provisioner", "verify_node"),
            json.dumps({"account": c.bus.account, "node": m}).encode(),
            timeout=10,
        )
        shown = json.loads(reply.data)
        assert shown["verification"]["pending"]["why"] == "asked by its operator"
        # another account's node, and a node nobody has: not found
        async with provisioner(nats_server, mongo_server, db_prefix) as other:
            refused = await other.ask("verify_node", {"node": m})
        assert refused["error"]["code"] == "not_found"
        missing = await c.bus.ask("verify_node", {"node": "nobody"})
        assert missing["error"]["code"] == "not_found"


@pytest.mark.parametrize("interval_s", [1.0])
async def test_a_verified_node_is_checked_again_after_the_interval(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, interval_s: float
) -> None:
    async with checked(
        nats_server,
        mongo_server,
        db_prefix,
        node_check_interval_s=interval_s,
        node_check_round_s=0.2,
    ) as c:
        m = f"d-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        await c.answer(m, await c.asked(m), for_minion(m))
        await c.until(m, lambda v: v["verified"])
        due = await c.asked(m)  # a second check, without a registration
        v = await c.verification(m)
        assert v["verified"] and v["pending"]["why"] == "due again"
        # the re-check fails: it is no longer verified
        await c.answer(m, due, GpuCheck(error="no NVIDIA driver (NVML Shared Library Not Found)"))
        v = await c.until(m, lambda v: not v["verified"])
        assert v["reason"].startswith("the check found no GPUs: no NVIDIA driver")


async def test_a_node_whose_claim_failed_is_not_asked_again_by_itself(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Figures below the claim are not retried: only a registration or someone asking
    checks that node again (the round, every 0.2 s here, leaves it alone)."""
    async with checked(nats_server, mongo_server, db_prefix, node_check_round_s=0.2) as c:
        m = f"n-{uuid.uuid4().hex[:6]}"
        await c.register(m)
        cmd = await c.asked(m)
        small = for_minion(m)
        gpus = [g.model_copy(update={"bandwidth_gbps": 20.0}) for g in small.gpus]
        await c.answer(m, cmd, small.model_copy(update={"gpus": gpus}))
        v = await c.until(m, lambda v: "pending" not in v)
        assert not v["verified"] and "below 75 GB/s" in v["reason"]
        await asyncio.sleep(1.5)
        with pytest.raises(TimeoutError):
            await c.asked(m, wait_s=1)
        assert "pending" not in await c.verification(m)
