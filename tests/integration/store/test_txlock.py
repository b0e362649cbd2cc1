"""Transactions of two processes on one nx-27017 database take turns (gpufleet_store/txlock.py).

nx-27017 runs a database's sessions on one SQLite connection, so two processes' overlapping
transactions release or roll back each other's writes (docs/nx-27017-gaps.md). Each child
process below runs transactions that insert a document and add one to a counter; every
transaction that returned must be there, and the counter must equal their number.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpufleet_devstack import EmbeddedMongo
from gpufleet_store import txlock

CHILD = """
import asyncio, json, sys
from gpufleet_store import Store

async def main(name: str, n: int) -> None:
    store = Store.connect("tx")
    await store.db.command("ping")
    print("ready", flush=True)
    sys.stdin.readline()  # both start at once
    done, failed = 0, []
    for i in range(n):
        async def body(tx, i=i):
            await store.db.things.insert_one({"_id": f"{name}-{i}"}, session=tx.session)
            await store.db.counters.update_one(
                {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True, session=tx.session
            )
        try:
            await store.transaction(body)
            done += 1
        except Exception as exc:  # what the gap does: reported, not raised
            failed.append(str(exc)[:200])
    print(json.dumps({"done": done, "failed": failed}))
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

TRANSACTIONS = 150


def run_two(mongo: EmbeddedMongo, prefix: str, lock_dir: Path | None) -> tuple[int, list[str]]:
    """Two processes at once; (transactions that returned, failures); checks the data."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(GPUFLEET_MONGO_URL=mongo.url, GPUFLEET_DB_PREFIX=prefix)
    if lock_dir is not None:
        env["GPUFLEET_MONGO_TX_LOCK_DIR"] = str(lock_dir)
    argv = [sys.executable, "-c", CHILD]
    children = [
        subprocess.Popen(
            [*argv, name, str(TRANSACTIONS)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    for c in children:  # both told to go before either is waited for
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    results = [json.loads(c.communicate(timeout=240)[0]) for c in children]
    done = sum(r["done"] for r in results)
    failed = [f for r in results for f in r["failed"]]
    with mongo.client() as client:
        db = client[f"{prefix}_tx"]
        stored = db.things.count_documents({})
        counter = (db.counters.find_one({"_id": "c"}) or {}).get("n", 0)
    if stored != done or counter != done:
        failed.append(f"{done} transactions returned, {stored} documents, counter {counter}")
    return done, failed


def test_two_processes_transactions_take_turns_with_the_lock(
    mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    done, failed = run_two(mongo_server, db_prefix, tmp_path / "locks")
    assert failed == [] and done == 2 * TRANSACTIONS


def test_without_the_lock_they_collide(mongo_server: EmbeddedMongo, db_prefix: str) -> None:
    """What the lock is for: the same two processes without it (nx-27017's gap). Should a
    later nx-27017 isolate transactions, this fails: the lock can then go."""
    done, failed = run_two(mongo_server, db_prefix, None)
    assert failed, f"{done} transactions of two processes at once, none collided"


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
