"""Attack class 11: reading a job's secrets on their way to the node (issue 26).

The operator's credential may subscribe to every subject and read every stream: it watches
a node's command subject and reads GPUFLEET_COMMANDS while that node runs a job with an env
value and an attached key (a second real node agent, `sealed-node` of the account
`sealer`, so that the victim's bill stays as it was). It must see neither value in clear,
while the job gets both (its env, its key file): the scheduler seals them to the key the
node made at its start (gpufleet_auth.sealing) and only the node opens them. A node that
registered no sealing key (an agent too old, a registration forged without one) gets no
job with secrets; a sealing key the node's own nkey did not sign (one the operator's
credential registers for it) is not kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_auth import Creds, sealing
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.nodes import RegisterNode
from gpufleet_devstack import identities, wait_for, wait_for_async
from gpufleet_node_agent.enrol import enrol
from gpufleet_scheduler.placement import UNSEALED

from .attack import Client
from .conftest import VICTIM_NODE, System, Victim, last_seq, stored, wait_consumed
from .test_keys import stream_bytes
from .test_nodes import REGISTER_CONSUMER, enrolled, join_token, register, register_subject

SEALER = "sealer"  # an account of its own, so that its job's bill is not the victim's
SEALED_NODE = "sealed-node"


def check_secrets(env_value: str, key_value: str) -> list[str]:
    """A command that prints 'secrets ok' when TOKEN and its huggingface key file hold the
    values; only their digests are in its text."""
    env, key = (hashlib.sha256(v.encode()).hexdigest() for v in (env_value, key_value))
    code = (
        "import hashlib, os; h = lambda b: hashlib.sha256(b).hexdigest();"
        "f = os.path.join(os.environ['SECRETS_PATH'], 'huggingface', 'token');"
        f"ok = h(os.environ.get('TOKEN', '').encode()) == {env!r} and h(open(f, 'rb').read())"
        f" == {key!r}; print('secrets ok' if ok else 'secrets missing')"
    )
    return ["python", "-c", code]


async def job_state(client: Client, job_id: str, *states: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    subject = subjects.as_account(subjects.rpc("scheduler", "get_job"), SEALER)

    async def reached() -> bool:
        seen.update(await client.request(subject, {"job_id": job_id}))
        return seen["state"] in states

    await wait_for_async(reached, timeout=90, interval=0.5, message=f"{job_id} in {states}")
    return seen


@pytest.fixture(scope="module")
def sealer(system: System) -> Iterator[Path]:
    """A user of account `sealer`, owner of the node `sealed-node` (a second node agent,
    real, enrolled with a join token): its jobs run there, and the victim's bill is not
    touched by them."""
    state = system.root / "agent-sealed"
    asyncio.run(identities.ensure_account(system.nats, SEALER, "team"))
    token = asyncio.run(identities.join_token(system.nats, SEALED_NODE, account=SEALER))
    asyncio.run(enrol([system.nats.url], token, SEALED_NODE, state / "node.creds"))
    name = "node-agent-sealed"
    env = {
        "GPUFLEET_MINION_ID": SEALED_NODE,
        "GPUFLEET_AGENT_STATE_DIR": str(state),
        "GPUFLEET_ACCOUNT": SEALER,
    }
    system.add(name, "node-agent", env)
    try:

        def ready() -> bool:
            nodes = stored(system, "scheduler", "nodes", {"minion_id": SEALED_NODE})
            return bool(nodes) and nodes[0]["state"] == "active"

        wait_for(ready, timeout=90, interval=0.5, message=f"{SEALED_NODE} never active")
        yield system.nats.creds("user", "alice", account=SEALER)
    finally:
        system.procs[name].stop(timeout=10)


async def test_the_operator_on_the_nodes_command_subject_sees_no_secret_the_job_gets(
    system: System, victim: Victim, sealer: Path
) -> None:
    env_value = f"sealed-env-{uuid.uuid4().hex}"
    key_value = f"sealed-key-{uuid.uuid4().hex}"
    values = (env_value.encode(), key_value.encode())
    seen: list[tuple[bytes, bytes]] = []  # (headers, body) of every message it saw
    operator = system.nats.creds("operator")
    async with (
        Client(system.nats.url, operator, name="operator") as watcher,
        Client(system.nats.url, sealer, name="sealer") as user,
    ):

        async def keep(msg: Any) -> None:
            seen.append((json.dumps(msg.headers or {}).encode(), msg.data))

        def ask(verb: str) -> str:
            return subjects.as_account(subjects.rpc("scheduler", verb), SEALER)

        await watcher.nc.subscribe(subjects.command("node", "*", key=SEALED_NODE), cb=keep)
        await watcher.nc.flush()
        secret = {"type": "huggingface", "secret": {"token": key_value}}
        assert (await user.request(ask("attach_key"), secret))["type"] == "huggingface"
        spec = {
            "name": "sealed",
            "gpu_types": ["RTX 3090"],
            "command": check_secrets(env_value, key_value),
            "env": {"TOKEN": env_value},
            "environment": {"keys": ["huggingface"]},
        }
        job_id = (await user.request(ask("submit_job"), {"spec": spec}))["id"]
        done = await job_state(user, job_id, "finished", "failed")
        await watcher.nc.flush()
    # the node's job got both values: its env, its key file
    assert (done["state"], done["workers"][0]["log_tail"]) == ("finished", "secrets ok\n"), done
    assert done["workers"][0]["node"] == SEALED_NODE
    # the operator saw the job's StartWorker go by, sealed: no value in clear
    assert all(v not in part for m in seen for part in m for v in values)
    (body,) = [
        StartWorker.from_bytes(data)
        for headers, data in seen
        if StartWorker.TYPE.encode() in headers and json.loads(data)["job_id"] == job_id
    ]
    assert (body.env, body.attached_keys, body.registry_auth) == ({}, {}, None)
    assert body.sealed_secrets is not None
    # sealed to the key the node registered, which it keeps 0600 in its state directory
    (node,) = stored(system, "provisioner", "nodes", {"minion_id": SEALED_NODE})
    assert body.sealed_secrets.key_id == sealing.key_id(node["sealing_key"])
    key_file = system.root / "agent-sealed" / "sealing.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # nor does the commands stream hold them, as an operator reads it
    held = await stream_bytes(system, subjects.STREAM_COMMANDS)
    assert held and all(v not in b for b in held for v in values)
    await victim.assert_untouched()


async def test_a_node_that_registered_no_sealing_key_gets_no_job_with_secrets(
    system: System, victim: Victim, tmp_path: Path
) -> None:
    """A node of the victim's enrolled with a real join token registers (as an agent too
    old for sealing would, or a forged registration) the victim node's very GPUs and
    hardware, without a sealing key: a job with an env value that only it could take
    now waits, saying why, and no StartWorker is ever sent to it."""
    minion = "spare-nokey"
    creds = await enrolled(system, await join_token(victim, minion), minion, tmp_path / "n")
    (model,) = stored(system, "provisioner", "nodes", {"minion_id": VICTIM_NODE})
    as_the_victim_node = {"gpus": model["gpus"], "hardware": model["hardware"]}
    msg = RegisterNode.model_validate(
        {**register(minion, owner="local").model_dump(), **as_the_victim_node}
    )
    assert msg.sealing_key is None
    async with Client(system.nats.url, creds) as node:
        ack = await node.js_send(register_subject(minion), msg)
    await wait_consumed(system, subjects.STREAM_COMMANDS, REGISTER_CONSUMER, ack.seq)
    start_subject = StartWorker.SUBJECT.format(minion_id=minion)
    job_id = ""
    try:

        async def known() -> bool:
            nodes = stored(system, "scheduler", "nodes", {"minion_id": minion})
            return bool(nodes) and nodes[0]["state"] == "active"

        await wait_for_async(known, timeout=30, message="the scheduler never heard of it")
        assert stored(system, "scheduler", "nodes", {"minion_id": minion})[0]["sealing_key"] is None
        spec = {
            "name": "needs-a-sealed-node",
            "gpu_types": ["RTX 3090"],
            "command": ["true"],
            "env": {"TOKEN": f"never-sent-{uuid.uuid4().hex}"},
        }
        job_id = (await victim.request("scheduler", "submit_job", {"spec": spec}))["id"]

        async def explained() -> bool:
            return UNSEALED in ((await victim.job(job_id)).get("queue_reason") or "")

        await wait_for_async(explained, timeout=30, message="no reason given")
        await asyncio.sleep(1)  # a pass or two more: still waiting, nothing sent
        job = await victim.job(job_id)
        assert job["state"] == "queued" and job["workers"][0]["state"] == "waiting", job
        assert await last_seq(system, subjects.STREAM_COMMANDS, start_subject) is None
    finally:
        if job_id:
            await victim.request("scheduler", "cancel_job", {"job_id": job_id})
        await victim.request("provisioner", "remove_node", {"node": minion})
    await victim.assert_untouched()


async def test_a_sealing_key_the_nodes_own_nkey_did_not_sign_is_not_kept(
    system: System, victim: Victim, tmp_path: Path
) -> None:
    """The operator's credential may publish a node's RegisterNode: it registers a sealing
    key of its own for a node of the victim's (signed with its own nkey, or not at all),
    so that the node's next secrets would be sealed to it. Not kept: the node then takes
    no job with secrets, until the node itself registers a key its enrolled nkey signed."""
    minion = "spare-vouch"
    creds = await enrolled(system, await join_token(victim, minion), minion, tmp_path / "n")
    operator = system.nats.creds("operator")
    mine = sealing.SealingKey.generate().public_key
    own_word = sealing.vouch(Creds.read(operator).seed, mine)

    async def register_as(who: Path | Creds, key: str, signature: str | None) -> None:
        msg = register(minion, owner="local").model_copy(
            update={"sealing_key": key, "sealing_key_signature": signature}
        )
        async with Client(system.nats.url, who) as client:
            ack = await client.js_send(register_subject(minion), msg)
        await wait_consumed(system, subjects.STREAM_COMMANDS, REGISTER_CONSUMER, ack.seq)

    def kept() -> tuple[str | None, str | None]:
        (prov,) = stored(system, "provisioner", "nodes", {"minion_id": minion})
        sched = stored(system, "scheduler", "nodes", {"minion_id": minion})
        return prov.get("sealing_key"), (sched[0].get("sealing_key") if sched else None)

    try:
        for signature in (own_word, None):
            await register_as(operator, mine, signature)
            assert kept() == (None, None)
        node_key = sealing.SealingKey.generate().public_key
        await register_as(creds, node_key, sealing.vouch(creds.seed, node_key))

        async def known() -> bool:
            return kept() == (node_key, node_key)

        await wait_for_async(known, timeout=30, message="the node's own key was not kept")
    finally:
        await victim.request("provisioner", "remove_node", {"node": minion})
    await victim.assert_untouched()
