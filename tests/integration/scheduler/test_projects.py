"""Projects, federated jobs and plans in the scheduler, against the embedded database
(R-TEN-1..3, R-BILL-2): who owns and who created a job, who sees it, who may submit to a
project, and which plans may use regional resources. No relay runs: events stay in the
outbox to be read back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpufleet_billing.fees import is_federated
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.identity import AccountChanged, Plan
from gpufleet_contracts.jobs import JobSpec, WorkerPlaced
from gpufleet_devstack import EmbeddedMongo
from gpufleet_scheduler.app import INDEXES
from gpufleet_scheduler.scheduler import Scheduler
from gpufleet_store import Store
from gpufleet_store.store import OUTBOX, outbox_messages

from ..conftest import store_for
from .test_fleet import registered

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def clock() -> datetime:
    return datetime.now(UTC)


def spec(name: str, **kw: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "gpu_types": ["RTX 3090"], "command": ["true"], **kw}
    )


def notebook(name: str, region: str = "lab", **kw: Any) -> JobSpec:
    reservation = {"region": region, "name": "web"}
    return spec(name, type="notebook", reservation=reservation, **kw)


async def plans(sched: Scheduler, at: datetime = T0, **accounts: Plan) -> None:
    for account, plan in accounts.items():
        await sched.projects.account_changed(AccountChanged(account=account, plan=plan, at=at))


async def placed_events(store: Store) -> list[WorkerPlaced]:
    out: list[WorkerPlaced] = []
    for doc in await store.db[OUTBOX].find({}).to_list(None):
        for _, _, type_, payload in outbox_messages(doc):
            if type_ == WorkerPlaced.TYPE:
                out.append(WorkerPlaced.model_validate_json(payload))
    return out


def refusal(exc: pytest.ExceptionInfo[Refused]) -> tuple[str, list[tuple[str, str]]]:
    err = exc.value.reply.error
    return err.code, [(f.field, f.rule) for f in err.fields]


@pytest.fixture
async def sched(mongo_server: EmbeddedMongo, db_prefix: str) -> Any:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    await store.ensure_indexes(INDEXES)  # as the service does at start-up
    s = Scheduler(store, clock)
    await plans(s, acme=Plan.team, bob=Plan.free, carol=Plan.free)
    yield s
    await store.close()


async def test_a_federated_job_is_owned_by_the_project_owner_and_created_by_its_sender(
    sched: Scheduler,
) -> None:
    await sched.projects.create("acme", "research")
    await sched.projects.add_member("acme", "research", "bob")
    await sched.projects.add_member("acme", "research", "carol")
    await sched.lifecycle.node_changed(registered("a", owner="acme", gpus=2))

    job = await sched.admission.submit(spec("federated", project="acme/research"), "bob")

    assert (job["owner"], job["creator"], job["project"]) == ("acme", "bob", "research")
    assert job["state"] == "starting"  # on the owner's own node (R-SCHED-1)
    [placed] = await placed_events(sched.state.store)
    assert (placed.payer, placed.creator, placed.charge) == ("acme", "bob", "usage")
    # billing charges the creator the federated fee (R-BILL-2) on this WorkerPlaced
    assert is_federated(placed.creator, placed.payer, placed.job_type.value)

    # visible to the owner and the creator; another member of the project sees nothing
    assert (await sched.queries.get(job["id"], "acme"))["id"] == job["id"]
    assert (await sched.queries.get(job["id"], "bob"))["id"] == job["id"]
    for outsider in ("carol", "zed"):
        with pytest.raises(NotFound):
            await sched.queries.get(job["id"], outsider)
        with pytest.raises(NotFound):
            await sched.queries.document(job["id"], outsider)  # job_logs
        with pytest.raises(NotFound):
            await sched.lifecycle.cancel(job["id"], outsider)
    assert [j["id"] for j in await sched.queries.list("acme")] == [job["id"]]
    assert [j["id"] for j in await sched.queries.list("bob")] == [job["id"]]
    assert await sched.queries.list("carol") == []

    # its creator may cancel it
    cancelled = await sched.lifecycle.cancel(job["id"], "bob")
    assert cancelled["state"] in ("stopped", "running", "starting")
    stored = await sched.state.db.jobs.find_one({"_id": job["id"]})
    assert stored is not None and stored["cancel_requested"]


async def test_only_members_submit_to_another_accounts_project(sched: Scheduler) -> None:
    await sched.projects.create("acme", "research")
    await sched.projects.add_member("acme", "research", "bob")

    for account, ref in [
        ("carol", "acme/research"),  # not a member
        ("bob", "acme/secret"),  # no such project
        ("bob", "zed/research"),  # no such account
    ]:
        with pytest.raises(Refused) as exc:
            await sched.admission.submit(spec("x", project=ref), account)
        assert refusal(exc) == ("not_found", [("spec.project", "R-TEN-2")])
        assert ref in exc.value.reply.error.message

    job = await sched.admission.submit(spec("before", project="acme/research"), "bob")
    await sched.projects.remove_member("acme", "research", "bob")
    with pytest.raises(Refused):
        await sched.admission.submit(spec("after", project="acme/research"), "bob")
    # what bob ran there stays his to see
    assert (await sched.queries.get(job["id"], "bob"))["creator"] == "bob"
    assert await sched.state.db.jobs.count_documents({}) == 1


async def test_a_plain_project_name_is_the_senders_own_created_on_first_use(
    sched: Scheduler,
) -> None:
    job = await sched.admission.submit(spec("mine"), "bob")  # project "default"
    also = await sched.admission.submit(spec("mine-too", project="bob/default"), "bob")
    assert (job["owner"], job["creator"], job["project"]) == ("bob", "bob", "default")
    assert (also["owner"], also["project"]) == ("bob", "default")
    assert [p["id"] for p in await sched.projects.list("bob")] == ["bob/default"]
    with pytest.raises(Refused) as exc:
        await sched.projects.create("bob", "default")
    assert refusal(exc) == ("conflict", [("name", "R-TEN-1")])
    # another account's plain "default" is its own
    other = await sched.admission.submit(spec("theirs"), "carol")
    assert other["owner"] == "carol"
    assert await sched.state.db.projects.count_documents({}) == 2
    # a refused submission creates no project
    with pytest.raises(Refused):
        await sched.admission.submit(notebook("regional", project="fresh"), "carol")
    assert await sched.state.db.projects.find_one({"_id": "carol/fresh"}) is None


async def test_membership_is_managed_by_the_owner_only(sched: Scheduler) -> None:
    created = await sched.projects.create("acme", "research")
    assert created == {
        "id": "acme/research",
        "name": "research",
        "owner": "acme",
        "role": "owner",
        "members": [],
        "created_at": created["created_at"],
    }
    added = await sched.projects.add_member("acme", "acme/research", "bob")
    assert added["members"] == ["bob"]
    again = await sched.projects.add_member("acme", "research", "bob")
    assert again["members"] == ["bob"]  # once

    cases = [
        (lambda: sched.projects.add_member("acme", "research", "nobody"), "not_found", "account"),
        (lambda: sched.projects.add_member("acme", "research", "acme"), "invalid", "account"),
        (lambda: sched.projects.add_member("acme", "nothing", "bob"), "not_found", "project"),
        # a member does not manage the project; to it, it is not there to manage
        (
            lambda: sched.projects.add_member("bob", "acme/research", "carol"),
            "not_found",
            "project",
        ),
        (
            lambda: sched.projects.remove_member("bob", "acme/research", "bob"),
            "not_found",
            "project",
        ),
        (lambda: sched.projects.remove_member("acme", "research", "carol"), "not_found", "account"),
    ]
    for call, code, field in cases:
        with pytest.raises(Refused) as exc:
            await call()
        got_code, fields = refusal(exc)
        assert (got_code, fields[0][0]) == (code, field)

    [mine] = await sched.projects.list("acme")
    assert mine["members"] == ["bob"] and mine["role"] == "owner"
    [theirs] = await sched.projects.list("bob")
    assert theirs["role"] == "member" and "members" not in theirs
    assert await sched.projects.list("carol") == []
    removed = await sched.projects.remove_member("acme", "research", "bob")
    assert removed["members"] == []
    assert await sched.projects.list("bob") == []


async def test_regional_resources_need_the_project_owners_team_plan(sched: Scheduler) -> None:
    await sched.lifecycle.node_changed(registered("lab-1", owner="acme", region="lab"))
    await sched.projects.create("acme", "research")
    await sched.projects.add_member("acme", "research", "bob")

    with pytest.raises(Refused) as exc:
        await sched.admission.submit(notebook("free"), "bob")
    assert refusal(exc) == ("invalid", [("spec.reservation", "R-TEN-3")])
    assert "plan free" in exc.value.reply.error.message
    datastore = {"type": "regional_datastore", "path": "/d", "datastore": "nas", "region": "lab"}
    with pytest.raises(Refused) as exc:
        await sched.admission.submit(spec("data", type="inference", input_data=datastore), "nobody")
    assert refusal(exc) == ("invalid", [("spec.input_data.datastore", "R-TEN-3")])
    assert await sched.state.db.jobs.count_documents({}) == 0

    # the owner's plan counts: acme's team project takes bob's regional job
    ok = await sched.admission.submit(notebook("team"), "acme")
    federated = await sched.admission.submit(notebook("fed", project="acme/research"), "bob")
    assert ok["owner"] == "acme" and federated["owner"] == "acme"

    # a plan change reaches the scheduler as an event; an older event changes nothing
    await plans(sched, at=T0 + timedelta(hours=1), bob=Plan.team)
    await plans(sched, at=T0, bob=Plan.free)
    assert await sched.projects.plan_of("bob") == Plan.team
    # bob has no node in lab: the plan passes, R-RES-1 speaks
    with pytest.raises(Refused) as exc:
        await sched.admission.submit(notebook("bob-team", gpu_types=["A100 80GB"]), "bob")
    assert refusal(exc) == ("invalid", [("spec.region", "R-RES-1")])


async def test_submissions_to_a_new_project_arriving_together_create_it_once(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    create = sched.projects._create_once

    async def counted(pid: str, owner: str, name: str) -> None:
        calls.append(pid)
        await create(pid, owner, name)

    monkeypatch.setattr(sched.projects, "_create_once", counted)
    jobs = await asyncio.gather(
        *(sched.admission.submit(spec(f"j{i}", project="new"), "bob") for i in range(20))
    )
    assert {j["project"] for j in jobs} == {"new"}
    assert calls == ["bob/new"]
    await sched.admission.submit(spec("later", project="new"), "bob")
    assert calls == ["bob/new"]  # known from then on
