"""Transactions of two processes on one nx-27017 database take turns (gpufleet_store/txlock.py).

nx-27017 runs a database's sessions on one SQLite connection, so two processes' overlapping
transactions release or roll back each other's writes (docs/nx-27017-gaps.md). Two child
processes (the benchmark's, benchmarks/store/bench_txlock.py) run transactions that insert
a document and add one to a counter; every transaction that returned must be there, and
the counter must equal their number.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from gpufleet_devstack import EmbeddedMongo
from gpufleet_store import txlock

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "store"))
from bench_txlock import run_case  # the benchmark's processes, with fewer transactions

TRANSACTIONS = 150


def test_two_processes_transactions_take_turns_with_the_lock(
    mongo_server: EmbeddedMongo, tmp_path: Path
) -> None:
    figures = run_case(mongo_server, 2, tmp_path / "locks", TRANSACTIONS)
    assert figures["raised"] == 0 and figures["returned"] == 2 * TRANSACTIONS, figures
    assert figures["consistent"], figures


def test_without_the_lock_they_collide(mongo_server: EmbeddedMongo) -> None:
    """What the lock is for: the same two processes without it (nx-27017's gap). Should a
    later nx-27017 isolate transactions, this fails: the lock can then go."""
    figures = run_case(mongo_server, 2, None, TRANSACTIONS)
    assert figures["raised"] > 0 or not figures["consistent"], figures


async def test_a_holder_in_another_process_is_waited_for_and_its_death_frees_the_lock(
    tmp_path: Path,
) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys, time; from gpufleet_store import txlock\n"
        f"with txlock.held_blocking({str(tmp_path)!r}, 'db'):\n"
        "    print('held', flush=True); time.sleep(600)",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert (await holder.stdout.readline()).strip() == b"held"
        # Waiting can be cancelled (a service stopping) and leaves nothing held.
        waiting = asyncio.ensure_future(txlock.held(tmp_path, "db").__aenter__())
        await asyncio.sleep(0.3)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        holder.kill()  # dies holding it: the kernel lets it go
        await holder.wait()
        async with asyncio.timeout(5), txlock.held(tmp_path, "db"):
            pass
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def test_one_database_lock_does_not_hold_another(tmp_path: Path) -> None:
    with txlock.held_blocking(tmp_path, "gpufleet_scheduler"):
        async with asyncio.timeout(2), txlock.held(tmp_path, "gpufleet_billing"):
            pass
