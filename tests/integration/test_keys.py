"""Attached third-party keys (R-JOB-7) on the real servers, with the real scheduler and node
agent: a key is sealed at rest, listed without its value, its account's alone, and reaches
the worker of a job that names it (as a file) and nothing else.

The node runs its owner's job as a bare process (the operator's opt-in, as in
test_secrets.py); the container side is tests/integration/node_agent/test_podman_keys.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import bson
import pytest
from cryptography.fernet import Fernet
from gpufleet_bus import Ports, publish
from gpufleet_bus.streams import ensure_node_consumer, ensure_node_logs
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.keys import AttachKey, ListKeys, RemoveKey
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_node_agent import sealing
from gpufleet_node_agent.app import build_app as agent_app
from gpufleet_node_agent.settings import AgentSettings, default_sim_inventory
from gpufleet_scheduler.app import build_app as scheduler_app
from gpufleet_scheduler.settings import SchedulerSettings

from .conftest import as_user, running, store_for
from .test_secrets import (
    Operator,
    User,
    broker,
    bus,
    connected,
    db_bytes,
    registered,
    wait_state,
)

VALUE = f"hf-{uuid.uuid4().hex}"
OTHER = "bob"


def key_check() -> list[str]:
    """Exits 0 when $SECRETS_PATH/huggingface/token holds VALUE and no variable of its
    environment does, without VALUE in its own text."""
    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    code = (
        "import hashlib, os, sys; h = lambda b: hashlib.sha256(b).hexdigest();"
        "p = os.path.join(os.environ.get('SECRETS_PATH', '/nowhere'), 'huggingface', 'token');"
        f"in_env = any(h(v.encode()) == {digest!r} for v in os.environ.values());"
        f"ok = h(open(p, 'rb').read()) == {digest!r} and not in_env;"
        "print('key ok' if ok else 'key wrong'); sys.exit(0 if ok else 3)"
    )
    return [sys.executable, "-c", code]


async def attach(user: User, key_type: str, secret: dict[str, str]) -> dict[str, Any]:
    return await user.call(
        AttachKey.SUBJECT, json.dumps({"type": key_type, "secret": secret}).encode()
    )


async def test_a_key_is_sealed_listed_without_its_value_and_reaches_only_its_worker(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = fresh_nats
    minion = f"key-{uuid.uuid4().hex[:8]}"
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = scheduler_app(
        Ports(broker(server, "scheduler"), store),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    state = tmp_path / "agent"
    agent = agent_app(
        Ports(
            broker(server, "node-agent", server.creds("node", minion)),
            bus=bus(server, server.creds("node", minion)),
        ),
        AgentSettings(
            minion_id=minion,
            agent_state_dir=state,
            simulated_gpus=default_sim_inventory(),
            heartbeat_s=0.3,
            worker_poll_s=0.1,
            allow_bare_processes="own-jobs",
        ),
    ).app
    async with (
        connected(server, server.creds("operator")) as op_nc,
        connected(server, server.creds("user", "dev")) as user_nc,
        as_user(server, OTHER) as bob,
        running(sched),
    ):
        op, user = Operator(op_nc), User(user_nc)
        first = await attach(user, "huggingface", {"token": "first-value"})
        attached = await attach(user, "huggingface", {"token": VALUE})  # replaces it
        assert attached["fields"] == ["token"] and attached["fingerprint"] != first["fingerprint"]
        assert attached["created_at"] == first["created_at"]
        await attach(user, "docker", {"username": "me", "password": VALUE + "-docker"})

        # at rest: sealed; the raw documents hold no value
        docs = await store.db.keys.find({}).to_list(None)
        assert sorted(d["type"] for d in docs) == ["docker", "huggingface"]
        assert all(d["sealed"] and d["account"] == "local" for d in docs)
        assert VALUE.encode() not in b"".join(bson.encode(d) for d in docs)
        # listed by type, fields and fingerprint only
        listed = await user.call(ListKeys.SUBJECT, b"{}")
        assert [(k["type"], k["fields"]) for k in listed["keys"]] == [
            ("docker", ["password", "username"]),
            ("huggingface", ["token"]),
        ]
        # another account sees none of them, removes none, uses none
        assert await bob.call(ListKeys.SUBJECT, b"{}") == {"keys": []}
        gone = await bob.call(RemoveKey.SUBJECT, json.dumps({"type": "huggingface"}).encode())
        assert gone["error"]["code"] == "not_found"
        job = {"name": "b", "gpu_types": ["RTX 3090"], "command": ["true"]}
        job["environment"] = {"keys": ["huggingface"]}
        refused = await bob.call(
            subjects.rpc("scheduler", "submit_job"), json.dumps({"spec": job}).encode()
        )
        assert [(f["field"], f["rule"]) for f in refused["error"]["fields"]] == [
            ("spec.environment.keys", "R-JOB-7")
        ]
        assert len((await user.call(ListKeys.SUBJECT, b"{}"))["keys"]) == 2

        # a job naming the key: its worker reads it from its file
        await ensure_node_consumer(op.js, minion)
        await ensure_node_logs(op.js, minion)
        await publish(op, registered(minion, sealing.node_key(state)), source="test")

        async def known() -> bool:
            return await store.db.nodes.find_one({"minion_id": minion}) is not None

        await wait_for_async(known, timeout=10, message="node known")
        async with running(agent):
            submitted = await user.submit(
                name="key-job", command=key_check(), environment={"keys": ["huggingface"]}
            )
            done = await wait_state(user, submitted["id"], "finished", "failed")
        assert done["state"] == "finished", done
        assert done["workers"][0]["log_tail"] == "key ok\n"

        # the value travelled in the node's StartWorker alone, sealed to the node's key
        commands = await op.stream_bytes(subjects.STREAM_COMMANDS)
        assert StartWorker.SUBJECT.format(minion_id=minion) in [s for s, _ in commands]
        assert all(VALUE.encode() not in b for _, b in commands)
        logs = subjects.node_logs_stream(minion)
        for stream in (subjects.STREAM_EVENTS, subjects.STREAM_DLQ, logs):
            assert all(VALUE.encode() not in b for _, b in await op.stream_bytes(stream))
        assert all(VALUE.encode() not in r for r in user.replies)
        assert VALUE.encode() not in await db_bytes(store)  # jobs, outbox, keys: sealed
        # the node keeps nothing of it once the worker has ended
        files = [f for f in (state / "workers").rglob("*") if f.is_file()]
        assert files and all(VALUE.encode() not in f.read_bytes() for f in files)
        assert not list((state / "workers").rglob("secrets"))

        # removed: a job naming it is refused at submission
        await user.call(RemoveKey.SUBJECT, json.dumps({"type": "huggingface"}).encode())
        again = await user.submit(
            name="k2", command=["true"], environment={"keys": ["huggingface"]}
        )
        assert again["error"]["fields"][0]["field"] == "spec.environment.keys"
    assert VALUE not in caplog.text


async def test_a_key_removed_after_submission_fails_the_job_when_it_would_be_placed(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    server = fresh_nats
    minion = f"key-{uuid.uuid4().hex[:8]}"
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = scheduler_app(
        Ports(broker(server, "scheduler"), store),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    async with (
        connected(server, server.creds("operator")) as op_nc,
        connected(server, server.creds("user", "dev")) as user_nc,
        running(sched),
    ):
        user = User(user_nc)
        await attach(user, "wandb", {"api_key": VALUE})
        waiting = await user.submit(name="w", command=["true"], environment={"keys": ["wandb"]})
        assert waiting["state"] == "queued"  # no node yet
        await user.call(RemoveKey.SUBJECT, json.dumps({"type": "wandb"}).encode())
        await publish(Operator(op_nc), registered(minion), source="test")
        failed = await wait_state(user, waiting["id"], "failed")
        reason = failed["workers"][0]["reason"]
        assert "wandb" in reason and "gone" in reason and VALUE not in reason
