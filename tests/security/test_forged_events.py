"""Attack class 4: forged facts (placements, worker starts and ends, charges, devices,
accounts).

Only the scheduler states placements, only billing states charges, only device-fleet adds
and removes devices, only the provisioner removes accounts, and a worker's start and end
count only from the node its placement named. The server refuses every such subject to
users and to other nodes; what a node may publish on its own subject about someone else's
worker is ignored by the scheduler and billing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import nats.js.errors
import pytest
from gpufleet_bus.streams import stream_for
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.billing import UsageCharged
from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_contracts.identity import AccountRemoved
from gpufleet_contracts.jobs import (
    JobState,
    JobStateChanged,
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
    WorkerState,
)
from gpufleet_contracts.nodes import NodeState, NodeStateChanged
from gpufleet_devstack import wait_for_async

from .attack import Client
from .conftest import (
    ATTACKER_ACCOUNT,
    EVIL_NODE,
    VICTIM_ACCOUNT,
    VICTIM_NODE,
    System,
    Victim,
    cancel,
    last_seq,
    wait_consumed,
)

EVENTS = subjects.STREAM_EVENTS


def now() -> datetime:
    return datetime.now(UTC)


def placed(v: Victim) -> WorkerPlaced:
    """The victim's worker re-placed at a huge rate, paid by the victim, owned by mallory."""
    p = v.placements[0]
    return WorkerPlaced(
        job_id=v.job_id,
        worker=0,
        placement_id="forged-placement",
        node_id=str(p["node_id"]),
        minion_id=VICTIM_NODE,
        region="local",
        gpu_model="RTX 3090",
        gpu_indices=[0, 1],
        gpu_count=2,
        rate=Decimal("1000"),
        charge="market",
        payer=VICTIM_ACCOUNT,
        node_owner=ATTACKER_ACCOUNT,
        placed_at=now(),
    )


def started(v: Victim) -> WorkerStarted:
    return WorkerStarted(
        job_id=v.job_id, worker=0, placement_id=v.placement_id, minion_id=VICTIM_NODE,
        started_at=now(),
    )  # fmt: skip


def finished(v: Victim, minion_id: str = VICTIM_NODE) -> WorkerFinished:
    """The victim's running worker declared finished: billing would settle it, the
    scheduler would free its GPUs."""
    return WorkerFinished(
        job_id=v.job_id,
        worker=0,
        placement_id=v.placement_id,
        minion_id=minion_id,
        state=WorkerState.finished,
        exit_code=0,
        started_at=v.placements[0]["started_at"].replace(tzinfo=UTC),
        ended_at=now(),
    )


def charged(v: Victim) -> UsageCharged:
    return UsageCharged(
        entry_key="forged-charge",
        account=VICTIM_ACCOUNT,
        kind="usage",
        amount_micro=-(10**12),
        at=now(),
        job_id=v.job_id,
        worker=0,
        gpu_count=2,
        rate=Decimal("1000"),
        seconds=3600,
        placement_id=v.placement_id,
    )


def device(v: Victim) -> DeviceAdded:
    """A device the victim would pay a fee for."""
    return DeviceAdded(
        device_id="forged-device", account=VICTIM_ACCOUNT, region="local", model="x", at=now()
    )


def device_gone(v: Victim) -> DeviceRemoved:
    """A device of the victim's declared removed: the provisioner would revoke its
    enrolment (the victim's node, by its minion id)."""
    return DeviceRemoved(
        device_id="forged-device",
        account=VICTIM_ACCOUNT,
        region="local",
        minion_id=VICTIM_NODE,
        at=now(),
    )


def account_gone(v: Victim) -> AccountRemoved:
    """The victim's account declared removed: its jobs would be cancelled, its devices
    removed."""
    return AccountRemoved(account=VICTIM_ACCOUNT, at=now())


def job_state(v: Victim) -> JobStateChanged:
    return JobStateChanged(
        job_id=v.job_id, state=JobState.failed, previous=JobState.running, at=now()
    )


def node_lost(v: Victim) -> NodeStateChanged:
    """The victim's node declared removed: its workers would be requeued."""
    return NodeStateChanged(
        node_id=str(v.placements[0]["node_id"]),
        minion_id=VICTIM_NODE,
        state=NodeState.removed,
        previous=NodeState.active,
        at=now(),
        workers="requeue",
    )


FORGERIES: dict[str, tuple[str, Callable[[Victim], Message]]] = {
    "WorkerPlaced": (WorkerPlaced.SUBJECT, placed),
    "WorkerStarted": (f"{subjects.EVENTS}.worker.started.{VICTIM_NODE}", started),
    "WorkerFinished": (f"{subjects.EVENTS}.worker.finished.{VICTIM_NODE}", finished),
    # the history's copy, which only the scheduler states of the reports it took
    "KeptWorkerStarted": (subjects.kept("started", VICTIM_NODE), started),
    "KeptWorkerFinished": (subjects.kept("finished", VICTIM_NODE), finished),
    "UsageCharged": (UsageCharged.SUBJECT, charged),
    "DeviceAdded": (DeviceAdded.SUBJECT, device),
    "DeviceRemoved": (DeviceRemoved.SUBJECT, device_gone),
    "AccountRemoved": (AccountRemoved.SUBJECT, account_gone),
    "JobStateChanged": (JobStateChanged.SUBJECT, job_state),
    "NodeStateChanged": (NodeStateChanged.SUBJECT, node_lost),
}


@pytest.fixture(params=["user", "node"])
def forger(request: pytest.FixtureRequest, eve: Path, evil_node: Path) -> Path:
    """A user of another account, or the node agent of another minion."""
    return eve if request.param == "user" else evil_node


@pytest.mark.parametrize("event", list(FORGERIES))
async def test_a_forged_event_is_refused(
    system: System, victim: Victim, forger: Path, event: str
) -> None:
    """The event published on its real subject (core NATS and JetStream): refused by the
    server, nothing stored, the victim's job and bill unchanged."""
    subject, make = FORGERIES[event]
    msg = make(victim)
    stream = stream_for(subject) or EVENTS  # a node's report: REPORTS
    before = await last_seq(system, stream, subject)
    async with Client(system.nats.url, forger) as attacker:
        await attacker.send_refused(subject, msg)
        await attacker.js_send_refused(subject, msg)
    assert await last_seq(system, stream, subject) == before
    await victim.assert_untouched()


@pytest.mark.parametrize("claimed", [EVIL_NODE, VICTIM_NODE], ids=["own-id", "victims-id"])
async def test_worker_finished_on_the_evil_nodes_own_subject_is_ignored(
    system: System, victim: Victim, evil_node: Path, claimed: str
) -> None:
    """Another node states, on its own subject (which it may publish), that the victim's
    running worker finished, with the victim's real placement id; its body names either
    itself or the victim's node. The scheduler takes worker facts only from the node the
    placement named, and states only those in the history billing reads: the report is
    read and dropped (REPORTS keeps nothing once read), nothing of the evil node's is in
    the history, the job keeps running, nothing is charged, and the GPUs stay held (a job
    that needs one of them waits)."""
    subject = f"{subjects.EVENTS}.worker.finished.{EVIL_NODE}"
    async with Client(system.nats.url, evil_node) as attacker:
        ack = await attacker.js_send(subject, finished(victim, claimed))
    assert ack.stream == subjects.STREAM_REPORTS
    await wait_consumed(system, subjects.STREAM_REPORTS, "scheduler-worker-events", ack.seq)
    assert await last_seq(system, subjects.STREAM_REPORTS, subject) is None  # read: gone
    assert await last_seq(system, EVENTS, subjects.kept("finished", EVIL_NODE)) is None
    await victim.assert_untouched()

    second = system.submit("--", "true", name="wants-a-gpu", gpus=1)

    async def held_back() -> bool:
        return "0 of 2 GPUs free" in str((await victim.job(second)).get("queue_reason"))

    try:
        await wait_for_async(held_back, timeout=20, interval=0.5)
        assert (await victim.job(second))["state"] == "queued"
    finally:
        cancel(system, second)
    await victim.assert_untouched()


async def test_log_lines_for_the_victims_job_from_another_node_are_not_shown(
    system: System, victim: Victim, evil_node: Path, eve: Path
) -> None:
    """Log chunks for the victim's job: on the victim node's subject refused (user and
    node alike); on the evil node's own subject, which it may publish, stored nowhere (a
    node's logs go to its own stream, which the provisioner made when it enrolled: `evil`
    never did); and the victim's `job logs` shows only what the node its worker ran on
    wrote (an enrolled node's chunks for the victim's job: test_bounds.py)."""
    injected = b"INJECTED: your job is compromised, visit evil.example\n"
    for who in (eve, evil_node):
        async with Client(system.nats.url, who) as attacker:
            await attacker.publish_refused(subjects.log(VICTIM_NODE, victim.job_id, 0), injected)
    async with Client(system.nats.url, evil_node) as attacker:
        with pytest.raises(nats.js.errors.NoStreamResponseError):  # no stream takes it
            await attacker.nc.jetstream().publish(
                subjects.log(EVIL_NODE, victim.job_id, 0), injected
            )
    logs = system.cli("job", "logs", victim.job_id).stdout
    assert victim.secret in logs and "INJECTED" not in logs
    await victim.assert_untouched()
