"""End to end through JetStream and the database, and restart at fleet scale.

    uv run python benchmarks/scheduler/bench_e2e.py [--nodes 10000] [--jobs 3000]

Starts its own nats-server (JetStream) and embedded MongoDB (nx-27017) on free ports, and
the scheduler as its own process (`python -m gpufleet_scheduler`), as in production.

1. Raw ceilings, same run, same machine: JetStream publishes with acks (500 in flight),
   core NATS request/reply (256 in flight), store insert_many (batches of 500), single
   inserts, and one-insert transactions.
2. Submit-to-placed: `--jobs` SubmitJob requests (256 in flight) against a fleet of
   `--nodes` nodes; a job is placed when its WorkerPlaced event arrives on JetStream (so
   the time includes the outbox relay). Sustained throughput = jobs / (last placed - first
   sent).
3. Latency at half that offered load (fixed interval, open loop): p50/p99 submit-to-placed.
4. Restart: `--restart-jobs` queued jobs (default 100,000) and the fleet in the store; a
   fresh scheduler process is started; time until it has rebuilt its memory (its log line)
   and until it resumed: the first WorkerPlaced of the queue (first start), or the end of
   its first pass over the whole queue (restarts after a clean stop and a kill -9, when
   the fleet is already full).

Authentication is on, as in production: the scheduler runs with its service credential,
each of the 200 accounts submits with a user credential of its own on its account's
subject (a connection per account, made before any clock starts), and the benchmark's own
reads and raw ceilings use an operator's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from cryptography.fernet import Fernet
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import JobSpec, SubmitJob, WorkerPlaced
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_scheduler import jobdoc
from gpufleet_store import Store, StoreSettings
from pymongo import AsyncMongoClient

sys.path.insert(0, str(Path(__file__).parent))
from synth import fleet

PREFIX = "bench"
ACCOUNTS = [f"acct{i:03d}" for i in range(200)]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def bus_ceiling(ns: NatsServer, n: int = 20_000) -> dict[str, float]:
    nc = await nats.connect(ns.url, **ns.admin())
    js = nc.jetstream()
    await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"])
    payload = b"x" * 600
    sem = asyncio.Semaphore(500)

    async def one(i: int) -> None:
        async with sem:
            await js.publish(f"bench.raw.{i % 16}", payload)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    js_rate = n / (time.perf_counter() - t0)
    await js.delete_stream("BENCH_RAW")

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", cb=echo)
    sem2 = asyncio.Semaphore(256)

    async def req(i: int) -> None:
        async with sem2:
            await nc.request("bench.echo", payload, timeout=10)

    m = n // 2
    t0 = time.perf_counter()
    await asyncio.gather(*(req(i) for i in range(m)))
    rr_rate = m / (time.perf_counter() - t0)
    await nc.close()
    return {"jetstream_publish_acked_per_s": round(js_rate), "request_reply_per_s": round(rr_rate)}


async def store_ceiling(mongo_url: str) -> dict[str, float]:
    store = Store.connect("raw", StoreSettings(mongo_url=mongo_url, db_prefix=PREFIX))
    coll = store.db["raw"]
    doc = {"spec": {"name": "x" * 40, "gpu_types": ["RTX 3090"], "command": ["python", "t.py"]}}
    n = 20_000
    t0 = time.perf_counter()
    for i in range(0, n, 500):
        await coll.insert_many([{**doc, "i": j} for j in range(i, i + 500)])
    many = n / (time.perf_counter() - t0)
    m = 1000
    t0 = time.perf_counter()
    for i in range(m):
        await coll.insert_one({**doc, "k": i})
    single = m / (time.perf_counter() - t0)

    async def body(tx: Any) -> None:
        await coll.insert_one({**doc}, session=tx.session)

    t0 = time.perf_counter()
    for _ in range(500):
        await store.transaction(body)
    txs = 500 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    read = len(await coll.find({}).to_list(None))
    reads = read / (time.perf_counter() - t0)
    await store.db.drop_collection("raw")
    await store.close()
    return {
        "store_insert_many_docs_per_s": round(many),
        "store_insert_one_per_s": round(single),
        "store_transactions_per_s": round(txs),
        "store_find_docs_per_s": round(reads),
    }


def node_doc(n: Any) -> dict[str, Any]:
    return {
        "_id": n.node_id,
        "minion_id": n.minion_id,
        "region": n.region,
        "owner": n.owner,
        "state": n.state,
        "name": n.minion_id,
        "gpu_model": n.gpu_model,
        "gpu_indices": list(n.gpu_indices),
        "gpu_memory_mb": n.gpu_memory_mb,
        "gpu_shares": n.gpu_shares,
        "price_per_gpu_hour": str(n.price_per_gpu_hour),
        "allow_public_jobs": n.allow_public_jobs,
        "verified": n.verified,
        "updated_ms": 0,
    }


def job_doc(spec: JobSpec, owner: str, at: datetime) -> dict[str, Any]:
    """A queued job's document, as the scheduler writes it."""
    return jobdoc.new_job("j" + uuid.uuid4().hex[:12], spec, owner, at, None)


SECRET_KEY = Fernet.generate_key().decode()  # the scheduler's GPUFLEET_SECRET_KEY


def start_scheduler(ns: NatsServer, mongo_url: str, log: Path) -> subprocess.Popen[bytes]:
    # As in the image (deploy/Dockerfile compiles bytecode): the first start writes the
    # bytecode cache, so restarts do not time compiling every module again.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {
        **env,
        "GPUFLEET_NATS_URL": ns.url,
        "GPUFLEET_NATS_CREDS": str(ns.creds("service", "scheduler")),
        "GPUFLEET_MONGO_URL": mongo_url,
        "GPUFLEET_DB_PREFIX": PREFIX,
        "GPUFLEET_LOG_LEVEL": "INFO",
        "GPUFLEET_SCHEDULER_RESYNC_S": "3600",
        "GPUFLEET_SECRET_KEY": SECRET_KEY,  # one for the run: restarts read what was sealed
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet_scheduler"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


MODELS = ("RTX 3090", "RTX A4000", "RTX A6000", "T4", "V100", "A100 40GB", "A100 80GB")


def spec(i: int, rng: random.Random) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"b{i}",
            "gpu_types": rng.sample(MODELS, 2),
            "gpu_count": 1,
            "max_price": "3",
            "command": ["true"],
        }
    )


class Placed:
    """Arrival time of each job's WorkerPlaced (core subscription on the event subject)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def cb(self, msg: Any) -> None:
        # Only the job id is needed: plain JSON, not the contract model (the client shares
        # the machine's 2 cores with what it measures).
        self.at.setdefault(json.loads(msg.data)["job_id"], time.perf_counter())
        self.changed.set()

    async def wait(self, ids: set[str], limit_s: float) -> None:
        deadline = time.perf_counter() + limit_s
        while not ids <= self.at.keys() and time.perf_counter() < deadline:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)


class Users:
    """One connection per account, with a user credential of that account: a submission
    goes to `<SubmitJob.SUBJECT>.<account>`, the only one of it the credential may publish."""

    def __init__(self, ns: NatsServer) -> None:
        self.ns = ns
        self.conns: dict[str, Any] = {}

    async def connect(self, accounts: list[str]) -> None:
        for account in accounts:
            creds = self.ns.creds("user", "bench", account=account)
            self.conns[account] = await nats.connect(self.ns.url, **NatsServer.client(creds))

    async def close(self) -> None:
        for nc in self.conns.values():
            await nc.close()


async def submit(users: Users, s: JobSpec | bytes, owner: str) -> tuple[str, float]:
    payload = s if isinstance(s, bytes) else SubmitJob(spec=s).to_bytes()
    subject = subjects.as_account(SubmitJob.SUBJECT, owner)
    t = time.perf_counter()
    reply = await users.conns[owner].request(subject, payload, timeout=60)
    body = json.loads(reply.data)
    return body["id"], t


async def throughput(
    users: Users, placed: Placed, n: int, rng: random.Random, in_flight: int = 256
) -> dict[str, float]:
    sem = asyncio.Semaphore(in_flight)
    sent: dict[str, float] = {}
    # Requests are made before the clock starts: the clients of a real fleet are elsewhere.
    payloads = [SubmitJob(spec=spec(i, rng)).to_bytes() for i in range(n)]

    async def one(i: int) -> None:
        async with sem:
            job_id, t = await submit(users, payloads[i], ACCOUNTS[i % 200])
            sent[job_id] = t

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    t_acc = time.perf_counter() - t0
    await placed.wait(set(sent), 600)
    done = [placed.at[j] for j in sent if j in placed.at]
    elapsed = max(done) - t0 if done else float("nan")
    return {
        "jobs": n,
        "in_flight": in_flight,
        "placed": len(done),
        "submit_accepted_per_s": round(n / t_acc),
        "submit_to_placed_per_s": round(len(done) / elapsed),
    }


async def latency(
    users: Users, placed: Placed, rate: float, seconds: float, rng: random.Random
) -> dict[str, float]:
    sent: dict[str, float] = {}
    tasks = []
    interval = 1.0 / rate
    payloads = [
        SubmitJob(spec=spec(100_000 + k, rng)).to_bytes() for k in range(int(rate * seconds) + 2)
    ]
    t0 = time.perf_counter()
    i = 0

    async def one(k: int, t_send: float) -> None:
        job_id, _ = await submit(users, payloads[k], ACCOUNTS[k % 200])
        sent[job_id] = t_send

    while time.perf_counter() - t0 < seconds and i < len(payloads):
        target = t0 + i * interval
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, time.perf_counter())))
        i += 1
    await asyncio.gather(*tasks)
    await placed.wait(set(sent), 120)
    lat = [(placed.at[j] - t) * 1000 for j, t in sent.items() if j in placed.at]
    return {
        "offered_per_s": round(rate, 1),
        "jobs": len(sent),
        "placed": len(lat),
        "p50_ms": round(pct(lat, 0.5), 1),
        "p99_ms": round(pct(lat, 0.99), 1),
        "max_ms": round(max(lat), 1),
    }


async def _start_and_wait(
    ns: NatsServer, mongo_url: str, log: Path, placed: Placed, until: str = "placed"
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the scheduler; time until its memory is rebuilt (its `loaded` line) and, with
    until="placed", until the first WorkerPlaced of the resumed queue arrives, or with
    until="first_pass", until its first pass over the whole queue is over (from then on a
    submission is placed in the next pass)."""
    log.write_text("")  # noqa: ASYNC240
    before = len(placed.at)
    t0 = time.perf_counter()
    proc = start_scheduler(ns, mongo_url, log)
    loaded_at = first_placed = resumed_at = None
    while time.perf_counter() - t0 < 300:
        await asyncio.sleep(0.05)
        text = log.read_text()  # noqa: ASYNC240
        if loaded_at is None and " loaded " in text:
            loaded_at = time.perf_counter() - t0
        if until == "first_pass" and "first pass after loading" in text:
            resumed_at = time.perf_counter() - t0
            break
        if until == "placed" and len(placed.at) > before:
            first_placed = time.perf_counter() - t0
            break
    lines = log.read_text().splitlines()  # noqa: ASYNC240
    line = next((ln for ln in lines if " loaded " in ln), "")
    out = {
        "process_start_to_state_rebuilt_s": round(loaded_at or float("nan"), 2),
        "log": line.split("gpufleet.scheduler:")[-1].strip(),
    }
    if until == "placed":
        out["process_start_to_first_placement_s"] = round(first_placed or float("nan"), 2)
    else:
        out["process_start_to_first_pass_over_s"] = round(resumed_at or float("nan"), 2)
        passed = next((ln for ln in lines if "first pass after loading" in ln), "")
        out["first_pass"] = passed.split("gpufleet.scheduler:")[-1].strip()
    return proc, out


async def _wait_for_log(log: Path, text: str, limit_s: float = 300) -> None:
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        if text in log.read_text():  # noqa: ASYNC240
            return
        await asyncio.sleep(0.2)


async def restart(
    ns: NatsServer, mongo_url: str, log: Path, placed: Placed, jobs: int, nodes: int, users: Users
) -> dict[str, Any]:
    """Three restarts with `jobs` queued: the first ever (no checkpoint: every document is
    read), after a clean stop (SIGTERM: the leader writes a checkpoint as it stops), and
    after kill -9 with 2,000 jobs submitted since the last checkpoint (read as changes)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    db = client[f"{PREFIX}_scheduler"]
    rng = random.Random(9)
    now = datetime.now(UTC)
    t0 = time.perf_counter()
    batch = []
    for i in range(jobs):
        batch.append(job_doc(spec(200_000 + i, rng), f"acct{i % 200:03d}", now))
        if len(batch) == 1000:
            await db.jobs.insert_many(batch)
            batch = []
    if batch:
        await db.jobs.insert_many(batch)
    await db.checkpoints.delete_many({})
    seed_s = time.perf_counter() - t0
    await client.close()
    out: dict[str, Any] = {"queued_jobs_in_store": jobs, "nodes": nodes, "seed_s": round(seed_s, 1)}

    proc, out["first_start_no_checkpoint"] = await _start_and_wait(ns, mongo_url, log, placed)
    await _wait_for_log(log, "checkpoint at rev")  # written after a long load
    await _wait_for_log(log, "first pass after loading")  # the whole queue was looked at
    proc.terminate()
    proc.wait(60)

    # The fleet is full after the first pass, so nothing new is placed: time the rebuild.
    proc, out["after_clean_stop"] = await _start_and_wait(
        ns, mongo_url, log, placed, until="first_pass"
    )
    await asyncio.gather(
        *(submit(users, spec(400_000 + i, rng), ACCOUNTS[i % 200]) for i in range(2000))
    )
    proc.kill()
    proc.wait(10)

    proc, out["after_kill_9_with_2000_later_jobs"] = await _start_and_wait(
        ns, mongo_url, log, placed, until="first_pass"
    )
    proc.terminate()
    proc.wait(60)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=8_000)
    ap.add_argument("--in-flight", type=int, default=1_000, help="submissions awaiting a reply")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--restart-jobs", type=int, default=100_000)
    ap.add_argument(
        "--keep", action="store_true", help="keep the run's directory (logs, ~100 MB of data)"
    )
    ap.add_argument(
        "--no-auth",
        action="store_true",
        help="an open server with JetStream unencrypted: the baseline that shows what the "
        "authentication and the encryption at rest cost",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    ns = NatsServer(tmp / "nats", auth=not a.no_auth, encrypt=not a.no_auth)
    mg = EmbeddedMongo(tmp / "mongo")
    ns.start()
    mg.start()
    results: dict[str, Any] = {"machine_cpus": os.cpu_count()}
    proc = None
    try:
        results["raw"] = {**await bus_ceiling(ns), **await store_ceiling(mg.url)}
        print(json.dumps(results, indent=2), flush=True)
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mg.url)
        db = client[f"{PREFIX}_scheduler"]
        nodes = fleet(a.nodes)
        for i in range(0, len(nodes), 1000):
            await db.nodes.insert_many([node_doc(n) for n in nodes[i : i + 1000]])
        await client.close()
        log = tmp / "scheduler.log"
        proc = start_scheduler(ns, mg.url, log)
        nc = await nats.connect(ns.url, **ns.admin())  # watches the events
        placed = Placed()
        await nc.subscribe(WorkerPlaced.SUBJECT, cb=placed.cb)
        users = Users(ns)
        await users.connect(ACCOUNTS)
        rng = random.Random(3)
        # Warm up: wait until the process answers (imports, connects, loads the fleet).
        deadline = time.perf_counter() + 120
        while True:
            try:
                await submit(users, spec(0, rng), "acct000")
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.perf_counter() > deadline:
                    raise
                await asyncio.sleep(0.5)
        await throughput(users, placed, 50, rng)
        tp = await throughput(users, placed, a.jobs, rng, a.in_flight)
        results["submit_to_placed"] = tp
        print(json.dumps(results, indent=2), flush=True)
        rate = max(1.0, tp["submit_to_placed_per_s"] / 2)
        results["latency_at_half_load"] = await latency(users, placed, rate, a.latency_seconds, rng)
        print(json.dumps(results, indent=2), flush=True)
        proc.terminate()
        proc.wait(10)
        proc = None
        if a.restart_jobs:
            results["restart"] = await restart(
                ns, mg.url, log, placed, a.restart_jobs, a.nodes, users
            )
        await users.close()
        await nc.close()
    finally:
        if proc is not None:
            proc.terminate()
        ns.stop()
        mg.stop()
        if a.keep:
            print(f"kept {tmp} (scheduler.log, NATS and database data)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
