"""Attack class 2: commanding a node (StartWorker/StopWorker) without being the scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker, StopWorker

from .attack import Client
from .conftest import VICTIM_NODE, System, Victim, last_seq, worker_dirs

START = f"{subjects.COMMANDS}.node.{VICTIM_NODE}.start_worker"
STOP = f"{subjects.COMMANDS}.node.{VICTIM_NODE}.stop_worker"


def start_worker(placement_id: str) -> StartWorker:
    """Run the attacker's code on the victim's node, on its GPUs."""
    return StartWorker(
        minion_id=VICTIM_NODE,
        job_id="forged-job",
        job_name="miner",
        worker=0,
        command=["python", "-c", "open('/tmp/pwned', 'w').write('pwned')"],
        gpu_indices=[0, 1],
        placement_id=placement_id,
    )


@pytest.fixture(params=["user", "node"])
def commander(request: pytest.FixtureRequest, eve: Path, evil_node: Path) -> Path:
    """A user of another account, or another minion's node agent."""
    return eve if request.param == "user" else evil_node


async def test_start_worker_from_a_user_or_another_node_is_refused(
    system: System, victim: Victim, commander: Path
) -> None:
    """StartWorker published on the victim node's command subject, core NATS and JetStream:
    the server refuses both, nothing reaches the COMMANDS stream, no worker runs."""
    jobs_before = await victim.jobs()
    dirs_before, seq_before = (
        worker_dirs(system),
        await last_seq(system, subjects.STREAM_COMMANDS, START),
    )
    async with Client(system.nats.url, commander) as attacker:
        await attacker.send_refused(START, start_worker("forged-core"))
        await attacker.js_send_refused(START, start_worker("forged-js"))
    assert await last_seq(system, subjects.STREAM_COMMANDS, START) == seq_before
    assert worker_dirs(system) == dirs_before
    assert not any(d.startswith("forged") for d in worker_dirs(system))
    assert await victim.jobs() == jobs_before
    await victim.assert_untouched()


async def test_stop_worker_of_the_victims_job_from_a_user_or_another_node_is_refused(
    system: System, victim: Victim, commander: Path
) -> None:
    """StopWorker for the victim's running worker (its real placement id): refused, the
    victim's job keeps running."""
    stop = StopWorker(
        minion_id=VICTIM_NODE,
        job_id=victim.job_id,
        worker=0,
        placement_id=victim.placement_id,
        reason="attacker",
    )
    seq_before = await last_seq(system, subjects.STREAM_COMMANDS, STOP)
    async with Client(system.nats.url, commander) as attacker:
        await attacker.send_refused(STOP, stop)
        await attacker.js_send_refused(STOP, stop)
    assert await last_seq(system, subjects.STREAM_COMMANDS, STOP) == seq_before
    await victim.assert_untouched()
