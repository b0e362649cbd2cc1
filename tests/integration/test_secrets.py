"""Secrets at rest and in flight, on the real servers (nats-server, nx-27017) with the real
scheduler and node agent: a job's env value reaches its worker and nothing else.

R-JOB-7 and the project rule: secrets are encrypted at rest and never appear in events, logs,
replies or dead-letter records. StartWorker, on the node's own command consumer, is the one
message that carries them.
"""

from __future__ import annotations

import json
import logging
import stat
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import nats
import pytest
from cryptography.fernet import Fernet
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import BusSettings, Ports, ensure_streams, make_broker, publish
from gpufleet_bus.streams import ensure_node_consumer, ensure_node_logs
from gpufleet_contracts import Envelope, subjects
from gpufleet_contracts.jobs import EnqueueJob, GetJob, ListJobs, StartWorker, SubmitJob
from gpufleet_contracts.nodes import GpuInfo, NodeRegistered, NodeState
from gpufleet_contracts.secrets import REDACTED
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_node_agent import sealing
from gpufleet_node_agent.app import build_app as agent_app
from gpufleet_node_agent.settings import AgentSettings, default_sim_inventory
from gpufleet_scheduler.app import build_app as scheduler_app
from gpufleet_scheduler.commit import UNREADABLE
from gpufleet_scheduler.settings import SchedulerSettings
from gpufleet_store import Store
from nats.aio.client import Client

from .conftest import running, store_for

VALUE = "s3cr3t-value"
ACCOUNT = "local"


def token_check() -> list[str]:
    """A worker command that exits 0 when TOKEN is VALUE, without VALUE in its text."""
    import hashlib

    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    code = (
        "import hashlib, os, sys; t = os.environ.get('TOKEN', '').encode();"
        f"ok = hashlib.sha256(t).hexdigest() == {digest!r};"
        "print('token ok' if ok else 'token missing'); sys.exit(0 if ok else 3)"
    )
    return [sys.executable, "-c", code]


def broker(server: NatsServer, service: str, creds: Path | None = None) -> Any:
    return make_broker(service, bus(server, creds or server.creds("service", service)))


def bus(server: NatsServer, creds: Path) -> BusSettings:
    return BusSettings(nats_url=server.url, nats_creds=creds)


class Operator:
    """The operator's connection: publishes what the provisioner would, reads streams."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    async def publish(
        self,
        message: bytes,
        subject: str,
        headers: dict[str, str] | None = None,
        stream: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the broker's signature
    ) -> object:
        return await self.js.publish(subject, message, timeout=5.0, headers=headers)

    async def stream_bytes(self, stream: str) -> list[tuple[str, bytes]]:
        """(subject, headers + body) of every message the stream holds."""
        info = await self.js.stream_info(stream)
        out: list[tuple[str, bytes]] = []
        if not info.state.messages:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await self.js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            headers = json.dumps(msg.headers or {}).encode()
            out.append((msg.subject, headers + (msg.data or b"")))
        return out


def registered(minion: str, key: SealingKey | None = None) -> NodeRegistered:
    """What the provisioner tells of a node that registered with `key`'s public half (a
    node's own, or one made here for a node no agent runs)."""
    return NodeRegistered(
        node_id=f"n-{minion}",
        minion_id=minion,
        name=minion,
        region="local",
        owner=ACCOUNT,
        state=NodeState.active,
        at=datetime.now(UTC),
        gpus=[
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                model="RTX 3090",
                nvml_name="NVIDIA GeForce RTX 3090",
                memory_mb=24576,
            )
            for i in range(2)
        ],
        simulated=True,
        sealing_key=(key or SealingKey.generate()).public_key,
    )


class User:
    """User `dev` of the account `local`: every reply kept, to look for secrets in."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.replies: list[bytes] = []

    async def call(self, base: str, payload: bytes) -> dict[str, Any]:
        reply = await self.nc.request(subjects.as_account(base, ACCOUNT), payload, timeout=10)
        self.replies.append(reply.data)
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def submit(self, **spec: Any) -> dict[str, Any]:
        body = SubmitJob.model_validate({"spec": {"gpu_types": ["RTX 3090"], **spec}})
        return await self.call(SubmitJob.SUBJECT, body.to_bytes())

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self.call(GetJob.SUBJECT, GetJob(job_id=job_id).to_bytes())


@asynccontextmanager
async def connected(server: NatsServer, creds: Path | None) -> AsyncIterator[Client]:
    nc = await nats.connect(server.url, **server.client(creds))
    try:
        yield nc
    finally:
        await nc.close()


async def db_bytes(store: Store) -> bytes:
    """Every document of the scheduler's database, BSON-encoded."""
    out = []
    for name in await store.db.list_collection_names():
        async for doc in store.db[name].find({}):
            out.append(bson.encode(doc))
    return b"".join(out)


async def wait_state(user: User, job_id: str, *states: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def reached() -> bool:
        found.update(await user.job(job_id))
        return found.get("state") in states

    await wait_for_async(reached, timeout=30, message=f"job {job_id} in {states}")
    return found


async def test_a_jobs_env_value_reaches_its_worker_and_nothing_else(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = fresh_nats
    minion = f"sec-{uuid.uuid4().hex[:8]}"
    key = Fernet.generate_key().decode()
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = scheduler_app(
        Ports(broker(server, "scheduler"), store), SchedulerSettings(secret_key=key)
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
            allow_bare_processes="own-jobs",  # the job is the node owner's (`local`)
        ),
    ).app
    async with (
        connected(server, server.creds("operator")) as op_nc,
        connected(server, server.creds("user", "dev")) as user_nc,
        running(sched),
    ):
        op = Operator(op_nc)
        await ensure_node_consumer(op.js, minion)  # the provisioner's part at enrolment
        await ensure_node_logs(op.js, minion)
        # the key the agent made at its first start (build_app), as its RegisterNode told it
        await publish(op, registered(minion, sealing.node_key(state)), source="test")
        await wait_for_async(lambda: _node_known(store, minion), timeout=10, message="node known")
        async with running(agent):
            user = User(user_nc)
            submitted = await user.submit(
                name="secret-job", command=token_check(), env={"TOKEN": VALUE, "MODE": "x"}
            )
            job_id = submitted["id"]
            done = await wait_state(user, job_id, "finished", "failed")
        assert done["state"] == "finished", done  # the worker saw TOKEN=VALUE (exit 0)
        assert done["workers"][0]["log_tail"] == "token ok\n"
        assert done["spec"]["env"] == {"TOKEN": REDACTED, "MODE": REDACTED}  # names kept
        await user.call(ListJobs.SUBJECT, ListJobs().to_bytes())
        # refused bodies: a request's error reply and the dead letters name fields, not values
        bad = {"spec": {"name": "bad", "gpu_types": ["RTX 3090"], "gpu_count": "x"}}
        bad["spec"]["env"] = {"TOKEN": VALUE}
        refused = await user.call(SubmitJob.SUBJECT, json.dumps(bad).encode())
        assert refused["error"]["code"] == "invalid"
        enqueue = EnqueueJob.subject_for(ACCOUNT)
        await user_nc.jetstream().publish(
            enqueue,
            json.dumps({"request_id": "r1", **bad}).encode(),
            headers=Envelope(type=EnqueueJob.TYPE, source="test", subject=enqueue).headers(),
        )
        await wait_for_async(lambda: _dead_letters(op, 2), timeout=10, message="two dead letters")

        # replies: submit_job, get_job, list_jobs
        assert user.replies and all(VALUE.encode() not in r for r in user.replies)
        # events: JobQueued (with the names) and the rest, as the operator reads them
        events = await op.stream_bytes(subjects.STREAM_EVENTS)
        queued = [b for s, b in events if s == subjects.event("job", "queued")]
        assert len(queued) == 1 and b'"TOKEN":"<secret>"' in queued[0].replace(b" ", b"")
        assert all(VALUE.encode() not in b for _, b in events)
        dead = await op.stream_bytes(subjects.STREAM_DLQ)
        assert len(dead) == 2 and all(b"<secret>" in b and b"TOKEN" in b for _, b in dead)
        for stream in (subjects.STREAM_DLQ, subjects.node_logs_stream(minion)):
            assert all(VALUE.encode() not in b for _, b in await op.stream_bytes(stream))
        # commands: the node's StartWorker carries the value sealed to the node's key, so no
        # command holds it in clear (but the sender's own EnqueueJob above: what another
        # system sends is its input, as it sent it)
        commands = await op.stream_bytes(subjects.STREAM_COMMANDS)
        carrying = sorted(s for s, b in commands if VALUE.encode() in b)
        assert carrying == [enqueue]
        sent = await op.js.get_last_msg(
            subjects.STREAM_COMMANDS, StartWorker.SUBJECT.format(minion_id=minion)
        )
        start = StartWorker.from_bytes(sent.data or b"")
        assert start.env == {} and start.sealed_secrets is not None
        # the scheduler's database (jobs, outbox, checkpoints): sealed only
        stored = await db_bytes(store)
        assert b"TOKEN" in stored and VALUE.encode() not in stored
        # the node: no file of the worker's directory holds it (env.json was read, deleted)
        files = [f for f in (state / "workers").rglob("*") if f.is_file()]
        assert files and not any(f.name == "env.json" for f in files)
        assert all(VALUE.encode() not in f.read_bytes() for f in files)
    # nor any log line of the scheduler, the agent or the bus
    assert VALUE not in caplog.text
    # nor the database's files on disk (the outbox row of StartWorker was sealed too)
    assert _files_holding(mongo_server.data_dir, VALUE.encode()) == []


async def _dead_letters(op: Operator, n: int) -> bool:
    return len(await op.stream_bytes(subjects.STREAM_DLQ)) >= n


async def _node_known(store: Store, minion: str) -> bool:
    return await store.db.nodes.find_one({"minion_id": minion}) is not None


async def test_a_job_whose_secrets_do_not_decrypt_fails_and_the_queue_goes_on(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The key changed between two runs of the scheduler: its job fails with the reason,
    and the next job is placed (the pass is not stopped by it)."""
    server = fresh_nats
    minion = f"sec-{uuid.uuid4().hex[:8]}"
    first = scheduler_app(
        Ports(broker(server, "scheduler"), store_for("scheduler", mongo_server.url, db_prefix)),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    async with (
        connected(server, server.creds("operator")) as op_nc,
        connected(server, server.creds("user", "dev")) as user_nc,
    ):
        user = User(user_nc)
        async with running(first):  # no node yet: the job waits
            old = await user.submit(name="old", command=["true"], env={"TOKEN": VALUE})
            assert old["state"] == "queued"
        store = store_for("scheduler", mongo_server.url, db_prefix)
        second = scheduler_app(
            Ports(broker(server, "scheduler"), store),
            SchedulerSettings(secret_key=Fernet.generate_key().decode()),
        ).app
        async with running(second):
            await publish(Operator(op_nc), registered(minion), source="test")
            failed = await wait_state(user, old["id"], "failed")
            assert failed["workers"][0]["reason"] == UNREADABLE
            new = await user.submit(name="new", command=["true"], env={"TOKEN": "other"})
            placed = await wait_state(user, new["id"], "starting")
            assert placed["workers"][0]["node"] == minion


async def test_jetstream_stores_nothing_in_clear_and_its_key_is_private(
    tmp_path: Path,
) -> None:
    """The devstack's nats-server encrypts its store (chachapoly); the key and the config
    that holds it are 0600; a store written in clear is encrypted when the key comes."""
    marker = f"PLAINTEXT-{uuid.uuid4().hex}".encode()
    plain = NatsServer(tmp_path / "store", encrypt=False, auth=False)
    plain.start()
    try:
        async with connected(plain, None) as nc:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t.>"])
            await js.publish("t.before", marker + b"-before")
    finally:
        plain.stop()
    assert _files_holding(tmp_path / "store", marker)  # in clear, as asked

    server = NatsServer(tmp_path / "store", encrypt=True, auth=False)
    server.start()
    try:
        async with connected(server, None) as nc:
            js = nc.jetstream()
            await js.publish("t.after", marker + b"-after")
            sub = await js.subscribe("t.>", ordered_consumer=True)
            got = [(await sub.next_msg(timeout=5)).data for _ in range(2)]
            assert got == [marker + b"-before", marker + b"-after"]
        server.stop()
        assert _files_holding(tmp_path / "store", marker) == []
        for secret_file in (server.jetstream_key_file, server.config_file):
            assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert server.jetstream_key() in server.config_file.read_text()
        server.start()  # the same key after a restart: the messages read back
        async with connected(server, None) as nc:
            msg = await nc.jetstream().get_msg("T", 2)
            assert msg.data == marker + b"-after"
    finally:
        server.stop()


def _files_holding(root: Path, marker: bytes) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file() and marker in f.read_bytes()]


async def test_the_services_streams_work_on_the_encrypted_server(
    fresh_nats: NatsServer,
) -> None:
    """The fixtures' servers (auth on) encrypt too: the services' streams are there, a
    message put in one is read back, before and after a restart, and is not in the files."""
    assert fresh_nats.encrypt
    marker = f"PLAINTEXT-{uuid.uuid4().hex}".encode()
    async with connected(fresh_nats, fresh_nats.creds("operator")) as nc:
        js = nc.jetstream()
        await ensure_streams(js)
        ack = await js.publish(subjects.event("test", "secret"), marker)
        assert (await js.get_msg(ack.stream, ack.seq)).data == marker
    fresh_nats.stop()  # everything flushed to the files
    assert _files_holding(fresh_nats.store_dir, marker) == []
    fresh_nats.start()
    async with connected(fresh_nats, fresh_nats.creds("operator")) as nc:
        assert (await nc.jetstream().get_msg(ack.stream, ack.seq)).data == marker
