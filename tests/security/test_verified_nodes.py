"""Attack class 12: selling GPUs one does not have (issue 26).

The attacker, an ordinary account (`mallory`), enables the physical provider, creates a
region open to public jobs, takes a join token of its own and enrols a node that claims
8 x H200 (not simulated) at 0.50 credits per GPU-hour, with the rest of its hardware made
up to pass every R-NODE-4 rule. Before verified nodes, another account's H200 job (max
price 5, a database password in its env) was placed there within seconds, and its
StartWorker, password in clear, was the node's to read.

Now the provisioner asks the node for a GPU check, with a nonce, on the node's own command
stream. The attacker answers with a guessed nonce, tries to answer on the victim's node's
subject, answers figures below its claim, then runs gpufleet's real check on its machine
(which has no such GPUs): never verified. The victim's jobs wait ("not verified"), no
StartWorker ever reaches the node, and the attacker's own job still runs there.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import nats.errors
from gpufleet_bus.streams import node_consumer, stream_for
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker, WorkerFinished, WorkerStarted
from gpufleet_contracts.nodes import (
    DriveInfo,
    GpuInfo,
    HardwareInventory,
    NicInfo,
    NodeHeartbeat,
    RegisterNode,
)
from gpufleet_contracts.verification import (
    CheckedGpu,
    GpuCheck,
    GpuCheckReported,
    VerifyGpus,
)
from gpufleet_devstack import wait_for_async
from gpufleet_node_agent.enrol import enrol

from .attack import Client
from .conftest import (
    ATTACKER_ACCOUNT,
    VICTIM_NODE,
    System,
    Victim,
    attacker_subject,
    last_seq,
    stored,
    wait_consumed,
)

COMMANDS = subjects.STREAM_COMMANDS
REGION = "market"
H200_MIB = 143771
NOT_VERIFIED = "another account's node, not verified"
SECRET = f"db-password-{uuid.uuid4().hex}"


def h200(i: int) -> GpuInfo:
    return GpuInfo(
        index=i,
        uuid=f"GPU-{uuid.uuid4()}",
        model="H200",
        nvml_name="NVIDIA H200",
        memory_mb=H200_MIB,
        pcie_gen=5,
        pcie_width=16,
    )


def forged_registration(minion: str) -> RegisterNode:
    """8 x H200, real (not simulated), and made-up hardware that passes R-NODE-4 for a
    region that sells capacity: RAM >= 2 x VRAM, 16 lanes and 4 cores per GPU, NVMe,
    SATA, a TPM 2.0."""
    return RegisterNode(
        minion_id=minion,
        name=minion,
        region=REGION,
        owner=ATTACKER_ACCOUNT,
        hostname=minion,
        gpus=[h200(i) for i in range(8)],
        simulated=False,
        inventory_source="nvml",
        driver_version="550.54.15",
        price_per_gpu_hour=Decimal("0.50"),
        agent_started_at=datetime.now(UTC),
        hardware=HardwareInventory(
            drives=[
                *[DriveInfo(name=f"nvme{i}n1", kind="nvme", size_gb=4000) for i in range(2)],
                *[DriveInfo(name=f"sd{c}", kind="sata", size_gb=8000) for c in "abc"],
            ],
            tpm_version="2.0",
            nics=[NicInfo(name="eth0", speed_mbps=100_000)],
            memory_mb=4 * 1024 * 1024,
            cpu_cores=192,
            gpu_form_factor="pcie",
        ),
        heartbeat_s=5.0,
    )


class Forger:
    """The attacker's node: its own credential, its own commands, its own subjects."""

    def __init__(self, system: System, minion: str, creds: Path) -> None:
        self.system = system
        self.minion = minion
        self.creds = creds
        self.node = Client(system.nats.url, creds, name=minion)
        self._beating: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Forger:
        await self.node.connect()
        self._beating = asyncio.create_task(self._heartbeats())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._beating is not None:
            self._beating.cancel()
        await self.node.close()

    async def _heartbeats(self) -> None:
        """Alive, as any node: a silent one would be lost, and nothing placed there."""
        seq = 0
        while True:
            seq += 1
            hb = NodeHeartbeat(minion_id=self.minion, at=datetime.now(UTC), seq=seq)
            try:
                await self.node.nc.publish(hb.subject(), hb.to_bytes())
            except nats.errors.Error:  # removed (and revoked): cut off
                return
            await asyncio.sleep(1.0)

    async def commands(self, wait_s: float) -> list[tuple[str, bytes]]:
        """What its command consumer delivers within `wait_s` (acked)."""
        js = self.node.nc.jetstream()
        sub = await js.pull_subscribe_bind(node_consumer(self.minion), COMMANDS)
        out: list[tuple[str, bytes]] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_s
            while loop.time() < deadline:
                try:
                    msgs = await sub.fetch(5, timeout=max(0.2, deadline - loop.time()))
                except TimeoutError:
                    break
                for msg in msgs:
                    await msg.ack()
                    out.append((msg.subject.rsplit(".", 1)[-1], msg.data))
        finally:
            await sub.unsubscribe()
        return out

    async def asked(self) -> VerifyGpus:
        for verb, data in await self.commands(30):
            if verb == "verify_gpus":
                return VerifyGpus.from_bytes(data)
        raise AssertionError(f"{self.minion} was never asked for a GPU check")

    async def answer(self, cmd: VerifyGpus, result: GpuCheck, **forged: Any) -> int:
        """Its answer on its own subject (the only one it may publish); the stream seq."""
        report = GpuCheckReported(
            minion_id=self.minion,
            check_id=cmd.check_id,
            nonce=cmd.nonce,
            result=result,
            at=datetime.now(UTC),
        ).model_copy(update=forged)
        subject = GpuCheckReported.SUBJECT.format(minion_id=self.minion)
        ack = await self.node.js_send(subject, report)
        stream = str(stream_for(subject))  # the stream that keeps a node's reports
        await wait_consumed(self.system, stream, "provisioner-gpu-checked", ack.seq)
        return int(ack.seq)


async def attacker(system: System, eve: Path, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    service = "scheduler" if verb in ("submit_job", "get_job", "cancel_job") else "provisioner"
    async with Client(system.nats.url, eve) as me:
        return await me.request(attacker_subject(service, verb), body)


async def enrolled_forger(system: System, eve: Path, tmp_path: Path, minion: str) -> Path:
    """The attacker's own node, enrolled with its own join token in its public region."""
    await attacker(system, eve, "enable_provider", {"provider": "physical"})  # once
    await attacker(system, eve, "create_region", {"name": REGION, "allow_public_jobs": True})
    token = await attacker(
        system, eve, "issue_join_token", {"minion_id": minion, "region": REGION, "ttl_s": 3600}
    )
    path = tmp_path / f"{minion}.creds"
    await enrol([system.nats.url], str(token["token"]), minion, path, attempts=1)
    return path


def h200_job(name: str, env: dict[str, str] | None = None, gpus: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "gpu_types": ["H200"],
        "gpu_count": gpus,
        "max_price": "5",
        "command": ["python", "-c", "print('trained')"],
    }
    if env:
        spec["env"] = env
    return {"spec": spec, "request_id": uuid.uuid4().hex}


def real_check(nonce: str) -> GpuCheck:
    """gpufleet's own check, run on this machine as the agent runs it."""
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet_node_agent.gpucheck", "--nonce", nonce],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return GpuCheck.model_validate(json.loads(out.stdout))


def below_the_claim(reg: RegisterNode) -> GpuCheck:
    """What a 24 GB card shows, named as the H200s the node claims."""
    return GpuCheck(
        gpus=[
            CheckedGpu(
                index=g.index,
                uuid=g.uuid,
                nvml_name=g.nvml_name,
                memory_total_mb=g.memory_mb,
                pcie_gen=g.pcie_gen,
                pcie_width=g.pcie_width,
                allocated_mb=23_500,
                bandwidth_gbps=900.0,
            )
            for g in reg.gpus
        ],
        cpu_count=192,
        memory_mb=4 * 1024 * 1024,
    )


async def verification(system: System, eve: Path, minion: str) -> dict[str, Any]:
    shown = await attacker(system, eve, "show_node", {"node": minion})
    v: dict[str, Any] = shown["verification"]
    return v


async def test_a_node_claiming_gpus_it_does_not_have_never_gets_another_accounts_job(
    system: System, victim: Victim, eve: Path, tmp_path: Path
) -> None:
    """The attack of issue 26, step by step (the module's docstring)."""
    minion = f"forger-{uuid.uuid4().hex[:6]}"
    creds = await enrolled_forger(system, eve, tmp_path, minion)
    reg = forged_registration(minion)
    start_subject = StartWorker.SUBJECT.format(minion_id=minion)
    async with Forger(system, minion, creds) as forger:
        try:
            await selling_no_gpus(system, victim, eve, forger, reg, start_subject)
        finally:  # gone now, rather than lost later in another test's window
            await attacker(system, eve, "remove_node", {"node": minion})
    await victim.assert_untouched()


async def selling_no_gpus(
    system: System,
    victim: Victim,
    eve: Path,
    forger: Forger,
    reg: RegisterNode,
    start_subject: str,
) -> None:
    minion = forger.minion
    ack = await forger.node.js_send(f"{subjects.COMMANDS}.provisioner.{minion}.register_node", reg)
    await wait_consumed(system, COMMANDS, "provisioner-register-node", ack.seq)
    (doc,) = stored(system, "provisioner", "nodes", {"minion_id": minion})
    assert doc["state"] == "active" and doc["failed_rules"] == []  # passes R-NODE-4
    cmd = await forger.asked()

    # A guessed nonce, another check's id: ignored. The victim's node's subject:
    # refused by the server. The victim's node named on its own subject: ignored.
    await forger.answer(cmd, below_the_claim(reg), nonce="guessed-" + "x" * 40)
    await forger.answer(cmd, below_the_claim(reg), check_id=uuid.uuid4().hex)
    await forger.node.js_send_refused(
        GpuCheckReported.SUBJECT.format(minion_id=VICTIM_NODE),
        GpuCheckReported(
            minion_id=VICTIM_NODE,
            check_id=cmd.check_id,
            nonce=cmd.nonce,
            result=GpuCheck(simulated=True),
            at=datetime.now(UTC),
        ),
    )
    await forger.answer(cmd, below_the_claim(reg), minion_id=VICTIM_NODE)
    v = await verification(system, eve, minion)
    assert not v["verified"] and v["pending"], v
    (local,) = stored(system, "provisioner", "nodes", {"minion_id": VICTIM_NODE})
    assert local["verification"]["reason"] == "simulated GPUs: nothing to check"

    # Figures below its claim, with the right nonce: judged, not verified.
    await forger.answer(cmd, below_the_claim(reg))
    v = await verification(system, eve, minion)
    assert not v["verified"] and "a H200 has 141 GB" in v["reason"], v

    # Its owner asks again and answers with gpufleet's real check: no such GPUs here.
    asked = await attacker(system, eve, "verify_node", {"node": minion})
    assert asked["verification"]["pending"]["why"] == "asked by its owner", asked
    again = await forger.asked()
    await forger.answer(again, real_check(again.nonce))
    v = await verification(system, eve, minion)
    assert not v["verified"] and v["reason"].startswith("the check found no GPUs"), v

    # The victim's H200 jobs, one with a database password: they wait, not verified.
    with_secret = await victim.request(
        "scheduler", "submit_job", h200_job("victim-h200", {"DB_PASSWORD": SECRET})
    )
    plain = await victim.request("scheduler", "submit_job", h200_job("victim-h200-plain"))
    try:
        await asyncio.sleep(6)  # the attack saw its StartWorker within ~4 s
        for job in (plain, with_secret):
            shown = await victim.job(job["id"])
            assert shown["state"] == "queued", shown
            reasons = {d["reason"]: d["nodes"] for d in shown["queue_detail"]}
            assert reasons.get(NOT_VERIFIED) == 1, shown["queue_detail"]
        assert await last_seq(system, COMMANDS, start_subject) is None
        assert [verb for verb, _ in await forger.commands(1)] == []

        # The attacker's own job still runs on its node (its owner's: verified or not).
        own = await attacker(system, eve, "submit_job", h200_job("own", gpus=8))

        async def placed() -> bool:
            return await last_seq(system, COMMANDS, start_subject) is not None

        await wait_for_async(placed, timeout=30)
        ((verb, data),) = await forger.commands(2)
        start = StartWorker.from_bytes(data)
        assert verb == "start_worker" and start.job_id == own["id"]
        started = WorkerStarted(
            job_id=start.job_id,
            worker=start.worker,
            placement_id=start.placement_id,
            minion_id=minion,
            started_at=datetime.now(UTC),
        )
        await forger.node.js_send(started.subject(), started)

        async def running() -> bool:
            job = await attacker(system, eve, "get_job", {"job_id": own["id"]})
            return bool(job["state"] == "running")

        await wait_for_async(running, timeout=30)
        job = await attacker(system, eve, "get_job", {"job_id": own["id"]})
        assert job["workers"][0]["node"] == minion and job["workers"][0]["charge"] == "usage"
        await attacker(system, eve, "cancel_job", {"job_id": own["id"]})
        stopped = WorkerFinished(
            job_id=start.job_id,
            worker=start.worker,
            placement_id=start.placement_id,
            minion_id=minion,
            state="stopped",
            started_at=started.started_at,
            ended_at=datetime.now(UTC),
        )
        await forger.node.js_send(stopped.subject(), stopped)
        for job in (with_secret, plain):
            assert (await victim.job(job["id"]))["state"] == "queued"
    finally:
        for job in (with_secret, plain):
            await victim.request("scheduler", "cancel_job", {"job_id": job["id"]})


async def test_the_real_agent_answers_its_check_and_its_simulated_gpus_stay_its_owners(
    system: System, victim: Victim
) -> None:
    """The victim's node is the real agent, with simulated GPUs: asked at its registration
    (its command stream), it answered on its own subject; the provisioner recorded that
    simulated GPUs are not checked, and `node show` says why it is not verified."""

    async def answered() -> bool:
        (node,) = stored(system, "provisioner", "nodes", {"minion_id": VICTIM_NODE})
        return bool(node.get("verification", {}).get("checked_at_ms"))

    await wait_for_async(answered, timeout=60)
    shown = system.json("node", "show", VICTIM_NODE)
    v = shown["verification"]
    assert (v["verified"], v["reason"]) == (False, "simulated GPUs: nothing to check")
    assert v["checks"] == ["failed: simulated GPUs: nothing to check"]
    text = system.cli("node", "show", VICTIM_NODE).stdout
    assert "simulated GPUs: nothing to check" in text and "its owner's jobs only" in text
    await victim.assert_untouched()
