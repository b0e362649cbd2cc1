"""The node agent against a real nats-server: registration, workers, restart."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from gpufleet_bus import BusSettings, Ports, ensure_streams, make_broker, publish
from gpufleet_bus.streams import ensure_node_consumer, ensure_node_logs, node_consumer
from gpufleet_contracts import envelope_for, subjects
from gpufleet_contracts.jobs import (
    StartWorker,
    StopWorker,
    WorkerFinished,
    WorkerStarted,
    WorkerState,
)
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode
from gpufleet_devstack import NatsServer, wait_for_async
from gpufleet_node_agent.agent import Agent
from gpufleet_node_agent.app import build_app
from gpufleet_node_agent.settings import AgentSettings, default_sim_inventory
from gpufleet_telemetry.exposition import MetricsSettings
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from ..conftest import JsPublisher
from .podman_support import container_record

PY = sys.executable


@asynccontextmanager
async def running_agent(
    server: NatsServer,
    state_dir: Path,
    minion_id: str,
    metrics: MetricsSettings | None = None,
    **settings: Any,
) -> AsyncIterator[Agent]:
    """The agent app on a real broker, with an enrolled node's credential and the command
    consumer the provisioner would have made: start-up hooks, consumers, loops. The node's
    owner (`local`) opted into bare processes for its own jobs (start_cmd's). `metrics`: its
    /metrics (none by default)."""
    settings = AgentSettings(
        minion_id=minion_id,
        agent_state_dir=state_dir,
        simulated_gpus=default_sim_inventory(),
        heartbeat_s=0.3,
        worker_poll_s=0.1,
        **{"account": "local", "allow_bare_processes": "own-jobs", **settings},
    )
    nc = await nats.connect(server.url, **server.admin())
    await ensure_streams(nc.jetstream())
    await ensure_node_consumer(nc.jetstream(), minion_id)
    await ensure_node_logs(nc.jetstream(), minion_id)
    await nc.close()
    bus = BusSettings(nats_url=server.url, nats_creds=server.creds("node", minion_id))
    ports = Ports(make_broker("node-agent", bus), bus=bus, metrics=metrics or MetricsSettings())
    svc = build_app(ports, settings)
    await svc.app.start()
    try:
        yield svc.core
    finally:
        await svc.app.stop()


@asynccontextmanager
async def client(server: NatsServer) -> AsyncIterator[Client]:
    """An operator's connection: the test plays the scheduler and reads the streams."""
    nc = await nats.connect(server.url, **server.admin())
    try:
        yield nc
    finally:
        await nc.close()


async def read_stream(js: JetStreamContext, subject: str) -> list[Msg]:
    sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    out: list[Msg] = []
    try:
        while True:
            try:
                out.append(await sub.next_msg(timeout=0.3))
            except TimeoutError:
                return out
    finally:
        await sub.unsubscribe()


async def reports(js: JetStreamContext, subject: str) -> list[bytes]:
    """What nodes reported on `subject`, still in REPORTS (nobody plays the scheduler here,
    which would take them): read message by message, as a work queue allows no observer."""
    out: list[bytes] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(subjects.STREAM_REPORTS, seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return out
        out.append(msg.data or b"")
        seq = int(msg.seq or seq) + 1


async def events_of(js: JetStreamContext, cls: type[Any], placement_id: str) -> list[Any]:
    msgs = await reports(js, cls.SUBJECT.replace("{minion_id}", "*"))
    return [e for e in (cls.from_bytes(m) for m in msgs) if e.placement_id == placement_id]


async def wait_finished(js: JetStreamContext, placement_id: str) -> WorkerFinished:
    found: list[WorkerFinished] = []

    async def arrived() -> bool:
        found[:] = await events_of(js, WorkerFinished, placement_id)
        return bool(found)

    await wait_for_async(arrived, timeout=30, message=f"WorkerFinished of {placement_id}")
    return found[0]


async def consumer_caught_up(js: JetStreamContext, durable: str, seq: int) -> bool:
    info = await js.consumer_info(subjects.STREAM_COMMANDS, durable)
    return bool(
        info.delivered.stream_seq >= seq and info.num_ack_pending == 0 and info.num_pending == 0
    )


def start_cmd(
    minion: str, command: list[str], placement: str, account: str = "local"
) -> StartWorker:
    """A job of `account` (by default the node's owner's)."""
    return StartWorker(
        owner=account,
        creator=account,
        minion_id=minion,
        job_id=f"job-{placement}",
        job_name="it",
        worker=0,
        command=command,
        gpu_indices=[1],
        placement_id=placement,
    )


async def test_registers_heartbeats_and_runs_a_worker_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    minion = f"it-{uuid.uuid4().hex[:8]}"
    placement = uuid.uuid4().hex
    runs = tmp_path / "runs"
    code = (
        f"import os; open({str(runs)!r}, 'a').write('x');"
        "print('hello from', os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    cmd = start_cmd(minion, [PY, "-c", code], placement)
    async with client(nats_server) as nc:
        js = nc.jetstream()
        beats = await nc.subscribe(subjects.heartbeat(minion))
        async with running_agent(nats_server, tmp_path / "state", minion) as agent:
            # registration, on the provisioner's command subject
            reg_subject = f"gpufleet.v1.cmd.provisioner.{minion}.register_node"
            await wait_for_async(agent.registered.is_set, timeout=10)
            (reg_msg,) = await read_stream(js, reg_subject)
            reg = RegisterNode.from_bytes(reg_msg.data)
            assert reg_msg.headers is not None
            assert reg_msg.headers["ce-type"] == RegisterNode.TYPE
            assert (reg.minion_id, reg.simulated, len(reg.gpus)) == (minion, True, 2)
            # heartbeats on core NATS, and this node's own health subject
            hb = NodeHeartbeat.from_bytes((await beats.next_msg(timeout=5)).data)
            assert hb.minion_id == minion and len(hb.gpus) == 2
            reply = await nc.request(subjects.node_health(minion), b"{}", timeout=5)
            assert json.loads(reply.data)["minion_id"] == minion

            # a worker runs, reports its start and end, ships its log
            sched = JsPublisher(nc)
            await publish(sched, cmd, source="gpufleet/scheduler")
            done = await wait_finished(js, placement)
            assert (done.state, done.exit_code, done.minion_id) == (WorkerState.finished, 0, minion)
            assert done.log_tail == "hello from 1\n"
            started = await events_of(js, WorkerStarted, placement)
            assert len(started) == 1
            logs = await read_stream(js, subjects.log(cmd.minion_id, cmd.job_id, 0))
            assert b"".join(m.data for m in logs) == b"hello from 1\n"

            # the same command again, under another message id: not run twice
            again = envelope_for(cmd, source="gpufleet/scheduler")  # a new ce-id
            ack = await js.publish(cmd.subject(), cmd.to_bytes(), headers=again.headers())
            durable = node_consumer(minion)
            await wait_for_async(lambda: consumer_caught_up(js, durable, ack.seq), timeout=10)
            await agent.workers.poll_once()

            # a StopWorker for a placement never seen frees its GPUs at once
            ghost = uuid.uuid4().hex
            await publish(
                sched,
                StopWorker(
                    minion_id=minion,
                    job_id="job-ghost",
                    worker=0,
                    placement_id=ghost,
                    reason="cancelled by user",
                ),
                source="gpufleet/scheduler",
            )
            stopped = await wait_finished(js, ghost)
            assert (stopped.state, stopped.reason) == (
                WorkerState.stopped,
                "stopped before it started",
            )
        assert runs.read_text() == "x"
        assert len(await events_of(js, WorkerFinished, placement)) == 1
        assert len(await events_of(js, WorkerStarted, placement)) == 1


async def test_a_heartbeat_carries_an_injected_xid_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Simulated GPUs are steered by `<agent_state_dir>/simulated-telemetry.json`."""
    minion = f"it-{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    async with client(nats_server) as nc:
        beats = await nc.subscribe(subjects.heartbeat(minion))
        async with running_agent(nats_server, state, minion):
            hb = NodeHeartbeat.from_bytes((await beats.next_msg(timeout=5)).data)
            assert [g.xid_events for g in hb.gpus] == [[], []]
            assert hb.disk_used_pct is not None and hb.disk_free_gb is not None
            control = state / "simulated-telemetry.json"
            control.write_text(json.dumps({"gpus": {"1": {"temperature_c": 95, "xid": [79]}}}))
            seen: list[NodeHeartbeat] = []
            while not seen or seen[-1].gpus[1].temperature_c != 95:
                seen.append(NodeHeartbeat.from_bytes((await beats.next_msg(timeout=5)).data))
            for _ in range(3):
                seen.append(NodeHeartbeat.from_bytes((await beats.next_msg(timeout=5)).data))
    xids = [e.xid for hb in seen for e in hb.gpus[1].xid_events or []]
    assert xids == [79]  # in the heartbeat after the file was written, once
    assert all(hb.gpus[1].temperature_c == 95 for hb in seen[-3:])
    assert all(not hb.gpus[0].xid_events for hb in seen)


async def test_worker_survives_an_agent_restart(nats_server: NatsServer, tmp_path: Path) -> None:
    minion = f"it-{uuid.uuid4().hex[:8]}"
    placement = uuid.uuid4().hex
    state = tmp_path / "state"
    code = "import time; print('begin', flush=True); time.sleep(2); print('end')"
    cmd = start_cmd(minion, [PY, "-c", code], placement)
    async with client(nats_server) as nc:
        js = nc.jetstream()
        async with running_agent(nats_server, state, minion) as first:
            await publish(JsPublisher(nc), cmd, source="gpufleet/scheduler")

            async def running() -> bool:
                return len(await events_of(js, WorkerStarted, placement)) == 1

            await wait_for_async(running, timeout=20)
            assert first.workers.running() == [f"{cmd.job_id}/0"]
        # the agent is gone; its worker is not
        async with running_agent(nats_server, state, minion) as second:
            assert second.recovery is not None
            assert second.recovery.reattached == [placement]
            done = await wait_finished(js, placement)
            assert (done.state, done.exit_code) == (WorkerState.finished, 0)
            assert done.log_tail == "begin\nend\n"
            for _ in range(5):  # a few more rounds: nothing is reported again
                await second.workers.poll_once()
        assert len(await events_of(js, WorkerFinished, placement)) == 1
        assert len(await events_of(js, WorkerStarted, placement)) == 1
        logs = await read_stream(js, subjects.log(cmd.minion_id, cmd.job_id, 0))
        assert b"".join(m.data for m in logs) == b"begin\nend\n"


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
async def test_a_container_worker_survives_an_agent_restart(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Another account's job on a node whose operator allowed bare processes for its own
    jobs: it runs in a container all the same (the runtime policy), as non-root, and a
    restarted agent re-attaches to it and reports its end once."""
    minion = f"it-{uuid.uuid4().hex[:8]}"
    placement = uuid.uuid4().hex
    state = tmp_path / "state"
    code = "import os, time; print('uid', os.getuid(), flush=True); time.sleep(2); print('end')"
    cmd = start_cmd(minion, ["python3", "-c", code], placement, account="acme")
    podman = {"worker_memory_mb": 256, "worker_cpus": 1}
    async with client(nats_server) as nc:
        js = nc.jetstream()
        async with running_agent(nats_server, state, minion, **podman) as first:
            await publish(JsPublisher(nc), cmd, source="gpufleet/scheduler")

            async def running() -> bool:
                return len(await events_of(js, WorkerStarted, placement)) == 1

            await wait_for_async(running, timeout=120)  # the first run builds the base image
            assert first.workers.running() == [f"{cmd.job_id}/0"]
            assert container_record(state / "workers" / placement) is not None
        async with running_agent(nats_server, state, minion, **podman) as second:
            assert second.recovery is not None
            assert second.recovery.reattached == [placement]
            done = await wait_finished(js, placement)
            assert (done.state, done.exit_code) == (WorkerState.finished, 0)
            assert done.log_tail == "uid 10000\nend\n"
        assert len(await events_of(js, WorkerFinished, placement)) == 1
