"""The state a running system holds, beside the state its event history implies.

What is derived from events, and so must be reproduced by replaying GPUFLEET_EVENTS:
- billing's ledger, every balance: billing's only inputs are events (worker placed/started/
  finished, devices, providers), so an empty billing database fed the whole stream rebuilds
  it (`replay_billing`);
- each job's state: the scheduler publishes every change of it (JobStateChanged, through its
  outbox, in the same transaction as the change), so the last one in the stream is the
  stored state (`job_states_from_events`);
- each node's state: the provisioner publishes NodeRegistered and every NodeStateChanged
  (`node_states_from_events`).
What is not: a job's spec and its sealed secrets (SubmitJob is a request, not an event; the
stream has only JobQueued's summary), accounts and credentials, the scheduler's claims and
the provisioner's heartbeat times (current facts, not history). Those are not rebuilt by a
replay; the database is their only home (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import nats
from gpufleet_contracts import subjects
from gpufleet_devstack import ServiceProcess

from .conftest import System

Event = tuple[str, str, dict[str, Any]]


def job_states_from_events(events: list[Event]) -> dict[str, str]:
    """Each job's last published state (stream order is the order of the scheduler's commits)."""
    out: dict[str, str] = {}
    for _, type_, body in events:
        if type_ == "gpufleet.job.state_changed.v1":
            out[str(body["job_id"])] = str(body["state"])
    return out


def node_states_from_events(events: list[Event]) -> dict[str, str]:
    out: dict[str, str] = {}
    for _, type_, body in events:
        if type_ in ("gpufleet.node.registered.v1", "gpufleet.node.state_changed.v1"):
            out[str(body["node_id"])] = str(body["state"])
    return out


def stored_job_states(system: System) -> dict[str, str]:
    with system.mongo.client() as client:
        jobs = client["gpufleet_scheduler"]["jobs"].find({}, {"state": 1})
        return {str(j["_id"]): str(j["state"]) for j in jobs}


def stored_node_states(system: System) -> dict[str, str]:
    with system.mongo.client() as client:
        nodes = client["gpufleet_provisioner"]["nodes"].find({}, {"state": 1})
        return {str(n["_id"]): str(n["state"]) for n in nodes}


def state_drift(stored: dict[str, str], derived: dict[str, str]) -> list[str]:
    """Where the database and the event history disagree."""
    return [
        f"{key}: stored {stored.get(key)}, events say {derived.get(key)}"
        for key in sorted(set(stored) | set(derived))
        if stored.get(key) != derived.get(key)
    ]


def ledger_balances(system: System, db: str = "gpufleet_billing") -> dict[str, int]:
    out: Counter[str] = Counter()
    with system.mongo.client() as client:
        for e in client[db]["ledger"].find({}, {"account": 1, "amount_micro": 1}):
            out[str(e["account"])] += int(e["amount_micro"])
    return dict(out)


def _delete_consumers(system: System, prefix: str) -> None:
    async def run() -> None:
        nc = await nats.connect(servers=system.nats_url.split(","), **system.nats.admin())
        try:
            js = nc.jetstream()
            for stream in (subjects.STREAM_EVENTS, subjects.STREAM_COMMANDS):
                for info in await js.consumers_info(stream):
                    if info.name.startswith(prefix):
                        await js.delete_consumer(stream, info.name)
        finally:
            await nc.close()

    asyncio.run(run())


def replay_billing(system: System, prefix: str = "replay", settle_s: float = 240) -> dict[str, int]:
    """Stop billing, forget its consumers' positions, and run a billing on an empty database
    (`<prefix>_billing`) over the whole stream; its balances once they stop changing. The
    system's billing is left stopped (its ledger is what the caller compares with)."""
    system.procs["billing"].stop()
    _delete_consumers(system, "billing")
    live = system.procs["billing"]
    env = {**(live.env or {}), "GPUFLEET_DB_PREFIX": prefix}
    proc = ServiceProcess("billing-replay", live.argv, env, system.root / "logs" / "replay.log")
    proc.start()
    try:
        deadline, last, same = time.monotonic() + settle_s, None, 0
        while time.monotonic() < deadline:
            now = ledger_balances(system, f"{prefix}_billing")
            same = same + 1 if now == last and now else 0
            if same >= 10:
                return now
            last = now
            time.sleep(1)
        raise AssertionError(f"the replayed ledger never settled: {json.dumps(last)}")
    finally:
        proc.stop()
