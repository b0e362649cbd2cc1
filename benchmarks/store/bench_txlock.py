"""What the cross-process transaction lock (gpufleet_store/txlock.py) costs on nx-27017, and
what it prevents: transactions of one and of two processes, with and without the lock, in
one run against one embedded nx-27017.

A benchmark, not a test (`just test` never runs it). Each case starts its processes, waits
until each has connected, tells them all to go at once, and times them until the last has
run `--transactions` transactions (each inserts a document and adds one to a counter in
one database, through `Store.transaction`); then checks the database: documents and counter
against the transactions that returned. Cases alternate, `--runs` rounds (one untimed round
first); the summary gives each case's median.

    just bench-txlock --runs 5 --json benchmarks/store/results/txlock.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from gpufleet_devstack import EmbeddedMongo

CHILD = """
import asyncio, json, sys
from gpufleet_store import Store

async def main(name: str, n: int) -> None:
    store = Store.connect("bench")
    await store.db.command("ping")
    print("ready", flush=True)
    sys.stdin.readline()
    done, failed = 0, 0
    for i in range(n):
        async def body(tx, i=i):
            await store.db.things.insert_one({"_id": f"{name}-{i}"}, session=tx.session)
            await store.db.counters.update_one(
                {"_id": "c"}, {"$inc": {"n": 1}}, upsert=True, session=tx.session
            )
        try:
            await store.transaction(body)
            done += 1
        except Exception:
            failed += 1
    print(json.dumps({"done": done, "failed": failed}), flush=True)
    await store.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""

CASES = [  # (name, processes, with the lock)
    ("1 process, no lock (baseline)", 1, False),
    ("1 process, lock", 1, True),
    ("2 processes, lock", 2, True),
    ("2 processes, no lock (the gap)", 2, False),
]


def run_case(mongo: EmbeddedMongo, procs: int, lock: Path | None, n: int) -> dict[str, Any]:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(GPUFLEET_MONGO_URL=mongo.url, GPUFLEET_DB_PREFIX=prefix)
    if lock is not None:
        env["GPUFLEET_MONGO_TX_LOCK_DIR"] = str(lock)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, f"p{k}", str(n)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(procs)
    ]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for c in children:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    results = [json.loads(c.communicate(timeout=600)[0]) for c in children]
    wall = time.perf_counter() - started
    done = sum(r["done"] for r in results)
    failed = sum(r["failed"] for r in results)
    with mongo.client() as client:
        db = client[f"{prefix}_bench"]
        stored = db.things.count_documents({})
        counter = int((db.counters.find_one({"_id": "c"}) or {}).get("n", 0))
        client.drop_database(db.name)
    return {
        "wall_s": wall,
        "tx_per_s": procs * n / wall,
        "us_per_tx": wall / (procs * n) * 1e6,
        "raised": failed,
        "returned": done,
        "documents": stored,
        "counter": counter,
        "consistent": stored == counter == done,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=1000, help="per process and run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-txlock-"))
    mongo = EmbeddedMongo(root / "mongo")
    mongo.start()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in CASES}
    try:
        for round_ in range(args.runs + 1):
            for name, procs, with_lock in CASES:
                lock = root / "locks" if with_lock else None
                figures = run_case(mongo, procs, lock, args.transactions)
                if round_ == 0:
                    continue  # untimed: warms the server and the page cache
                runs[name].append(figures)
                print(
                    f"run {round_}: {name}: {figures['tx_per_s']:.0f} tx/s, "
                    f"{figures['us_per_tx']:.0f} us/tx, raised {figures['raised']}, "
                    f"consistent {figures['consistent']}",
                    flush=True,
                )
    finally:
        mongo.stop()

    base = statistics.median(r["us_per_tx"] for r in runs[CASES[0][0]])
    summary = {}
    print(f"\n{args.transactions} transactions a process, median of {args.runs} runs:\n")
    print("| case | tx/s | us a transaction | vs baseline | raised | data consistent |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in CASES:
        rs = runs[name]
        us = statistics.median(r["us_per_tx"] for r in rs)
        row = {
            "tx_per_s": round(statistics.median(r["tx_per_s"] for r in rs), 1),
            "us_per_tx": round(us, 1),
            "vs_baseline": round(us / base, 3),
            "raised": [r["raised"] for r in rs],
            "consistent": [r["consistent"] for r in rs],
        }
        summary[name] = row
        print(
            f"| {name} | {row['tx_per_s']} | {row['us_per_tx']} | {row['vs_baseline']}x | "
            f"{row['raised']} | {row['consistent']} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"transactions": args.transactions, "runs": args.runs, "summary": summary}
        out["raw"] = runs
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
