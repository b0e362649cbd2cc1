"""Attack class 7: reading what is not one's own (events, logs, commands, replies, dead
letters).

A user may subscribe to its own inbox only and reads its jobs, logs and dead letters
through requests answered for its account; a node only to requests addressed to it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from gpufleet_auth import Creds
from gpufleet_contracts import subjects
from gpufleet_devstack import wait_for_async

from .attack import Client
from .conftest import (
    VICTIM_ACCOUNT,
    VICTIM_NODE,
    System,
    Victim,
    attacker_subject,
    last_seq,
)

USER_SUBSCRIPTIONS = [
    f"{subjects.EVENTS}.>",
    f"{subjects.LOGS}.>",
    f"{subjects.COMMANDS}.>",
    f"{subjects.DLQ}.>",
    f"{subjects.RPC}.*.*.{VICTIM_ACCOUNT}",  # the victim's requests, as they are sent
    f"{subjects.RPC}.>",
    f"{subjects.HEARTBEATS}.*",
    f"{subjects.ENROLL}.*",  # join token secrets on their way to the provisioner
    "_INBOX.>",  # everyone's replies
    "$JS.>",
    ">",
]
NODE_SUBSCRIPTIONS = [
    f"{subjects.EVENTS}.>",
    f"{subjects.LOGS}.>",
    f"{subjects.COMMANDS}.node.{VICTIM_NODE}.*",  # another node's commands, as published
    f"{subjects.NODES}.{VICTIM_NODE}.*",  # requests to another node
    f"{subjects.NODES}.*.*",  # requests to every node
    f"{subjects.NODES}.>",
    f"{subjects.RPC}.>",
    "_INBOX.>",
]


@pytest.mark.parametrize("subject", USER_SUBSCRIPTIONS)
async def test_a_user_cannot_subscribe_to_anything_but_its_inbox(
    system: System, victim: Victim, eve: Path, subject: str
) -> None:
    """The attacker's user subscribes to others' traffic: refused, nothing delivered."""
    async with Client(system.nats.url, eve) as attacker:
        await attacker.subscribe_refused(subject)
    await victim.assert_untouched()


async def test_a_user_cannot_subscribe_to_the_victims_inbox(
    system: System, victim: Victim, eve: Path
) -> None:
    """The victim's inbox prefix is public (its key is in its JWT): subscribing there to
    read the victim's replies is refused."""
    inbox = Creds.read(victim.creds).inbox_prefix
    async with Client(system.nats.url, eve) as attacker:
        await attacker.subscribe_refused(f"{inbox}.>")
    await victim.assert_untouched()


@pytest.mark.parametrize("subject", NODE_SUBSCRIPTIONS)
async def test_a_node_cannot_subscribe_to_others_traffic(
    system: System, victim: Victim, evil_node: Path, subject: str
) -> None:
    """The evil node subscribes to events, logs, another node's commands and requests."""
    async with Client(system.nats.url, evil_node) as attacker:
        await attacker.subscribe_refused(subject)
    await victim.assert_untouched()


async def test_another_account_cannot_read_a_jobs_logs(
    system: System, victim: Victim, eve: Path
) -> None:
    """The attacker asks for the victim's job logs with its own request, and with its own
    `gpufleet job logs`: not found, the victim's output nowhere in the answer."""
    async with Client(system.nats.url, eve) as attacker:
        reply = await attacker.request(
            attacker_subject("scheduler", "job_logs"), {"job_id": victim.job_id}
        )
    assert reply.get("ok") is False and reply["error"]["code"] == "not_found", reply
    env = {**system.env, "GPUFLEET_NATS_CREDS": str(eve)}
    shown = system.cli("job", "logs", victim.job_id, "--json", check=False, env=env)
    assert shown.returncode != 0
    assert json.loads(shown.stdout)["error"]["code"] == "not_found"
    assert victim.secret not in shown.stdout + shown.stderr
    await victim.assert_untouched()


async def test_dead_letters_of_one_account_are_not_shown_to_another(
    system: System, victim: Victim, eve: Path
) -> None:
    """The victim's refused EnqueueJob is dead-lettered (with its payload); the attacker's
    `gpufleet dlq list` does not show it, and the DLQ stream is closed to it."""
    marker = "victim-dead-letter-secret"
    subject = f"{subjects.COMMANDS}.scheduler.{VICTIM_ACCOUNT}.enqueue_job"
    before = await last_seq(system, subjects.STREAM_DLQ, f"{subjects.DLQ}.>") or 0
    async with Client(system.nats.url, victim.creds, name="victim") as me:
        await me.nc.jetstream().publish(
            subject, json.dumps({"request_id": marker, "spec": {"name": marker}}).encode()
        )

    async def dead_lettered() -> bool:
        seq = await last_seq(system, subjects.STREAM_DLQ, f"{subjects.DLQ}.>")
        return (seq or 0) > before

    await wait_for_async(dead_lettered, timeout=20, interval=0.3)

    # (a user's JetStream requests are refused, so never answered: a short timeout)
    env = {**system.env, "GPUFLEET_NATS_CREDS": str(eve), "GPUFLEET_REQUEST_TIMEOUT_S": "2"}
    shown = system.cli("dlq", "list", "--json", check=False, env=env)
    assert marker not in shown.stdout + shown.stderr
    async with Client(system.nats.url, eve) as attacker:
        await attacker.subscribe_refused(f"{subjects.DLQ}.>")
        await attacker.request_refused(f"$JS.API.STREAM.MSG.GET.{subjects.STREAM_DLQ}", {"seq": 1})
    await victim.assert_untouched()


async def test_dead_letters_request_answers_only_the_acting_accounts(
    system: System, victim: Victim, eve: Path
) -> None:
    """A refused request of the victim is in the victim's `dead_letters` (redacted), not in
    the attacker's; asking on the victim's subject is refused by the server."""
    marker = f"victim-refused-{uuid.uuid4().hex[:8]}"
    token = "ghp_" + "x" * 36
    verb = subjects.rpc("scheduler", "submit_job")
    bad = {"spec": {"name": marker, "env": {"GITHUB_TOKEN": token}, "gpu_count": "many"}}
    async with Client(system.nats.url, victim.creds, name="victim") as me:
        refused = await me.request(subjects.as_account(verb, VICTIM_ACCOUNT), bad)
        assert refused["error"]["code"] == "invalid"
        dead_letters = subjects.rpc("scheduler", "dead_letters")

        async def kept() -> bool:
            mine = await me.request(subjects.as_account(dead_letters, VICTIM_ACCOUNT), {})
            return marker in json.dumps(mine)

        await wait_for_async(kept, timeout=20, interval=0.3)
        mine = await me.request(subjects.as_account(dead_letters, VICTIM_ACCOUNT), {})
    assert token not in json.dumps(mine)  # the env value is redacted even for its owner
    async with Client(system.nats.url, eve) as attacker:
        theirs = await attacker.request(attacker_subject("scheduler", "dead_letters"), {})
        assert marker not in json.dumps(theirs)
        await attacker.request_refused(subjects.as_account(dead_letters, VICTIM_ACCOUNT), {})
    await victim.assert_untouched()


@pytest.mark.parametrize("who", ["user", "node"])
async def test_planting_a_dead_letter_is_refused(
    system: System, victim: Victim, eve: Path, evil_node: Path, who: str
) -> None:
    """A fake dead letter on a service's (or the victim node's) DLQ subject, for the
    victim's account to find: refused, nothing stored."""
    forger = eve if who == "user" else evil_node
    targets = [
        subjects.dead_letter("scheduler", VICTIM_ACCOUNT),
        f"{subjects.DLQ}.node-{VICTIM_NODE}.{VICTIM_ACCOUNT}",
    ]
    before = [await last_seq(system, subjects.STREAM_DLQ, t) for t in targets]
    async with Client(system.nats.url, forger) as attacker:
        for target in targets:
            await attacker.publish_refused(target, b'{"reason": "pay mallory to fix this"}')
    assert [await last_seq(system, subjects.STREAM_DLQ, t) for t in targets] == before
    await victim.assert_untouched()
