"""The outbox relay's rate: messages written through the store's outbox, then published by
`OutboxRelay.drain()` to a real nats-server with JetStream, and its CPU per message.

A benchmark, not a test (`just test` never runs it). One nats-server (JetStream, auth and
encryption at rest as the services run it) and one embedded nx-27017 are started for the
whole run; each run writes `--messages` messages in transactions of `--per-tx` into a fresh
database, then times the relay draining them: wall time, and this process's CPU time
(`time.process_time`: the relay, the MongoDB driver reading the documents back, nats-py,
the event loop; not the servers, which are other processes).

`--old FILE` loads a second implementation of `gpufleet_bus.outbox` from FILE (a copy of
the module from git history, e.g. `git show REV:libs/bus/src/gpufleet_bus/outbox.py >
/tmp/outbox_old.py`) and alternates the two, old first, `--runs` times each, in the same
process against the same servers; the summary gives each one's medians. `--compare
NAME=FILE` (repeatable) adds more, named, in the order given, before the current one.

    uv run python benchmarks/outbox/bench_relay.py --old /tmp/outbox_old.py --runs 7
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from faststream.nats import NatsBroker
from gpufleet_bus import BusSettings, ensure_streams, make_broker
from gpufleet_bus import outbox as current_outbox
from gpufleet_contracts import subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_store import Store, StoreSettings, Transaction

SUBJECT = subjects.event("bench", "ticked")
TYPE = "gpufleet.bench.ticked.v1"
SOURCE = "gpufleet/bench"


def load_module(label: str, path: Path) -> ModuleType:
    """A copy of outbox.py as `gpufleet_bus._outbox_bench_<label>` (its relative imports
    resolve against the installed gpufleet_bus)."""
    name = "gpufleet_bus._outbox_bench_" + re.sub(r"\W", "_", label)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def payload(i: int, size: int) -> bytes:
    """A JSON body of about `size` bytes, like an event's."""
    body = {"job_id": f"job-{i:08d}", "worker": i % 7, "node": f"node-{i % 1000:04d}", "pad": ""}
    raw = json.dumps(body).encode()
    body["pad"] = "x" * max(0, size - len(raw))
    return json.dumps(body).encode()


async def write(store: Store, run_id: str, messages: int, per_tx: int, size: int) -> float:
    """Write the messages, `per_tx` to a transaction; returns the seconds it took."""
    started = time.perf_counter()
    for first in range(0, messages, per_tx):

        async def body(tx: Transaction, first: int = first) -> None:
            for i in range(first, min(first + per_tx, messages)):
                tx.emit(SUBJECT, TYPE, payload(i, size), f"{run_id}-{i}")

        await store.transaction(body)
    return time.perf_counter() - started


async def one_run(
    impl: str,
    module: ModuleType,
    mongo_url: str,
    broker: NatsBroker,
    a: argparse.Namespace,
) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    store = Store.connect("bench", StoreSettings(mongo_url=mongo_url, db_prefix=f"b{run_id}"))
    try:
        await store.ensure_indexes({})
        js = (await broker.connect()).jetstream()
        # The same empty stream for every run (streams deny purging: delete, declare again).
        await js.delete_stream(subjects.STREAM_EVENTS)
        await ensure_streams(js)
        write_s = await write(store, run_id, a.messages, a.per_tx, a.payload)
        relay = module.OutboxRelay(store, broker, SOURCE, keep=timedelta(0))
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        sent = await relay.drain()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        stored = (await js.stream_info(subjects.STREAM_EVENTS)).state.messages
        left = await store.db["outbox"].count_documents({})
        if sent != a.messages or stored != a.messages or left:
            raise SystemExit(f"{impl}: sent {sent}, stream holds {stored}, outbox left {left}")
        return {
            "impl": impl,
            "write_msgs_per_s": round(a.messages / write_s),
            "relay_msgs_per_s": round(a.messages / wall),
            "relay_cpu_us_per_msg": round(cpu / a.messages * 1e6, 1),
        }
    finally:
        await store.client.drop_database(store.db.name)
        await store.close()


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for impl in dict.fromkeys(r["impl"] for r in runs):
        mine = [r for r in runs if r["impl"] == impl]
        out[impl] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("relay_msgs_per_s", "relay_cpu_us_per_msg", "write_msgs_per_s")
        }
        out[impl]["runs"] = len(mine)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--per-tx", type=int, default=500, help="messages per transaction")
    ap.add_argument("--payload", type=int, default=200, help="bytes of each message's body")
    ap.add_argument("--runs", type=int, default=5, help="runs of each implementation")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each, first")
    ap.add_argument("--old", type=Path, help="a copy of outbox.py to alternate with")
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="another copy of outbox.py to alternate with, named (repeatable)",
    )
    ap.add_argument("--no-auth", action="store_true", help="an open, unencrypted server")
    ap.add_argument("--json", type=Path, help="write every run and the summary here")
    a = ap.parse_args()

    copies = [("old", a.old)] if a.old is not None else []
    copies += [(n, Path(f)) for n, _, f in (c.partition("=") for c in a.compare)]
    impls = [(name, load_module(name, path)) for name, path in copies]
    impls.append(("new", current_outbox))

    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-outbox-"))
    ns = NatsServer(tmp / "nats", auth=not a.no_auth, encrypt=not a.no_auth)
    mg = EmbeddedMongo(tmp / "mongo")
    ns.start()
    mg.start()
    broker: NatsBroker | None = None
    try:
        creds = None if a.no_auth else ns.creds("operator")
        broker = make_broker("bench", BusSettings(nats_url=ns.url, nats_creds=creds))
        await ensure_streams((await broker.connect()).jetstream())
        for _ in range(a.warmup):
            for name, module in impls:
                await one_run(name, module, mg.url, broker, a)
        runs: list[dict[str, Any]] = []
        for _ in range(a.runs):
            for name, module in impls:  # alternating: old, new, old, new, ...
                runs.append(await one_run(name, module, mg.url, broker, a))
                print(json.dumps(runs[-1]), flush=True)
        result = {
            "machine_cpus": os.cpu_count(),
            "messages": a.messages,
            "per_tx": a.per_tx,
            "payload": a.payload,
            "auth": not a.no_auth,
            "summary": summary(runs),
            "runs": runs,
        }
        print(json.dumps(result["summary"], indent=2))
        if a.json is not None:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if broker is not None:
            await broker.stop()
        mg.stop()
        ns.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
