"""Verified nodes in the running scheduler, on the real bus and database: another account's
job never goes to a node the provisioner has not verified (its owner's does), goes there
once NodeVerified says so, and the newest verdict holds whatever order the node's
registrations and verdicts are read in (two consumers)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet_contracts.nodes import NodeRegistered
from gpufleet_contracts.subjects import STREAM_EVENTS
from gpufleet_contracts.verification import NodeVerified
from gpufleet_devstack import wait_for_async

from ..conftest import connect
from .test_fleet import Sys, known, registered, system

__all__ = ["system"]  # the fixture, shared with test_fleet.py

NOT_VERIFIED = "1 node: another account's node, not verified"


def verdict(minion: str, verified: bool, rev: int) -> NodeVerified:
    return NodeVerified(
        node_id="n-" + minion,
        minion_id=minion,
        verified=verified,
        verification_rev=rev,
        reason=None if verified else "the check found no GPUs: no NVIDIA driver",
        checked_at=datetime.now(UTC),
        at=datetime.now(UTC),
    )


def selling(minion: str, verified: bool, rev: int = 0) -> NodeRegistered:
    """A node of account `seller`, open to public jobs at 0.50 per GPU-hour."""
    node = registered(minion, owner="seller", price="0.50", public=True, verified=verified)
    return node.model_copy(update={"verification_rev": rev})


async def verified_in_memory(s: Sys, minion: str) -> bool | None:
    node = s.sched.state.fleet.node("n-" + minion)
    return None if node is None else node.verified


async def read_all(s: Sys, durable: str = "scheduler-node-verified") -> None:
    """Until the scheduler has handled every node event of `durable` published so far."""
    nc = await connect(s.server)
    try:
        js = nc.jetstream()

        async def drained() -> bool:
            info = await js.consumer_info(STREAM_EVENTS, durable)
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_for_async(drained, timeout=10)
    finally:
        await nc.close()


async def test_another_accounts_job_waits_for_the_nodes_verification(system: Sys) -> None:
    s = system
    await s.node(selling("p", verified=False))
    await known(s, "p")
    theirs = await s.submit("theirs", max_price="5")  # account "local"
    assert theirs["state"] == "queued" and theirs["queue_reason"] == NOT_VERIFIED
    own = await s.submit("own", account="seller")
    placed = await s.until(own["id"], "starting", account="seller")
    assert placed["workers"][0]["node"] == "p" and placed["workers"][0]["charge"] == "usage"
    assert (await s.starts("p"))[0].job_id == own["id"]

    await s.node(verdict("p", True, 1))
    placed = await s.until(theirs["id"], "starting")
    assert placed["workers"][0]["charge"] == "market" and placed["rate"] == "0.50"

    await s.node(verdict("p", False, 2))
    await read_all(s)
    assert await verified_in_memory(s, "p") is False
    later = await s.submit("later", max_price="5")
    assert later["state"] == "queued" and NOT_VERIFIED in later["queue_reason"]
    assert [st.job_id for st in await s.starts("p")] == [own["id"], theirs["id"]]


async def test_the_newest_verdict_holds_in_any_order(system: Sys) -> None:
    """A stale verdict (an older rev) after a newer registration changes nothing; a
    registration older than the verdict held keeps the verdict; a verdict read before the
    node's registration is applied once the registration is."""
    s = system
    await s.node(selling("q", verified=False, rev=3))
    await known(s, "q")
    await s.node(verdict("q", True, 2))  # about hardware it no longer claims
    await read_all(s)
    theirs = await s.submit("theirs", max_price="5")
    assert theirs["queue_reason"] == NOT_VERIFIED
    assert await verified_in_memory(s, "q") is False

    await s.node(verdict("q", True, 4))
    await s.until(theirs["id"], "starting")
    await s.node(selling("q", verified=False, rev=3))  # a registration read late
    await read_all(s, "scheduler-node-registered")
    assert await verified_in_memory(s, "q") is True
    doc = await s.sched.state.db.nodes.find_one({"_id": "n-q"})
    assert doc is not None and (bool(doc["verified"]), doc["verification_rev"]) == (True, 4)

    await s.node(verdict("r", True, 1))  # before the node's registration
    await s.node(selling("r", verified=False, rev=0))
    await known(s, "r")
    await wait_for_async(lambda: verified_in_memory(s, "r"), timeout=15)
    second = await s.submit("second", max_price="5")
    assert second["state"] == "starting"
