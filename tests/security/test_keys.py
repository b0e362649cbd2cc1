"""Attack class 8: another account's attached keys (R-JOB-7).

The victim attaches a key; the attacker tries to list, remove and use it (on the victim's
subjects, on its own, and through a project of the victim's it is a member of: a job uses
its creator's keys, never the project owner's). The key's value must never appear in an
event, a dead letter, a reply or the scheduler's database.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import bson
from gpufleet_contracts import subjects

from .attack import Client
from .conftest import (
    ATTACKER_ACCOUNT,
    VICTIM_ACCOUNT,
    VICTIM_NODE,
    System,
    Victim,
    admin_js,
    attacker_subject,
    cancel,
)


def job(name: str, **kw: Any) -> dict[str, Any]:
    spec = {"name": name, "gpu_types": ["RTX 3090"], "command": ["true"], **kw}
    return {"spec": {**spec, "environment": {"keys": ["huggingface"]}}}


async def test_another_account_cannot_list_remove_or_use_my_key(
    system: System, victim: Victim, eve: Path
) -> None:
    secret = {"token": f"victim-key-{uuid.uuid4().hex}"}
    attached = await victim.request(
        "scheduler", "attach_key", {"type": "huggingface", "secret": secret}
    )
    shared = f"keys-{uuid.uuid4().hex[:6]}"
    await victim.request("scheduler", "create_project", {"name": shared})
    member = {"project": shared, "account": ATTACKER_ACCOUNT}
    await victim.request("scheduler", "add_project_member", member)
    try:
        async with Client(system.nats.url, eve) as attacker:
            for verb in ("list_keys", "remove_key", "attach_key"):  # the victim's subjects
                victims = subjects.as_account(subjects.rpc("scheduler", verb), VICTIM_ACCOUNT)
                await attacker.request_refused(victims, {"type": "huggingface"})
            own = await attacker.request(attacker_subject("scheduler", "list_keys"), {})
            assert own == {"keys": []}
            removed = await attacker.request(
                attacker_subject("scheduler", "remove_key"), {"type": "huggingface"}
            )
            assert removed["error"]["code"] == "not_found"
            # its own job, and one in the victim's project: its own keys (none), refused
            for body in (job("mine"), job("federated", project=f"{VICTIM_ACCOUNT}/{shared}")):
                refused = await attacker.request(attacker_subject("scheduler", "submit_job"), body)
                fields = [(f["field"], f["rule"]) for f in refused["error"]["fields"]]
                assert fields == [("spec.environment.keys", "R-JOB-7")], refused
    finally:
        await victim.request("scheduler", "remove_project_member", member)
    listed = (await victim.request("scheduler", "list_keys"))["keys"]
    assert [(k["type"], k["fingerprint"]) for k in listed] == [
        ("huggingface", attached["fingerprint"])
    ]
    await victim.request("scheduler", "remove_key", {"type": "huggingface"})
    await victim.assert_untouched()


async def stream_bytes(system: System, stream: str) -> list[bytes]:
    """Headers and body of every message `stream` holds, as an operator reads them."""

    async def read(js: Any) -> list[bytes]:
        state = (await js.stream_info(stream)).state
        out: list[bytes] = []
        for seq in range(state.first_seq, state.last_seq + 1 if state.messages else 0):
            try:
                msg = await js.get_msg(stream, seq)
            except Exception:  # deleted
                continue
            out.append(json.dumps(msg.headers or {}).encode() + (msg.data or b""))
        return out

    result: list[bytes] = await admin_js(system, read)
    return result


def scheduler_db_bytes(system: System) -> bytes:
    client = system.mongo.client()
    try:
        db = client["gpufleet_scheduler"]
        return b"".join(
            bson.encode(d) for name in db.list_collection_names() for d in db[name].find({})
        )
    finally:
        client.close()


async def test_a_keys_value_never_reaches_an_event_a_reply_or_a_dead_letter(
    system: System, victim: Victim
) -> None:
    value = f"victim-key-{uuid.uuid4().hex}"
    replies: list[Any] = []
    async with Client(system.nats.url, victim.creds, name="victim") as me:

        async def ask(verb: str, body: dict[str, Any]) -> Any:
            replies.append(await victim.request("scheduler", verb, body, me=me))
            return replies[-1]

        await ask("attach_key", {"type": "wandb", "secret": {"api_key": value}})
        # refused bodies that hold the value: a misspelt field, a wrong shape, an unknown type
        for bad in (
            {"type": "wandb", "secret": {"apikey": value}},
            {"type": "wandb", "secret": [value]},
            {"type": "vault", "secret": {"token": value}},
        ):
            assert (await ask("attach_key", bad))["error"]["code"] == "invalid"
        # a job naming the key: queued (the victim's job holds both GPUs), its spec told
        queued = await ask(
            "submit_job",
            {"spec": {**job("uses-wandb")["spec"], "environment": {"keys": ["wandb"]}}},
        )
        await ask("list_keys", {})
    try:
        assert all(value not in json.dumps(r) for r in replies)
        for stream in (
            subjects.STREAM_EVENTS,
            subjects.STREAM_DLQ,
            subjects.node_logs_stream(VICTIM_NODE),
            subjects.STREAM_COMMANDS,
        ):
            held = await stream_bytes(system, stream)
            assert held and all(value.encode() not in b for b in held), stream
        assert value.encode() not in scheduler_db_bytes(system)
    finally:
        cancel(system, queued["id"])
        await victim.request("scheduler", "remove_key", {"type": "wandb"})
    await victim.assert_untouched()
