"""The scheduler against the real bus and database: node changes, region pins, fractional
GPUs, price changes, pending demand, restart, and two instances at once (fencing)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import Ports, publish
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    GetJob,
    JobSpec,
    PendingDemandChanged,
    StartWorker,
    StopWorker,
    SubmitJob,
    WorkerFinished,
    WorkerStarted,
)
from gpufleet_contracts.nodes import GpuInfo, NodeRegistered, NodeState, NodeStateChanged
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app
from gpufleet_scheduler.leadership import Deposed, Lease
from gpufleet_scheduler.scheduler import Scheduler
from gpufleet_scheduler.settings import SchedulerSettings

from ..bus.test_bus import read_stream
from ..conftest import (
    AccountClient,
    JsPublisher,
    as_identity,
    broker_for,
    connect,
    running,
    store_for,
)


def registered(
    minion: str,
    *,
    gpus: int = 2,
    model: str = "RTX 3090",
    region: str = "local",
    owner: str = "local",
    shares: int = 1,
    price: str | None = None,
    public: bool = False,
    state: NodeState = NodeState.active,
    simulated: bool = False,
    verified: bool = True,
    sealing: bool = False,
) -> NodeRegistered:
    return NodeRegistered(
        node_id="n-" + minion,
        minion_id=minion,
        name=minion,
        region=region,
        owner=owner,
        state=state,
        gpus=[
            GpuInfo(index=i, uuid=f"{minion}-{i}", model=model, nvml_name=model, memory_mb=24576)
            for i in range(gpus)
        ],
        simulated=simulated,
        price_per_gpu_hour=None if price is None else Decimal(price),
        allow_public_jobs=public,
        gpu_shares=shares,
        # as the provisioner says of a node whose GPU check passed (simulated: never)
        verified=verified and not simulated,
        # a key to seal its workers' secrets to: only such a node takes a job that has any
        # (env values, attached keys, a notebook's token)
        sealing_key=SealingKey.generate().public_key if sealing else None,
        at=datetime.now(UTC),
    )


def state_changed(minion: str, state: NodeState) -> NodeStateChanged:
    return NodeStateChanged(
        node_id="n-" + minion, minion_id=minion, state=state, at=datetime.now(UTC)
    )


class Sys:
    """The test's side of a running scheduler, each part with its own credential: users of
    accounts (requests on their account's subjects), the provisioner (node events), the
    node agents (their workers' events) and an operator (reading the streams)."""

    def __init__(self, server: NatsServer, sched: Scheduler) -> None:
        self.server, self.sched = server, sched
        self.users: dict[str, AccountClient] = {}
        self.provisioner: JsPublisher | None = None

    async def close(self) -> None:
        for user in self.users.values():
            await user.nc.close()
        if self.provisioner is not None:
            await self.provisioner.nc.close()

    async def call(self, subject: str, payload: bytes, account: str = "local") -> dict[str, Any]:
        if account not in self.users:
            creds = self.server.creds("user", "dev", account=account)
            self.users[account] = AccountClient(await connect(self.server, creds), account)
        return await self.users[account].call(subject, payload)

    async def submit(self, name: str, account: str = "local", **kw: Any) -> dict[str, Any]:
        spec = JobSpec.model_validate(
            {"name": name, "gpu_types": ["RTX 3090"], "command": ["true"], **kw}
        )
        return await self.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes(), account)

    async def job(self, job_id: str, account: str = "local") -> dict[str, Any]:
        return await self.call(GetJob.SUBJECT, GetJob(job_id=job_id).to_bytes(), account)

    async def node(self, evt: NodeRegistered | NodeStateChanged) -> None:
        if self.provisioner is None:
            creds = self.server.creds("service", "provisioner")
            self.provisioner = JsPublisher(await connect(self.server, creds))
        await publish(self.provisioner, evt, source="test")

    async def worker(self, evt: WorkerStarted | WorkerFinished) -> None:
        """A worker's event, from its node agent."""
        async with as_identity(self.server, "node", evt.minion_id) as agent:
            await publish(agent, evt, source="test")

    async def until(self, job_id: str, state: str, account: str = "local") -> dict[str, Any]:
        async def reached() -> bool:
            return bool((await self.job(job_id, account))["state"] == state)

        await wait_for_async(reached, timeout=10)
        return await self.job(job_id, account)

    async def starts(self, minion: str) -> list[StartWorker]:
        msgs = await read_stream(self.server, StartWorker.SUBJECT.format(minion_id=minion))
        return [StartWorker.from_bytes(m.data) for m in msgs]


@pytest.fixture
async def system(fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str) -> Any:
    built = build_app(
        Ports(
            broker_for("scheduler", fresh_nats), store_for("scheduler", mongo_server.url, db_prefix)
        ),
        SchedulerSettings(starve_after_s=3600),
    )
    app, sched = built.app, built.core
    async with running(app):
        s = Sys(fresh_nats, sched)
        yield s
        await s.close()
        async with sched.state.lock:
            assert_unplaced_current(sched)


def assert_unplaced_current(sched: Scheduler) -> None:
    """What a pass reads (`unplaced`, kept as jobs change) is what walking every open job
    would find: checked after each test of this module, whatever the test did."""
    if not sched.state.loaded:
        return
    walked = {
        job_id: keys
        for job_id, job in sched.state.jobs.items()
        if not job.get("cancel_requested")
        and (keys := [w.key for w in sched.state.waiting_of(job)])
    }
    assert {j: [w.key for w in ws] for j, ws in sched.state.unplaced.items()} == walked


async def known(s: Sys, *minions: str) -> None:
    async def all_known() -> bool:
        n = await s.sched.state.db.nodes.count_documents({"minion_id": {"$in": list(minions)}})
        return bool(n == len(minions))

    await wait_for_async(all_known, timeout=10)


async def test_a_lost_node_requeues_training_and_fails_notebooks(system: Sys) -> None:
    s = system
    await s.node(registered("a", gpus=2, sealing=True))  # a notebook's token is sealed to it
    await known(s, "a")
    train = await s.submit("train")
    note = await s.submit("nb", type="notebook")
    await s.until(train["id"], "starting")
    await s.until(note["id"], "starting")
    await s.node(registered("b", gpus=2, model="RTX 3090"))
    await known(s, "b")
    await s.node(state_changed("a", NodeState.lost))

    async def moved() -> bool:
        job = await s.job(train["id"])
        return bool(job["workers"][0]["node"] == "b")

    await wait_for_async(moved, timeout=10)
    job = await s.job(train["id"])
    assert job["state"] == "starting" and job["workers"][0]["attempts"] == 1
    assert any("requeued: node a lost" in n["note"] for n in job["notes"])
    nb = await s.until(note["id"], "failed")
    assert "notebooks are not restarted" in nb["notes"][0]["note"]
    stops = [
        StopWorker.from_bytes(m.data)
        for m in await read_stream(s.server, "gpufleet.v1.cmd.node.a.stop_worker")
    ]
    assert {x.job_id for x in stops} == {train["id"], note["id"]}
    # the lost node's workers, declared failed by the scheduler on that node's subject
    finished = await read_stream(s.server, subjects.kept("finished", "a"))  # as billing reads
    closed = [WorkerFinished.from_bytes(m.data) for m in finished]
    assert {(f.job_id, f.reason) for f in closed} >= {(train["id"], "node a lost")}
    claims = await s.sched.state.db.claims.find({}).to_list(None)
    assert {c["node_id"] for c in claims} == {"n-b"}


async def test_worker_facts_are_dispatched_by_type_in_stream_order(system: Sys) -> None:
    """One consumer reads what nodes report (started, finished) and hands each to its
    handler by type, in the order the stream stored them: a start published just before
    its finish is applied first. A finish with no start (a worker that never started)
    closes the worker without a run, and a fact seen again changes nothing."""
    s = system
    await s.node(registered("a", gpus=2))
    await known(s, "a")
    ran, never = await s.submit("ran"), await s.submit("never")

    async def two_starts() -> bool:
        return len(await s.starts("a")) == 2

    await wait_for_async(two_starts, timeout=10)
    by_job = {st.job_id: st for st in await s.starts("a")}
    t0 = datetime.now(UTC)

    def fact(job: dict[str, Any], cls: Any, **kw: Any) -> Any:
        start = by_job[job["id"]]
        return cls(job_id=job["id"], worker=0, placement_id=start.placement_id, minion_id="a", **kw)

    started = fact(ran, WorkerStarted, started_at=t0)
    finished = fact(ran, WorkerFinished, state="finished", exit_code=0, ended_at=t0)
    failed = fact(never, WorkerFinished, state="failed", exit_code=1, ended_at=t0)
    for evt in (started, finished, failed, started, finished):  # back to back, twice
        await s.worker(evt)
    done = await s.until(ran["id"], "finished")
    assert [h["state"] for h in done["history"]] == ["queued", "starting", "running", "finished"]
    gone = await s.until(never["id"], "failed")
    assert [h["state"] for h in gone["history"]] == ["queued", "starting", "failed"]
    assert gone["workers"][0]["started_at"] is None


async def test_maintenance_takes_no_new_work_and_active_runs_the_queue(system: Sys) -> None:
    s = system
    await s.node(registered("a", gpus=1))
    await known(s, "a")
    running_job = await s.submit("running")
    await s.until(running_job["id"], "starting")
    await s.node(state_changed("a", NodeState.maintenance))

    async def in_maintenance() -> bool:
        n = await s.sched.state.db.nodes.find_one({"minion_id": "a"})
        return bool(n and n["state"] == "maintenance")

    await wait_for_async(in_maintenance, timeout=10)
    await s.node(registered("b", gpus=1, state=NodeState.maintenance))
    await known(s, "b")
    waiting = await s.submit("waits")
    assert waiting["state"] == "queued"
    assert "2 nodes: maintenance, not active" in waiting["queue_reason"]
    assert (await s.job(running_job["id"]))["state"] == "starting"  # untouched
    await s.node(state_changed("b", NodeState.active))
    job = await s.until(waiting["id"], "starting")
    assert job["workers"][0]["node"] == "b"


async def test_a_removed_node_is_no_reason_to_wait(system: Sys) -> None:
    """A waiting job's reasons neither name nor count a removed node."""
    s = system
    await s.node(registered("r", gpus=1))
    await s.node(registered("m", gpus=1, state=NodeState.maintenance))
    await known(s, "r", "m")
    await s.node(state_changed("r", NodeState.removed))

    async def removed() -> bool:
        n = await s.sched.state.db.nodes.find_one({"minion_id": "r"})
        return bool(n and n["state"] == "removed")

    await wait_for_async(removed, timeout=10)
    waiting = await s.submit("waits")
    assert waiting["queue_reason"] == "1 node: maintenance, not active"
    assert waiting["queue_detail"] == [{"reason": "maintenance, not active", "nodes": 1}]


async def test_a_pin_to_a_region_without_the_gpu_type_is_refused(system: Sys) -> None:
    s = system
    await s.node(registered("a", region="eu"))
    await s.node(registered("t", region="us", model="T4"))
    await known(s, "a", "t")
    reply = await s.submit("pinned", region="us")
    assert reply["ok"] is False
    (field,) = reply["error"]["fields"]
    assert field["field"] == "spec.region" and field["rule"] == "R-RES-1"
    assert field["valid"] == "a region of yours with RTX 3090: eu"
    jobs = await s.sched.state.db.jobs.count_documents({})
    assert jobs == 0
    ok = await s.submit("pinned", region="eu")
    assert ok["state"] == "starting"


async def test_another_accounts_region_of_the_same_name_is_not_the_pinned_one(
    system: Sys,
) -> None:
    """Region names are unique per owner only (R-RES-1): bob's public `lab`, with the GPU
    type, neither satisfies local's pin to `lab` at submission nor takes the job."""
    s = system
    await s.node(registered("bobs", region="lab", owner="bob", price="0.10", public=True))
    await s.node(registered("mine", region="home"))
    await known(s, "bobs", "mine")
    reply = await s.submit("pinned", region="lab")
    assert reply["ok"] is False, reply
    (field,) = reply["error"]["fields"]
    assert (
        field["field"] == "spec.region"
        and field["valid"] == "a region of yours with RTX 3090: home"
    )
    assert await s.sched.state.db.jobs.count_documents({"spec.name": "pinned"}) == 0
    unpinned = await s.submit("free", max_price="1.0")  # bob's public node may take it
    assert unpinned["state"] == "starting", unpinned


async def test_fractions_are_packed_onto_shares_and_the_agent_gets_the_limit(system: Sys) -> None:
    s = system
    await s.node(registered("f", gpus=1, shares=4))
    await known(s, "f")
    jobs = [await s.submit(f"q{i}", gpu_count="0.5") for i in range(3)]
    assert [j["state"] for j in jobs] == ["starting", "starting", "queued"]
    assert "no GPU with 2 of 4 shares free" in jobs[2]["queue_reason"]
    starts = await s.starts("f")
    assert [st.gpu_fraction for st in starts] == [Decimal("0.5")] * 2
    assert {st.gpu_memory_limit_mb for st in starts} == {12288}
    assert all(st.mounts and st.mounts[-1].target == "/opt/ml/output" for st in starts)
    claims = sorted(c["_id"] for c in await s.sched.state.db.claims.find({}).to_list(None))
    assert claims == [f"n-f:0:{i}" for i in range(4)]
    job = await s.job(jobs[0]["id"])
    assert job["rate"] == "0.025000"  # half of the 0.05 usage fee


async def test_a_price_drop_starts_a_job_that_waited_for_it(system: Sys) -> None:
    s = system
    await s.node(registered("p", owner="seller", price="2.10", public=True))
    await known(s, "p")
    job = await s.submit("cheap", max_price="1.50")
    assert job["queue_reason"] == "1 node: 2.10 > max price 1.50"
    assert job["queue_detail"] == [{"reason": "2.10 > max price 1.50", "nodes": 1}]
    await s.node(registered("p", owner="seller", price="1.00", public=True))
    placed = await s.until(job["id"], "starting")
    assert placed["rate"] == "1.00" and placed["workers"][0]["charge"] == "market"


async def test_a_simulated_node_takes_only_its_owners_jobs(system: Sys) -> None:
    s = system
    await s.node(registered("sim", owner="seller", price="0.01", public=True, simulated=True))
    await known(s, "sim")
    theirs = await s.submit("theirs", max_price="1.00")  # account "local"
    assert theirs["queue_reason"] == "1 node: another account's node with simulated GPUs"
    own = await s.submit("own", account="seller")
    placed = await s.until(own["id"], "starting", account="seller")
    assert placed["workers"][0]["charge"] == "usage"
    assert (await s.job(theirs["id"]))["state"] == "queued"


async def test_unplaceable_work_is_published_as_pending_demand(system: Sys) -> None:
    s = system
    job = await s.submit("nowhere", gpu_types=["H100 80GB"], allow_burst=True)
    assert job["queue_reason"] == "no nodes registered"

    async def published() -> bool:
        msgs = await read_stream(s.server, PendingDemandChanged.SUBJECT)
        return any(
            d.job_id == job["id"] and d.burst_allowed
            for m in msgs
            for d in PendingDemandChanged.from_bytes(m.data).demands
        )

    await wait_for_async(published, timeout=10)


async def test_a_restarted_scheduler_rebuilds_from_the_store(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    def make() -> Any:
        built = build_app(
            Ports(
                broker_for("scheduler", fresh_nats),
                store_for("scheduler", mongo_server.url, db_prefix),
            )
        )
        return built.app, built.core

    app, sched = make()
    async with running(app):
        s = Sys(fresh_nats, sched)
        await s.node(registered("a", gpus=1))
        await known(s, "a")
        first = await s.submit("first")
        second = await s.submit("second")
        assert second["state"] == "queued"
        await s.close()
    app2, sched2 = make()
    async with running(app2):
        s = Sys(fresh_nats, sched2)
        assert sched2.state.loaded and len(sched2.state.jobs) == 2
        start = (await s.starts("a"))[0]
        assert start.job_id == first["id"]
        await s.worker(
            WorkerFinished(
                job_id=first["id"],
                worker=0,
                placement_id=start.placement_id,
                minion_id="a",
                state="finished",
                exit_code=0,
                ended_at=datetime.now(UTC),
            )
        )
        await s.until(second["id"], "starting")
        await s.close()


async def test_two_schedulers_never_give_one_gpu_twice(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def make(name: str) -> Any:
        monkeypatch.setenv("GPUFLEET_SCHEDULER_INSTANCE", name)  # two hosts, two names
        built = build_app(
            Ports(
                broker_for("scheduler", fresh_nats),
                store_for("scheduler", mongo_server.url, db_prefix),
            )
        )
        return built.app, built.core

    apps = [make(f"scheduler-{i}") for i in range(2)]
    async with running(*(a for a, _ in apps)):
        s = Sys(fresh_nats, apps[0][1])
        for m in ("a", "b"):
            await s.node(registered(m, gpus=2))
        await known(s, "a", "b")
        # Requests go to either instance (queue group); both race to place.
        jobs = await asyncio.gather(*(s.submit(f"j{i}") for i in range(8)))
        await asyncio.gather(*(sched.passes.schedule() for _, sched in apps))

        async def four_placed() -> bool:
            return bool(await s.sched.state.db.claims.count_documents({}) == 4)

        await wait_for_async(four_placed, timeout=15)
        claims = await s.sched.state.db.claims.find({}).to_list(None)
        assert len({c["_id"] for c in claims}) == 4
        leaders = [sched for _, sched in apps if sched.state.lease.held]
        assert len(leaders) == 1
        states = [(await s.job(j["id"]))["state"] for j in jobs]
        assert states.count("starting") == 4 and states.count("queued") == 4
        await s.close()


async def test_a_deposed_leader_cannot_place(mongo_server: EmbeddedMongo, db_prefix: str) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clock = {"now": 1_000_000}
    a = Lease(store.db, ttl_ms=1000, owner="a", now_ms=lambda: clock["now"])
    b = Lease(store.db, ttl_ms=1000, owner="b", now_ms=lambda: clock["now"])
    assert await a.acquire() and not await b.acquire()
    clock["now"] += 5000  # a stalls past its lease; b takes over
    assert await b.acquire() and b.epoch == 2

    async def fenced(tx: Any) -> None:
        await a.fence(tx.session)

    with pytest.raises(Deposed):
        await store.transaction(fenced)

    async def fine(tx: Any) -> int:
        return await b.fence(tx.session)

    assert await store.transaction(fine) == 2
    await store.close()


async def test_a_leader_restarted_under_its_name_takes_its_lease_back_at_once(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """After a crash the lease is still held (its term runs 10 s). A process that starts under
    the holder's name takes it at once with the next epoch; the crashed one's writes would be
    fenced off. A process of another name still waits out the term."""
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clock = {"now": 1_000_000}

    def lease(owner: str) -> Lease:
        return Lease(store.db, ttl_ms=10_000, owner=owner, now_ms=lambda: clock["now"])

    crashed = lease("sched-1")
    assert await crashed.acquire() and crashed.epoch == 1
    clock["now"] += 1_000  # crashed: no renewal, no release; 9 s of its term left
    assert not await lease("sched-2").acquire()
    restarted = lease("sched-1")
    assert await restarted.acquire() and restarted.epoch == 2

    async def fenced(tx: Any) -> None:
        await crashed.fence(tx.session)

    with pytest.raises(Deposed):
        await store.transaction(fenced)
    # Were the name not unique after all, the earlier process does not take it back.
    assert not await crashed.acquire() and restarted.epoch == 2
    assert await restarted.acquire()
    await store.close()
