"""Attack class 9: aiming a service's answer at another identity's inbox.

A requester chooses the reply subject of its request. An identity that knows another's
inbox prefix (a public key is no secret) sets it there, so that the service's answer (a
health, a lookup, its queue) lands in the victim's inbox. The services answer a request only
under the inboxes its subject proves: a user's request on `gpufleet.v1.rpc.*.*.<account>`
under `_INBOX.account.<account>`, an enrolment on `gpufleet.v1.enroll.<minion_id>` under
`_INBOX.enroll.<minion_id>`; a node's own subjects are never answered. The victim watches
its whole inbox (more than any real client listens to) and receives nothing; the same
request with the attacker's own inbox is answered, so the aimed one was not lost on the way.

What the NATS server answers itself is not the services' to choose: a JetStream publish
with a reply subject gets its PubAck there, a JetStream API request its response. Such an
answer is about the attacker's own message or consumer, and a real client listens only on
per-connection random inboxes under its prefix, which no other tenant ever sees.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet_auth import Creds, new_user_key, public
from gpufleet_auth.tokens import JoinToken
from gpufleet_contracts import subjects
from gpufleet_contracts.identity import EnrollNode
from gpufleet_contracts.nodes import NodeHeartbeat

from .attack import Client
from .conftest import EVIL_NODE, VICTIM_NODE, System, Victim, attacker_subject

SETTLE_S = 1.0  # after the control answer: anything aimed at the victim would be there

# What the attacker asks its own account, aimed at the victim: health, lookups, its queue,
# a refusal (a body that does not validate).
ASKED = [
    ("scheduler", "health", {}),
    ("provisioner", "health", {}),
    ("billing", "health", {}),
    ("scheduler", "list_jobs", {}),
    ("scheduler", "get_job", {"job_id": "no-such-job"}),
    ("scheduler", "dead_letters", {}),
    ("provisioner", "list_nodes", {}),
    ("provisioner", "show_node", {"node": VICTIM_NODE}),
    ("billing", "balance", {}),
    ("scheduler", "get_job", {"not_a_field": 1}),
]


@asynccontextmanager
async def victims_inbox(system: System, creds: Path) -> AsyncIterator[list[str]]:
    """The victim connected and subscribed to all of its inbox; what arrived there."""
    got: list[str] = []
    inbox = Creds.read(creds).inbox_prefix
    async with Client(system.nats.url, creds, name="victim") as me:

        async def on_msg(msg: Any) -> None:
            got.append(f"{msg.subject}: {msg.data[:120]!r}")

        await me.nc.subscribe(f"{inbox}.>", cb=on_msg)
        await me.nc.flush()
        yield got
        await asyncio.sleep(SETTLE_S)
        await me.nc.flush()


def aimed_at(creds: Path) -> str:
    """A reply subject in the victim's inbox, as one of its own requests would have."""
    return f"{Creds.read(creds).inbox_prefix}.{secrets.token_hex(11)}.1"


async def test_a_users_answers_cannot_be_aimed_at_another_accounts_inbox(
    system: System, victim: Victim, eve: Path
) -> None:
    """The attacker (account `mallory`) asks its own account's requests with the victim's
    inbox as the reply subject: the victim receives nothing; asked with its own inbox, each
    is answered."""
    async with (
        victims_inbox(system, victim.creds) as got,
        Client(system.nats.url, eve) as attacker,
    ):
        for service, verb, body in ASKED:
            subject = attacker_subject(service, verb)
            await attacker.aim(subject, body, aimed_at(victim.creds))
            # one at a time per subject: this answer comes after the aimed one's would
            answered = await attacker.request(subject, body)
            assert isinstance(answered, dict) and answered, (subject, answered)
    assert got == []
    await victim.assert_untouched()


async def test_a_node_cannot_aim_an_answer_at_a_users_inbox(
    system: System, victim: Victim, eve: Path, evil_node: Path
) -> None:
    """A node of the attacker's, before it enrols (its join token's credential), aims the
    provisioner's answer to its enrolment at the victim's inbox, and the node `evil` aims
    its heartbeat (its one subject a service reads on core NATS): the victim receives
    nothing; the enrolment asked with the token's own inbox is answered."""
    minion = f"evil-aim-{uuid.uuid4().hex[:6]}"
    body = {"minion_id": minion, "region": "local", "ttl_s": 3600}
    async with Client(system.nats.url, eve) as attacker:
        issued = await attacker.request(attacker_subject("provisioner", "issue_join_token"), body)
    token = JoinToken.parse(issued["token"])
    cmd = EnrollNode(
        minion_id=minion, secret=secrets.token_urlsafe(32), public_key=public(new_user_key())
    ).model_dump(mode="json")
    heartbeat = NodeHeartbeat(minion_id=EVIL_NODE, at=datetime.now(UTC)).model_dump(mode="json")
    async with victims_inbox(system, victim.creds) as got:
        async with Client(system.nats.url, token.creds, name=minion) as enrolling:
            await enrolling.aim(subjects.enroll(minion), cmd, aimed_at(victim.creds))
            answered = await enrolling.request(subjects.enroll(minion), cmd)
            assert answered["error"]["code"] == "not_found", answered
        async with Client(system.nats.url, evil_node, name=EVIL_NODE) as node:
            await node.aim(subjects.heartbeat(EVIL_NODE), heartbeat, aimed_at(victim.creds))
    assert got == []
    await victim.assert_untouched()
