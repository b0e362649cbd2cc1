"""One running system for the whole security layer, a victim, and the attackers.

`system` is the e2e `System` (every service and one node agent as real processes, real
NATS with auth), started once for the package: each start costs about 15 s. The victim is
account `local` (the CLI's user `dev`), owner of the node `local-node-1`, with one job
running on both of its GPUs for the whole package (`victim`). The attackers are the user
`eve` of account `mallory` and the node agent credential of minion `evil` (account
`mallory`; enrolled nowhere).

Every test tries one attack and then checks, as the victim sees it (the requests its CLI
makes, with its credential), that the victim's job and its bill are as they were
(`Victim.assert_untouched`); helpers read what was stored (streams as an operator, the
services' databases) to show that nothing of the attacker's was.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from e2e.conftest import System as System  # the tests type their fixture with it
from gpufleet_contracts import subjects
from gpufleet_devstack import identities, wait_for, wait_for_async
from gpufleet_devstack.up import NODE_NAME

from .attack import Client

VICTIM_ACCOUNT = identities.LOCAL_ACCOUNT
VICTIM_NODE = NODE_NAME
ATTACKER_ACCOUNT = "mallory"
ATTACKER_USER = "eve"
EVIL_NODE = "evil"
# What each node's log stream keeps (the provisioner's GPUFLEET_NODE_LOG_MAX_BYTES / _MSGS;
# 256 MiB and 131,072 by default): small, so that a test floods past it in seconds.
NODE_LOG_MAX_BYTES = 16 * 1024 * 1024
NODE_LOG_MAX_MSGS = 4096
BOUNDS = {
    "GPUFLEET_NODE_LOG_MAX_BYTES": str(NODE_LOG_MAX_BYTES),
    "GPUFLEET_NODE_LOG_MAX_MSGS": str(NODE_LOG_MAX_MSGS),
}


@pytest.fixture(scope="package")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One system for every security test (package scope: one start, ~15 s)."""
    system = System(tmp_path_factory.mktemp("security"), service_env=BOUNDS)
    try:
        system.start()
        asyncio.run(identities.ensure_account(system.nats, ATTACKER_ACCOUNT, "team"))
        yield system
    finally:
        system.stop()


# --- identities -------------------------------------------------------------------------


@pytest.fixture(scope="package")
def eve(system: System) -> Path:
    """The attacker's user credential (account `mallory`)."""
    return system.nats.creds("user", ATTACKER_USER, account=ATTACKER_ACCOUNT)


@pytest.fixture(scope="package")
def evil_node(system: System) -> Path:
    """A node agent credential of another minion (`evil`, account `mallory`): what a
    stolen or self-made node credential allows."""
    return system.nats.creds("node", EVIL_NODE, account=ATTACKER_ACCOUNT)


@pytest.fixture(scope="package")
def victim_user(system: System) -> Path:
    return identities.user_creds(system.nats)


# --- what is stored: read as an operator, or straight from the database -----------------


async def admin_js(system: System, fn: Any) -> Any:
    """`await fn(js)` with an operator's JetStream context."""
    nc = await nats.connect(system.nats.url, **system.nats.admin())
    try:
        return await fn(nc.jetstream(timeout=5))
    finally:
        await nc.close()


async def last_seq(system: System, stream: str, subject: str) -> int | None:
    """The stream sequence of the last message on `subject` (None: there is none)."""

    async def get(js: Any) -> int | None:
        try:
            msg = await js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        return int(msg.seq)

    result: int | None = await admin_js(system, get)
    return result


async def stream_state(system: System, stream: str) -> dict[str, int]:
    async def get(js: Any) -> dict[str, int]:
        info = await js.stream_info(stream)
        return {
            "messages": int(info.state.messages),
            "first_seq": int(info.state.first_seq),
            "last_seq": int(info.state.last_seq),
        }

    result: dict[str, int] = await admin_js(system, get)
    return result


async def consumer_names(system: System, stream: str) -> list[str]:
    async def get(js: Any) -> list[str]:
        return sorted(str(c.name) for c in await js.consumers_info(stream))

    result: list[str] = await admin_js(system, get)
    return result


async def wait_consumed(
    system: System, stream: str, durable: str, seq: int, wait_s: float = 30
) -> None:
    """Wait until the consumer `durable` has handled (acked) stream sequence `seq`: the
    service has seen the attacker's message and done whatever it does with it."""

    async def acked(js: Any) -> bool:
        info = await js.consumer_info(stream, durable)
        return int(info.ack_floor.stream_seq or 0) >= seq

    await wait_for_async(
        lambda: admin_js(system, acked),
        timeout=wait_s,
        interval=0.3,
        message=f"{durable} never handled {stream} #{seq}",
    )


def stored(system: System, service: str, collection: str, query: dict[str, Any]) -> list[Any]:
    """Documents of a service's own database (read straight from MongoDB)."""
    client = system.mongo.client()
    try:
        db = client[f"gpufleet_{service.replace('-', '_')}"]
        return list(db[collection].find(query))
    finally:
        client.close()


def worker_dirs(system: System) -> list[str]:
    """The node agent's per-placement directories: one per worker it was asked to run."""
    root = system.root / "agent" / "workers"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# --- the victim ---------------------------------------------------------------------------


@dataclass
class Victim:
    """A job of account `local`, running on both GPUs of `local-node-1`, and what the
    victim sees of it and of its bill: the requests its CLI makes (`job show`, `billing
    balance`, `billing entries`), sent with its credential (a CLI process per check would
    cost seconds; the fixture's teardown checks once more through the CLI itself)."""

    system: System
    creds: Path
    job_id: str
    secret: str  # a line only this job printed
    placements: list[dict[str, Any]] = field(default_factory=list)  # the scheduler's workers
    before: dict[str, Any] = field(default_factory=dict)

    async def request(
        self,
        service: str,
        verb: str,
        body: dict[str, Any] | None = None,
        *,
        me: Client | None = None,
    ) -> Any:
        """A request of the victim's account (on `me`, or a connection of its own)."""
        subject = subjects.as_account(subjects.rpc(service, verb), VICTIM_ACCOUNT)
        if me is not None:
            return await me.request(subject, body or {})
        async with Client(self.system.nats.url, self.creds, name="victim") as own:
            return await own.request(subject, body or {})

    async def jobs(self) -> list[str]:
        """The ids `gpufleet job list` shows."""
        return [str(j["id"]) for j in (await self.request("scheduler", "list_jobs"))["jobs"]]

    async def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = await self.request("scheduler", "get_job", {"job_id": job_id})
        return job

    async def nodes(self) -> list[str]:
        """The minion ids `gpufleet node list` shows."""
        nodes = (await self.request("provisioner", "list_nodes"))["nodes"]
        return sorted(str(n["minion_id"]) for n in nodes)

    async def seen(self) -> dict[str, Any]:
        async with Client(self.system.nats.url, self.creds, name="victim") as me:
            job = await self.request("scheduler", "get_job", {"job_id": self.job_id}, me=me)
            cost = await self.request("billing", "job_cost", {"job_id": self.job_id}, me=me)
            balance = await self.request("billing", "balance", me=me)
            entries = await self.request("billing", "entries", {"limit": 1000}, me=me)
        return {
            "state": job["state"],
            "history": job["history"],
            "notes": job["notes"],
            "workers": [
                {k: w.get(k) for k in ("index", "state", "node", "gpu_indices", "started_at")}
                | {k: w.get(k) for k in ("ended_at", "exit_code", "reason", "attempts")}
                for w in job["workers"]
            ],
            "cost_micro": cost["cost_micro"],
            "balance_micro": balance["balance_micro"],
            "entries": entries["entries"],
        }

    async def assert_untouched(self) -> None:
        """Still running where it ran, nothing charged, nothing noted."""
        now = await self.seen()
        assert now["state"] == "running", now
        assert now == self.before

    @property
    def placement_id(self) -> str:
        return str(self.placements[0]["placement_id"])


@pytest.fixture(scope="package")
def victim(system: System, victim_user: Path) -> Iterator[Victim]:
    secret = f"victim-secret-{uuid.uuid4().hex}"
    script = f"print({secret!r}, flush=True); import time; time.sleep(3600)"
    job_id = system.submit("--", "python", "-c", script, name="victim", gpus=2)
    system.wait_state(job_id, "running", timeout=60)
    wait_for(
        lambda: secret in system.cli("job", "logs", job_id).stdout,
        timeout=30,
        interval=0.5,
        message="the victim's job never logged its secret",
    )
    v = Victim(system, victim_user, job_id, secret)
    (doc,) = stored(system, "scheduler", "jobs", {"_id": job_id})
    v.placements = [dict(w) for w in doc["workers"]]
    assert v.placements[0]["minion_id"] == VICTIM_NODE
    v.before = asyncio.run(v.seen())
    balance = system.json("billing", "balance")
    yield v
    # After every attack, as the victim's own CLI shows it: running, nothing charged.
    try:
        assert system.job(job_id)["state"] == "running"
        assert system.json("billing", "balance") == balance
    finally:
        # Its worker is stopped before the system goes (workers outlive their agent).
        system.cli("job", "cancel", job_id, check=False)
        system.wait_state(job_id, "stopped", "failed", "finished", timeout=30)


def attacker_subject(service: str, verb: str) -> str:
    """The attacker's own subject for a request (the only account it may publish for)."""
    return subjects.as_account(subjects.rpc(service, verb), ATTACKER_ACCOUNT)


def cancel(system: System, job_id: str) -> subprocess.CompletedProcess[str]:
    return system.cli("job", "cancel", job_id, check=False)
