"""Attack class 3: acting as another account (R-TEN-2).

The acting account is the last token of the request subject, which the server lets only
that account's users publish; a `gpufleet-account` header is a client's claim and ignored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_contracts import subjects

from .attack import Client
from .conftest import ATTACKER_ACCOUNT, VICTIM_ACCOUNT, System, Victim, attacker_subject

CLAIM = {"gpufleet-account": VICTIM_ACCOUNT}


def victims(service: str, verb: str) -> str:
    return subjects.as_account(subjects.rpc(service, verb), VICTIM_ACCOUNT)


@pytest.mark.parametrize("verb", ["get_job", "cancel_job", "job_logs"])
async def test_a_header_naming_the_victims_account_is_ignored(
    system: System, victim: Victim, eve: Path, verb: str
) -> None:
    """The attacker asks for (cancels, reads the logs of) the victim's job on its own
    subject, with a header claiming to be the victim's account: "not found"."""
    async with Client(system.nats.url, eve) as attacker:
        reply = await attacker.request(
            attacker_subject("scheduler", verb), {"job_id": victim.job_id}, headers=CLAIM
        )
    assert reply.get("ok") is False and reply["error"]["code"] == "not_found", reply
    assert victim.secret not in str(reply)
    await victim.assert_untouched()


async def test_a_header_does_not_list_the_victims_jobs_or_bill(
    system: System, victim: Victim, eve: Path
) -> None:
    """list_jobs, balance and entries with the claiming header answer the attacker's own."""
    async with Client(system.nats.url, eve) as attacker:
        jobs = await attacker.request(attacker_subject("scheduler", "list_jobs"), {}, headers=CLAIM)
        balance = await attacker.request(attacker_subject("billing", "balance"), {}, headers=CLAIM)
        entries = await attacker.request(attacker_subject("billing", "entries"), {}, headers=CLAIM)
        cost = await attacker.request(
            attacker_subject("billing", "job_cost"), {"job_id": victim.job_id}, headers=CLAIM
        )
    assert victim.job_id not in [j["id"] for j in jobs["jobs"]]
    assert balance["account"] == ATTACKER_ACCOUNT and balance["entries"] == 0
    assert entries["entries"] == []
    assert cost["entries"] == [] and cost["cost_micro"] == 0
    await victim.assert_untouched()


@pytest.mark.parametrize(
    ("service", "verb"),
    [
        ("scheduler", "get_job"),
        ("scheduler", "cancel_job"),
        ("scheduler", "job_logs"),
        ("scheduler", "submit_job"),
        ("billing", "balance"),
        ("provisioner", "list_nodes"),
        ("provisioner", "revoke_node"),
        ("provisioner", "issue_join_token"),
    ],
)
async def test_publishing_on_the_victims_subject_is_refused(
    system: System, victim: Victim, eve: Path, service: str, verb: str
) -> None:
    """The attacker sends its request on the victim's subject (`...<verb>.local`): the
    server refuses the publish, no service ever sees it."""
    body = {"job_id": victim.job_id, "node": "local-node-1"}
    async with Client(system.nats.url, eve) as attacker:
        await attacker.request_refused(victims(service, verb), body)
    await victim.assert_untouched()


@pytest.mark.parametrize(
    "subject",
    [
        subjects.rpc("scheduler", "get_job"),  # no account token at all
        f"{subjects.RPC}.scheduler.cancel_job.{VICTIM_ACCOUNT}.x",
        subjects.admin("provisioner", "add_user"),  # an operator's verb
        subjects.admin("provisioner", "remove_account"),  # the victim's account itself
        subjects.admin("provisioner", "issue_join_token"),
        subjects.admin("scheduler", "list_all_jobs"),  # every account's jobs
    ],
)
async def test_a_request_on_no_account_or_an_operators_subject_is_refused(
    system: System, victim: Victim, eve: Path, subject: str
) -> None:
    """Requests that name no account, a sub-token of the victim's, or an operator's verb."""
    body = {"job_id": victim.job_id, "account": VICTIM_ACCOUNT, "user": "eve"}
    async with Client(system.nats.url, eve) as attacker:
        await attacker.request_refused(subject, body)
    await victim.assert_untouched()


async def test_enqueue_job_on_the_victims_subject_is_refused(
    system: System, victim: Victim, eve: Path
) -> None:
    """EnqueueJob on `gpufleet.v1.cmd.scheduler.local.enqueue_job` (the victim would pay):
    refused; no job appears in the victim's list."""
    before = await victim.jobs()
    subject = f"{subjects.COMMANDS}.scheduler.{VICTIM_ACCOUNT}.enqueue_job"
    async with Client(system.nats.url, eve) as attacker:
        await attacker.publish_refused(subject, b'{"request_id": "x", "spec": {}}')
    assert await victim.jobs() == before
    await victim.assert_untouched()
