"""gpufleet_client against a real nats-server (authentication on) and a service answering
through gpufleet_bus: the typed reply, a refusal with its fields, a request the server
forbids, and no service at all (a read asked again until the deadline, a command once)."""

from __future__ import annotations

import asyncio

import pytest
from gpufleet_auth import Creds
from gpufleet_bus import Ports, ServiceRuntime
from gpufleet_client import Client, Forbidden, ServiceError, Unavailable
from gpufleet_contracts import FieldError
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import CancelJob, GetJob, ListAllJobs, ListJobs
from gpufleet_contracts.jobviews import JobView
from gpufleet_devstack import NatsServer

from ..conftest import broker_for, running


def _view(job_id: str, account: str) -> JobView:
    return JobView(
        id=job_id,
        name="train",
        project="default",
        owner=account,
        creator=account,
        state="queued",
        spec={},
        history=[],
        notes=[],
        workers=[],
    )


def scheduler(server: NatsServer) -> ServiceRuntime:
    """A scheduler's request table (its own credential) over a single job, `j-1` of acme."""
    rt = ServiceRuntime("scheduler", Ports(broker_for("scheduler", server)))

    async def get_job(body: GetJob, account: str) -> JobView:
        if (body.job_id, account) != ("j-1", "acme"):
            raise NotFound(f"no job {body.job_id}")
        return _view(body.job_id, account)

    async def cancel_job(body: CancelJob, account: str) -> JobView:
        raise Refused.of_field(
            "conflict",
            "the job has ended",
            field="job_id",
            rule="R-JOB-5",
            says="finished jobs cannot be cancelled",
        )

    rt.wire(requests={"get_job": get_job, "cancel_job": cancel_job})
    return rt


async def test_ask_returns_the_reply_model_and_refusals_are_service_errors(
    fresh_nats: NatsServer,
) -> None:
    user = Creds.read(fresh_nats.creds("user", "alice", account="acme"))
    async with running(scheduler(fresh_nats).app):
        async with await Client.connect(user, fresh_nats.url) as client:
            view = await client.ask(GetJob(job_id="j-1"))
            assert isinstance(view, JobView)
            assert (view.id, view.owner) == ("j-1", "acme")  # the account is the subject's
            typed = await client.ask(GetJob(job_id="j-1"), JobView)
            assert typed == view

            with pytest.raises(ServiceError) as refused:
                await client.ask(CancelJob(job_id="j-1"))
            assert (refused.value.code, refused.value.message) == ("conflict", "the job has ended")
            assert refused.value.fields == [
                FieldError(
                    field="job_id", rule="R-JOB-5", message="finished jobs cannot be cancelled"
                )
            ]
            with pytest.raises(ServiceError) as missing:
                await client.ask(GetJob(job_id="j-2"))
            assert missing.value.code == "not_found"

            with pytest.raises(Forbidden):  # an operator's request: the server refuses it
                await client.ask(ListAllJobs(), timeout_s=5)

        # An operator acting for acme asks as acme (its replies under acme's inboxes).
        operator = fresh_nats.creds("operator")
        async with await Client.connect(operator, fresh_nats.url, acting_for="acme") as client:
            assert (await client.ask(GetJob(job_id="j-1"), JobView)).owner == "acme"


async def test_no_service_is_unavailable_after_retrying_a_read_and_at_once_for_a_command(
    fresh_nats: NatsServer,
) -> None:
    user = Creds.read(fresh_nats.creds("user", "alice", account="acme"))
    client = await Client.connect(user, fresh_nats.url, timeout_s=1.5, retry_after_s=0.3)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(Unavailable) as read:
            await client.ask(ListJobs())
        assert loop.time() - started >= 1.4  # asked again until its deadline, not before
        assert read.value.code == "unavailable"
        assert read.value.subject == "gpufleet.v1.rpc.scheduler.list_jobs.acme"

        started = loop.time()
        with pytest.raises(Unavailable):  # not repeatable: no responders fails at once
            await client.ask(CancelJob(job_id="j-1"))
        assert loop.time() - started < 1.0
    finally:
        await client.close()


async def test_no_server_is_unavailable(fresh_nats: NatsServer) -> None:
    user = Creds.read(fresh_nats.creds("user", "alice", account="acme"))
    with pytest.raises(Unavailable, match="cannot connect"):
        await Client.connect(user, "nats://127.0.0.1:1", connect_timeout_s=0.5)
