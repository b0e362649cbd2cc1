"""Tenancy over the real bus, with authentication (R-TEN-1..3): an operator creates accounts
on their plans (the provisioner's `AccountChanged` reaches the scheduler), each account's user
speaks for its account only, projects are managed with the scheduler's requests, members
submit federated jobs, and a free account is refused regional resources."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts import Envelope, subjects
from gpufleet_contracts.jobs import ListAllJobs
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_devstack.identities import admin_request
from gpufleet_provisioner.app import build_app as provisioner_app
from gpufleet_provisioner.settings import ProvisionerSettings
from gpufleet_scheduler.app import build_app as scheduler_app
from gpufleet_scheduler.scheduler import Scheduler
from nats.aio.client import Client

from ..conftest import running, store_for


def service_bus(server: NatsServer, service: str) -> BusSettings:
    return BusSettings(nats_url=server.url, nats_creds=server.creds("service", service))


class User:
    """A user of one account: its requests go to that account's subjects, the only ones its
    credential may publish to."""

    def __init__(self, nc: Client, account: str) -> None:
        self.nc, self.account = nc, account

    async def ask(self, verb: str, body: dict[str, Any]) -> Any:
        subject = subjects.as_account(subjects.rpc("scheduler", verb), self.account)
        headers = Envelope(type=f"gpufleet.{verb}.v1", source="test", subject=subject).headers()
        msg = await self.nc.request(subject, json.dumps(body).encode(), 10, headers=headers)
        return json.loads(msg.data)


@pytest.fixture
async def stack(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> AsyncIterator[tuple[Scheduler, dict[str, User]]]:
    pstore = store_for("provisioner", mongo_server.url, db_prefix)
    sstore = store_for("scheduler", mongo_server.url, db_prefix)
    pbus, sbus = service_bus(nats_server, "provisioner"), service_bus(nats_server, "scheduler")
    prov = provisioner_app(
        Ports(make_broker("provisioner", pbus), pstore, bus=pbus),
        ProvisionerSettings(auth_dir=None),
    ).app
    built = scheduler_app(Ports(make_broker("scheduler", sbus), sstore, bus=sbus))
    sched_app, sched = built.app, built.core
    # accounts of this test alone (the server and its streams are the session's)
    names = {n: f"{n}-{db_prefix}" for n in ("acme", "bob", "carol")}
    users: dict[str, User] = {}
    async with running(prov, sched_app):
        for key, plan in (("acme", "team"), ("bob", "free"), ("carol", "free")):
            reply = await admin_request(
                nats_server, "create_account", {"account": names[key], "plan": plan}
            )
            assert reply["plan"] == plan, reply

        async def known() -> bool:
            return (
                await sstore.db.accounts.count_documents({"_id": {"$in": [*names.values()]}}) == 3
            )

        await wait_for_async(known, timeout=20)
        for key, account in names.items():
            creds = nats_server.creds("user", "dev", account=account)
            nc = await nats.connect(nats_server.url, **NatsServer.client(creds))
            users[key] = User(nc, account)
        try:
            yield sched, users
        finally:
            for u in users.values():
                await u.nc.close()
    await pstore.close()
    await sstore.close()


async def operator_asks(server: NatsServer, body: dict[str, Any]) -> Any:
    """The operators' `list_all_jobs`, on the admin subject, with an operator's credential."""
    subject = subjects.admin("scheduler", "list_all_jobs")
    headers = Envelope(type=ListAllJobs.TYPE, source="test", subject=subject).headers()
    nc = await nats.connect(server.url, **server.admin())
    try:
        msg = await nc.request(subject, json.dumps(body).encode(), 10, headers=headers)
    finally:
        await nc.close()
    return json.loads(msg.data)


def job(name: str, **kw: Any) -> dict[str, Any]:
    return {"spec": {"name": name, "gpu_types": ["RTX 3090"], "command": ["true"], **kw}}


def fields(reply: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["field"], f["rule"]) for f in reply["error"]["fields"]]


async def test_projects_federated_jobs_and_plans_over_the_bus(
    stack: tuple[Scheduler, dict[str, User]], nats_server: NatsServer
) -> None:
    sched, u = stack
    acme, bob, carol = u["acme"], u["bob"], u["carol"]

    created = await acme.ask("create_project", {"name": "research"})
    assert created["id"] == f"{acme.account}/research" and created["members"] == []
    again = await acme.ask("create_project", {"name": "research"})
    assert again["error"]["code"] == "conflict"
    bad = await acme.ask("create_project", {"name": "a/b"})
    assert fields(bad) == [("name", "R-TEN-1")]
    added = await acme.ask("add_project_member", {"project": "research", "account": bob.account})
    assert added["members"] == [bob.account]

    listed = await bob.ask("list_projects", {})
    assert listed["projects"] == [
        {
            "id": f"{acme.account}/research",
            "name": "research",
            "owner": acme.account,
            "role": "member",
            "created_at": created["created_at"],
        }
    ]
    assert (await carol.ask("list_projects", {}))["projects"] == []

    # bob submits to acme's project: acme owns (pays), bob created it
    ref = f"{acme.account}/research"
    submitted = await bob.ask("submit_job", job("federated", project=ref))
    assert submitted["state"] == "queued", submitted
    shown = await bob.ask("get_job", {"job_id": submitted["id"]})
    assert (shown["owner"], shown["creator"], shown["project"]) == (
        acme.account,
        bob.account,
        "research",
    )
    assert (await acme.ask("get_job", {"job_id": submitted["id"]}))["id"] == submitted["id"]
    for verb in ("get_job", "cancel_job", "job_logs"):
        refused = await carol.ask(verb, {"job_id": submitted["id"]})
        assert refused["error"]["code"] == "not_found", (verb, refused)
    # carol's cancel changed nothing: the job still waits, as its owner and creator see it
    for who in (acme, bob):
        after = await who.ask("get_job", {"job_id": submitted["id"]})
        assert after["state"] == "queued" and after["history"] == shown["history"], after
        assert [w["state"] for w in after["workers"]] == [w["state"] for w in shown["workers"]]
    assert [j["id"] for j in (await acme.ask("list_jobs", {}))["jobs"]] == [submitted["id"]]
    assert (await carol.ask("list_jobs", {}))["jobs"] == []

    # a non-member: "not found", for the project as for any other account's object
    refused = await carol.ask("submit_job", job("intruder", project=ref))
    assert refused["error"]["code"] == "not_found"
    assert fields(refused) == [("spec.project", "R-TEN-2")]
    # a member does not manage the project
    refused = await bob.ask("add_project_member", {"project": ref, "account": carol.account})
    assert refused["error"]["code"] == "not_found"

    # R-TEN-3: bob's own project on plan free has no regional resources; acme's has
    # A region no node of the shared test server is in (other tests register nodes there).
    region = f"lab-{uuid.uuid4().hex[:8]}"
    notebook = job("nb", type="notebook", reservation={"region": region, "name": "web"})
    refused = await bob.ask("submit_job", notebook)
    assert fields(refused) == [("spec.reservation", "R-TEN-3")]
    federated = {"spec": {**notebook["spec"], "project": ref}}
    pinned = await bob.ask("submit_job", federated)
    assert fields(pinned) == [("spec.region", "R-RES-1")]  # plan passes; no node there

    # the operator changes bob's plan: the event reaches the scheduler
    reply = await admin_request(nats_server, "set_plan", {"account": bob.account, "plan": "team"})
    assert reply["plan"] == "team"

    async def upgraded() -> bool:
        return str(await sched.projects.plan_of(bob.account)) == "team"

    await wait_for_async(upgraded, timeout=20)
    refused = await bob.ask("submit_job", notebook)
    assert fields(refused) == [("spec.region", "R-RES-1")]

    # removed: bob submits no more, and still sees what he ran
    removed = await acme.ask(
        "remove_project_member", {"project": "research", "account": bob.account}
    )
    assert removed["members"] == []
    refused = await bob.ask("submit_job", job("late", project=ref))
    assert refused["error"]["code"] == "not_found"
    assert (await bob.ask("get_job", {"job_id": submitted["id"]}))["creator"] == bob.account
    cancelled = await bob.ask("cancel_job", {"job_id": submitted["id"]})
    assert cancelled["state"] == "stopped", cancelled


async def test_an_operator_lists_every_accounts_jobs_and_a_user_cannot(
    stack: tuple[Scheduler, dict[str, User]], nats_server: NatsServer
) -> None:
    _, u = stack
    acme, bob = u["acme"], u["bob"]
    a1 = (await acme.ask("submit_job", job("a-1")))["id"]
    b1 = (await bob.ask("submit_job", job("b-1")))["id"]
    assert (await bob.ask("cancel_job", {"job_id": b1}))["state"] == "stopped"
    a2 = (await acme.ask("submit_job", job("a-2")))["id"]

    every = (await operator_asks(nats_server, {}))["jobs"]
    assert {(j["id"], j["owner"], j["creator"]) for j in every} == {
        (a1, acme.account, acme.account),
        (b1, bob.account, bob.account),
        (a2, acme.account, acme.account),
    }
    queued_at = [j["queued_at"] for j in every]
    assert queued_at == sorted(queued_at, reverse=True)  # newest first
    assert len((await operator_asks(nats_server, {"limit": 2}))["jobs"]) == 2
    of_bob = await operator_asks(nats_server, {"account": bob.account})
    assert [j["id"] for j in of_bob["jobs"]] == [b1]
    waiting = await operator_asks(nats_server, {"account": acme.account, "state": "queued"})
    assert {j["id"] for j in waiting["jobs"]} == {a1, a2}
    assert (await operator_asks(nats_server, {"state": "stopped"}))["jobs"][0]["id"] == b1
    bad = await operator_asks(nats_server, {"state": "sleeping"})
    assert bad["error"]["code"] == "invalid"

    # A user's credential may not publish on the admin subject: nobody ever answers it.
    with pytest.raises(nats.errors.TimeoutError):
        await bob.nc.request(subjects.admin("scheduler", "list_all_jobs"), b"{}", timeout=1)
