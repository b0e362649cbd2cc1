"""Attack class 5: becoming a node one is not (RegisterNode, join tokens, revocation).

A node's account and region are its enrolment's: a one-time join token, bound to one
minion id, exchanged once for a credential bound to the node's own key. RegisterNode counts
only on the node's own subject and only for an enrolled node; a revoked node is cut off.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from gpufleet_auth import Creds, new_user_key, public
from gpufleet_auth.tokens import JoinToken
from gpufleet_contracts import subjects
from gpufleet_contracts.identity import EnrollNode
from gpufleet_contracts.nodes import RegisterNode
from gpufleet_node_agent.enrol import EnrolmentError, enrol

from .attack import Client, connect_refused
from .conftest import (
    ATTACKER_ACCOUNT,
    EVIL_NODE,
    VICTIM_ACCOUNT,
    VICTIM_NODE,
    System,
    Victim,
    attacker_subject,
    last_seq,
    stored,
    wait_consumed,
)

COMMANDS = subjects.STREAM_COMMANDS
REGISTER_CONSUMER = "provisioner-register-node"


def register_subject(minion_id: str) -> str:
    return f"{subjects.COMMANDS}.provisioner.{minion_id}.register_node"


def register(minion_id: str, owner: str, region: str = "local") -> RegisterNode:
    """A node's registration (no GPUs: nothing would ever be placed on it)."""
    return RegisterNode(
        minion_id=minion_id,
        name=minion_id,
        region=region,
        owner=owner,
        hostname=minion_id,
        gpus=[],
        simulated=True,
        inventory_source="attacker",
        agent_started_at=datetime.now(UTC),
    )


async def join_token(victim: Victim, minion_id: str) -> str:
    """A join token the victim issued (`gpufleet node token <minion_id> --region local`)."""
    body = {"minion_id": minion_id, "region": "local", "ttl_s": 3600}
    reply = await victim.request("provisioner", "issue_join_token", body)
    return str(reply["token"])


async def enrolled(system: System, token: str, minion_id: str, path: Path) -> Creds:
    """Enrol as the node agent does; the node's credential."""
    await enrol([system.nats.url], token, minion_id, path, attempts=1)
    return Creds.read(path)


async def attacker_nodes(system: System, eve: Path) -> list[str]:
    async with Client(system.nats.url, eve) as attacker:
        reply = await attacker.request(attacker_subject("provisioner", "list_nodes"), {})
    return sorted(str(n["minion_id"]) for n in reply["nodes"])


# --- RegisterNode --------------------------------------------------------------------------


async def test_register_node_for_another_minion_is_refused(
    system: System, victim: Victim, evil_node: Path
) -> None:
    """Node `evil` publishes RegisterNode on `local-node-1`'s subject (to take it over,
    move it to another account or region): refused, nothing reaches the stream."""
    subject = register_subject(VICTIM_NODE)
    msg = register(VICTIM_NODE, owner=ATTACKER_ACCOUNT)
    before = await last_seq(system, COMMANDS, subject)
    nodes_before = await victim.nodes()
    async with Client(system.nats.url, evil_node) as attacker:
        await attacker.send_refused(subject, msg)
        await attacker.js_send_refused(subject, msg)
    assert await last_seq(system, COMMANDS, subject) == before
    assert await victim.nodes() == nodes_before
    (node,) = stored(system, "provisioner", "nodes", {"minion_id": VICTIM_NODE})
    assert node["owner"] == VICTIM_ACCOUNT and node["state"] == "active"
    await victim.assert_untouched()


@pytest.mark.parametrize("owner", [VICTIM_ACCOUNT, ATTACKER_ACCOUNT])
async def test_register_node_of_a_node_never_enrolled_creates_no_node(
    system: System, victim: Victim, evil_node: Path, eve: Path, owner: str
) -> None:
    """Node `evil` (a credential, but no enrolment) registers itself on its own subject,
    claiming to belong to the victim (or to the attacker's account): the provisioner
    creates no node, in either account's list."""
    victim_before, attacker_before = await victim.nodes(), await attacker_nodes(system, eve)
    async with Client(system.nats.url, evil_node) as attacker:
        ack = await attacker.js_send(register_subject(EVIL_NODE), register(EVIL_NODE, owner))
    await wait_consumed(system, COMMANDS, REGISTER_CONSUMER, ack.seq)
    assert await victim.nodes() == victim_before
    assert await attacker_nodes(system, eve) == attacker_before
    assert stored(system, "provisioner", "nodes", {"minion_id": EVIL_NODE}) == []
    await victim.assert_untouched()


async def test_an_enrolled_nodes_claimed_owner_and_region_are_ignored(
    system: System, victim: Victim, eve: Path, tmp_path: Path
) -> None:
    """A node the victim enrolled registers claiming the attacker's account and another
    region: it is registered for the account and region of its enrolment."""
    minion = "spare-claims"
    creds = await enrolled(system, await join_token(victim, minion), minion, tmp_path / "n")
    async with Client(system.nats.url, creds) as node:
        ack = await node.js_send(
            register_subject(minion), register(minion, ATTACKER_ACCOUNT, region="elsewhere")
        )
    await wait_consumed(system, COMMANDS, REGISTER_CONSUMER, ack.seq)
    assert minion in await victim.nodes()
    assert minion not in await attacker_nodes(system, eve)
    (node_doc,) = stored(system, "provisioner", "nodes", {"minion_id": minion})
    assert (node_doc["owner"], node_doc["region"]) == (VICTIM_ACCOUNT, "local")
    await victim.assert_untouched()


# --- join tokens -----------------------------------------------------------------------------


async def test_a_spent_join_token_is_refused(
    system: System, victim: Victim, tmp_path: Path
) -> None:
    """The token is used once (by the real node), then again by whoever copied it: refused,
    and the node keeps the key it enrolled with (the copy does not replace it)."""
    minion = "spare-spent"
    token = await join_token(victim, minion)
    first = await enrolled(system, token, minion, tmp_path / "first")
    with pytest.raises(EnrolmentError, match="no such join token"):
        await enrol([system.nats.url], token, minion, tmp_path / "copy", attempts=1)
    assert not (tmp_path / "copy").exists()
    (enrolment,) = stored(system, "provisioner", "enrolments", {"_id": minion})
    assert enrolment["public_key"] == first.public_key
    await victim.assert_untouched()


async def test_a_guessed_join_token_secret_is_refused(system: System, victim: Victim) -> None:
    """The enrolment credential of a real token with a guessed secret: refused, no
    enrolment, and the real token is still unspent."""
    minion = "spare-guessed"
    token = JoinToken.parse(await join_token(victim, minion))
    cmd = EnrollNode(
        minion_id=minion, secret=secrets.token_urlsafe(32), public_key=public(new_user_key())
    )
    async with Client(system.nats.url, token.creds) as attacker:
        reply = await attacker.request(subjects.enroll(minion), cmd.model_dump(mode="json"))
    assert reply.get("ok") is False and reply["error"]["code"] == "not_found", reply
    assert "jwt" not in reply
    assert stored(system, "provisioner", "enrolments", {"_id": minion}) == []
    (spare,) = stored(system, "provisioner", "join_tokens", {"minion_id": minion})
    assert spare["used_at_ms"] is None
    await victim.assert_untouched()


async def test_a_join_token_for_one_minion_cannot_enrol_another(
    system: System, victim: Victim
) -> None:
    """A token for minion `spare-x` used to enrol `local-node-1` (to get a credential for
    the victim's running node): on `enroll.local-node-1` the server refuses the publish;
    on the token's own subject, naming the other minion in the body, the provisioner
    refuses it. No credential is issued, the token stays unspent."""
    minion = "spare-x"
    token = JoinToken.parse(await join_token(victim, minion))
    cmd = EnrollNode(minion_id=VICTIM_NODE, secret=token.secret, public_key=public(new_user_key()))
    async with Client(system.nats.url, token.creds) as attacker:
        await attacker.request_refused(subjects.enroll(VICTIM_NODE), cmd.model_dump(mode="json"))
        reply = await attacker.request(subjects.enroll(minion), cmd.model_dump(mode="json"))
    assert reply.get("ok") is False and reply["error"]["code"] == "invalid", reply
    assert "jwt" not in reply
    (enrolment,) = stored(system, "provisioner", "enrolments", {"_id": VICTIM_NODE})
    assert enrolment["public_key"] == Creds.read(system.root / "agent" / "node.creds").public_key
    (issued,) = stored(system, "provisioner", "join_tokens", {"minion_id": minion})
    assert issued["used_at_ms"] is None
    await victim.assert_untouched()


def token_shape(reply: dict[str, Any], minion_id: str) -> str:
    """A join token's answer as text, its variable parts (the id asked for, the enrolment
    credential's key, its JWT's id and times, the secret) as placeholders."""
    token = JoinToken.parse(reply["token"])
    claims = dict(token.creds.claims)
    assert claims["exp"] - claims["iat"] == 3600 and abs(reply["expires_at"] - claims["exp"]) <= 2
    claims |= {"jti": "<jti>", "iat": "<t>", "exp": "<t+ttl>"}
    parts = {
        "reply": reply | {"token": "<token>", "expires_at": "<t+ttl>"},
        "token": {"claims": claims, "secret": len(token.secret), "minion_id": token.minion_id},
    }
    text = json.dumps(parts)  # in the order the provisioner wrote them
    return text.replace(token.creds.public_key, "<key>").replace(minion_id, "<id>")


async def test_a_join_token_for_another_accounts_node_answers_as_for_a_free_id(
    system: System, victim: Victim, eve: Path, tmp_path: Path
) -> None:
    """The attacker asks its own account for a join token for the victim's minion id, and
    for an id nobody holds: the two answers are alike (a token each, the same fields, the
    same enrolment credential but for the id), so the attacker learns nothing of the
    victim's node. The token for the victim's id is a decoy: enrolling with it is refused
    as an unknown token's, and the victim's node, its enrolment and its key are untouched."""
    free = f"free-{uuid.uuid4().hex[:7]}"
    assert len(free) == len(VICTIM_NODE)  # equal lengths: the tokens' texts too
    asked = attacker_subject("provisioner", "issue_join_token")
    async with Client(system.nats.url, eve) as attacker:
        held = await attacker.request(
            asked, {"minion_id": VICTIM_NODE, "region": "r", "ttl_s": 3600}
        )
        unheld = await attacker.request(asked, {"minion_id": free, "region": "r", "ttl_s": 3600})
    assert "token" in held and "token" in unheld, (held, unheld)
    assert token_shape(held, VICTIM_NODE) == token_shape(unheld, free)
    assert len(held["token"]) == len(unheld["token"])
    with pytest.raises(EnrolmentError, match="no such join token"):
        await enrol([system.nats.url], held["token"], VICTIM_NODE, tmp_path / "n", attempts=1)
    assert not (tmp_path / "n").exists()
    (enrolment,) = stored(system, "provisioner", "enrolments", {"_id": VICTIM_NODE})
    assert enrolment["account"] == VICTIM_ACCOUNT and enrolment["state"] == "active"
    assert enrolment["public_key"] == Creds.read(system.root / "agent" / "node.creds").public_key
    (node,) = stored(system, "provisioner", "nodes", {"minion_id": VICTIM_NODE})
    assert node["owner"] == VICTIM_ACCOUNT and node["state"] == "active"
    mine = {"account": ATTACKER_ACCOUNT, "minion_id": VICTIM_NODE}
    assert stored(system, "provisioner", "join_tokens", mine) == []
    assert len(stored(system, "provisioner", "join_token_decoys", mine)) == 1  # for operators
    await victim.assert_untouched()


async def test_an_enrolment_credential_can_do_nothing_else(system: System, victim: Victim) -> None:
    """The credential inside a join token (before it is spent) publishes a RegisterNode and
    a heartbeat, and subscribes to the node's commands: all refused."""
    minion = "spare-enrol-only"
    token = JoinToken.parse(await join_token(victim, minion))
    async with Client(system.nats.url, token.creds) as attacker:
        await attacker.send_refused(register_subject(minion), register(minion, VICTIM_ACCOUNT))
        await attacker.publish_refused(subjects.heartbeat(minion))
        await attacker.subscribe_refused(f"{subjects.COMMANDS}.node.{minion}.*")
    await victim.assert_untouched()


# --- revocation ------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["revoke", "remove"])
async def test_a_revoked_node_is_cut_off_at_once(
    system: System, victim: Victim, tmp_path: Path, verb: str
) -> None:
    """A node of the victim's is connected; the victim runs `gpufleet node revoke` (or
    `node remove`): the server closes the node's connection at once, and its credential
    never connects again."""
    minion = f"spare-{verb}"
    creds = await enrolled(system, await join_token(victim, minion), minion, tmp_path / "n")
    node = await Client(system.nats.url, creds, name=minion).connect()
    try:
        ack = await node.js_send(register_subject(minion), register(minion, VICTIM_ACCOUNT))
        await wait_consumed(system, COMMANDS, REGISTER_CONSUMER, ack.seq)
        assert minion in await victim.nodes()

        await asyncio.to_thread(system.cli, "node", verb, minion)
        await asyncio.wait_for(node.disconnected.wait(), timeout=5)
    finally:
        await node.close()
    await connect_refused(system.nats.url, creds)
    (enrolment,) = stored(system, "provisioner", "enrolments", {"_id": minion})
    assert enrolment["state"] == "revoked"
    await victim.assert_untouched()
