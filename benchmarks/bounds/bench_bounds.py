"""What a flood from one node does to the streams, before and after "bounded by whom".

A benchmark, not a test (`just test` never runs it): one nats-server as the services run
it (authentication on, the file store encrypted, the server's default fsync), started per
configuration in a temporary directory, loopback only. The flooder is a node credential
(`flooder`), the victim another (`victim`); an operator reads the streams.

- `old`: the streams of the release before (GPUFLEET_EVENTS took every event subject, one
  GPUFLEET_LOGS of 2 GiB for every node, the oldest first). The victim stores one log
  chunk; the flooder publishes chunks of `--chunk-kib` under job ids it makes up until the
  victim's chunk is gone (or `--max-gib` were sent), and `--reports` reports on its own
  subject: how many were kept, and what the history grew by.
- `new`: this release's (gpufleet_bus.streams: a log stream per node, REPORTS). The same
  flood, as many bytes as `old` needed: what the flooder's stream keeps, whether the
  victim's chunk is there; the same reports: how many were queued, refused, and what the
  history grew by.
- `memory`: the server's resident memory, started on a store whose node stream holds
  `--tiny` one-byte chunks on one subject, then also another node's as many each on a
  subject of its own (what a node can make up): the cost per message that
  NODE_LOG_MAX_MSGS bounds.

    uv run python benchmarks/bounds/bench_bounds.py                 # ~3-5 min here
    uv run python benchmarks/bounds/bench_bounds.py --max-gib 0.25  # a quick look

Results: `results/bounds.json` and a markdown table on stdout (README.md: how to read it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import psutil
from gpufleet_bus.streams import (
    NODE_LOG_MAX_BYTES,
    NODE_LOG_MAX_MSGS,
    REPORTS_PER_SUBJECT,
    NodeLogLimits,
    ensure_node_logs,
    ensure_streams,
)
from gpufleet_contracts import subjects
from gpufleet_devstack import NatsServer
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

HERE = Path(__file__).resolve().parent
MIB = 1024**2
OLD_LOGS_MAX_BYTES = 2 * 1024**3  # the shared stream of the release before
INFLIGHT = 512


async def publish_many(
    nc: Client, messages: Callable[[int], tuple[str, bytes]], count: int
) -> dict[str, Any]:
    """`count` JetStream publishes, INFLIGHT at a time: acked, refused (by reason), seconds."""
    js = nc.jetstream(timeout=30)
    acked, refused = 0, {}
    started = time.perf_counter()

    async def one(n: int) -> None:
        nonlocal acked
        subject, data = messages(n)
        try:
            await js.publish(subject, data, headers={"Nats-Msg-Id": uuid.uuid4().hex})
        except nats.js.errors.APIError as exc:
            why = str(exc.description)
            refused[why] = refused.get(why, 0) + 1
        else:
            acked += 1

    for i in range(0, count, INFLIGHT):
        await asyncio.gather(*(one(n) for n in range(i, min(count, i + INFLIGHT))))
    return {"acked": acked, "refused": refused, "seconds": round(time.perf_counter() - started, 2)}


async def state(js: Any, stream: str) -> dict[str, int]:
    info = await js.stream_info(stream)
    return {
        "messages": int(info.state.messages),
        "bytes": int(info.state.bytes),
        "first_seq": int(info.state.first_seq),
    }


async def still_there(js: Any, stream: str, subject: str) -> bool:
    try:
        await js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def with_server(root: Path, name: str, fn: Callable[..., Awaitable[Any]]) -> Any:
    server = NatsServer(root / name / "store", config="max_control_line: 32768\n")
    server.start()
    try:
        admin = await nats.connect(server.url, **server.admin())
        flooder = await nats.connect(server.url, **server.client(server.creds("node", "flooder")))
        victim = await nats.connect(server.url, **server.client(server.creds("node", "victim")))
        try:
            return await fn(server, admin, flooder, victim)
        finally:
            for nc in (flooder, victim, admin):
                await nc.close()
    finally:
        server.stop()
        shutil.rmtree(root / name, ignore_errors=True)


def chunks(chunk: bytes) -> Callable[[int], tuple[str, bytes]]:
    """The flood: each chunk under a job id of its own (what no per-subject limit bounds)."""
    return lambda n: (subjects.log("flooder", f"made-up-{n}", 0), chunk)


def reports(n: int) -> tuple[str, bytes]:
    return f"{subjects.EVENTS}.worker.finished.flooder", b'{"forged": %d}' % n


async def old(
    a: argparse.Namespace, server: NatsServer, admin: Client, flooder: Client, victim: Client
) -> dict[str, Any]:
    js = admin.jetstream(timeout=30)
    await js.add_stream(
        StreamConfig(name=subjects.STREAM_EVENTS, subjects=[f"{subjects.EVENTS}.>"],
                     storage=StorageType.FILE, max_age=30 * 86400, deny_delete=True,
                     deny_purge=True)
    )  # fmt: skip
    await js.add_stream(
        StreamConfig(name=subjects.STREAM_LOGS, subjects=[f"{subjects.LOGS}.>"],
                     storage=StorageType.FILE, max_age=14 * 86400, max_bytes=OLD_LOGS_MAX_BYTES,
                     discard=DiscardPolicy.OLD, deny_delete=True, deny_purge=True)
    )  # fmt: skip
    mine = subjects.log("victim", "victims-job", 0)
    await victim.jetstream().publish(mine, b"the victim's line\n")
    chunk = b"x" * (a.chunk_kib * 1024)
    limit = int(a.max_gib * 1024**3) // len(chunk)
    sent, rounds, seconds = 0, [], 0.0
    step = max(INFLIGHT, int(OLD_LOGS_MAX_BYTES * 0.1) // len(chunk))  # 10 % of the stream
    while sent < limit:
        out = await publish_many(
            flooder, lambda n, s=sent: chunks(chunk)(s + n), min(step, limit - sent)
        )
        sent += out["acked"] + sum(out["refused"].values())
        seconds += out["seconds"]
        rounds.append(out)
        if not await still_there(js, subjects.STREAM_LOGS, mine):
            break
    evicted = not await still_there(js, subjects.STREAM_LOGS, mine)
    events_before = await state(js, subjects.STREAM_EVENTS)
    rep = await publish_many(flooder, reports, a.reports)
    events_after = await state(js, subjects.STREAM_EVENTS)
    return {
        "logs": {
            "chunk_bytes": len(chunk),
            "sent_messages": sent,
            "sent_mib": round(sent * len(chunk) / MIB, 1),
            "seconds": round(seconds, 1),
            "mib_per_s": round(sent * len(chunk) / MIB / max(seconds, 1e-9), 1),
            "victims_chunk_evicted": evicted,
            "stream": await state(js, subjects.STREAM_LOGS),
        },
        "reports": {
            "sent": a.reports,
            **rep,
            "history_grew_by": events_after["messages"] - events_before["messages"],
            "history_bytes_grew_by": events_after["bytes"] - events_before["bytes"],
        },
        "_sent": sent,
    }


async def new(
    a: argparse.Namespace,
    sent: int,
    server: NatsServer,
    admin: Client,
    flooder: Client,
    victim: Client,
) -> dict[str, Any]:
    js = admin.jetstream(timeout=30)
    await ensure_streams(js)
    for minion in ("victim", "flooder"):
        await ensure_node_logs(js, minion)
    mine = subjects.log("victim", "victims-job", 0)
    await victim.jetstream().publish(mine, b"the victim's line\n")
    victim_before = await state(js, subjects.node_logs_stream("victim"))
    chunk = b"x" * (a.chunk_kib * 1024)
    out = await publish_many(flooder, chunks(chunk), sent)
    events_before = await state(js, subjects.STREAM_EVENTS)
    rep = await publish_many(flooder, reports, a.reports)
    events_after = await state(js, subjects.STREAM_EVENTS)
    return {
        "logs": {
            "chunk_bytes": len(chunk),
            "sent_messages": sent,
            "sent_mib": round(sent * len(chunk) / MIB, 1),
            **{k: out[k] for k in ("acked", "refused", "seconds")},
            "mib_per_s": round(sent * len(chunk) / MIB / max(out["seconds"], 1e-9), 1),
            "flooders_stream": await state(js, subjects.node_logs_stream("flooder")),
            "node_budget": {"max_bytes": NODE_LOG_MAX_BYTES, "max_msgs": NODE_LOG_MAX_MSGS},
            "victims_stream_unchanged": (
                await state(js, subjects.node_logs_stream("victim")) == victim_before
            ),
            "victims_chunk_there": await still_there(js, subjects.node_logs_stream("victim"), mine),
        },
        "reports": {
            "sent": a.reports,
            **rep,
            "queued": (await state(js, subjects.STREAM_REPORTS))["messages"],
            "per_subject_cap": REPORTS_PER_SUBJECT,
            "history_grew_by": events_after["messages"] - events_before["messages"],
        },
    }


async def memory(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The server's resident memory once started on a store that holds, in one node's
    stream, `--tiny` one-byte chunks on one subject, then also another node's as many, each
    on a subject of its own (what a node can make up): what holding them costs, without the
    garbage of writing them (measured `--settle-s` after each start)."""
    server = NatsServer(root / "memory" / "store", config="max_control_line: 32768\n")
    limits = NodeLogLimits(max_msgs=a.tiny)

    async def fill(minion: str, subject_of: Callable[[int], str]) -> dict[str, Any]:
        nc = await nats.connect(server.url, **server.client(server.creds("node", minion)))
        try:
            return await publish_many(nc, lambda n: (subject_of(n), b"."), a.tiny)
        finally:
            await nc.close()

    async def rss() -> float:
        server.start()
        await asyncio.sleep(a.settle_s)
        return psutil.Process(server.pid).memory_info().rss / MIB

    out: dict[str, Any] = {"messages": a.tiny}
    try:
        server.start()
        admin = await nats.connect(server.url, **server.admin())
        js = admin.jetstream(timeout=30)
        await ensure_streams(js)
        for minion in ("one", "many"):
            await ensure_node_logs(js, minion, limits)
        await admin.close()
        server.stop()
        empty = await rss()
        filled = await fill("one", lambda n: subjects.log("one", "one-job", 0))
        server.stop()
        one = await rss()
        made_up = await fill("many", lambda n: subjects.log("many", f"made-up-{n}", 0))
        server.stop()
        many = await rss()
    finally:
        server.stop()
        shutil.rmtree(root / "memory", ignore_errors=True)
    out.update(
        rss_empty_mib=round(empty, 1),
        one_subject={
            "acked": filled["acked"],
            "rss_grew_mib": round(one - empty, 1),
            "bytes_per_message": round((one - empty) * MIB / a.tiny),
        },
        a_subject_each={
            "acked": made_up["acked"],
            "rss_grew_mib": round(many - one, 1),
            "bytes_per_message": round((many - one) * MIB / a.tiny),
        },
    )
    return out


def table(result: dict[str, Any]) -> str:
    o, n, m = result["old"], result["new"], result["memory"]
    ol, nl = o["logs"], n["logs"]
    lines = [
        f"Flood from one node: {ol['sent_messages']} chunks of {ol['chunk_bytes'] // 1024} KiB "
        f"({ol['sent_mib']} MiB) under made-up job ids; {o['reports']['sent']} reports on its "
        "own subject.",
        "",
        "| | before (one 2 GiB log stream, reports in the history) "
        "| now (a stream per node, REPORTS) |",
        "|---|---|---|",
        f"| the victim node's log | {'pushed out' if ol['victims_chunk_evicted'] else 'kept'} "
        f"| {'kept' if nl['victims_chunk_there'] and nl['victims_stream_unchanged'] else 'LOST'} |",
        f"| the flooder's logs stored | {ol['stream']['bytes'] / MIB:.0f} MiB in the shared stream "
        f"| {nl['flooders_stream']['bytes'] / MIB:.0f} MiB, {nl['flooders_stream']['messages']} "
        f"messages (its budget {NODE_LOG_MAX_BYTES // MIB} MiB, {NODE_LOG_MAX_MSGS}) |",
        f"| flood rate | {ol['mib_per_s']} MiB/s | {nl['mib_per_s']} MiB/s |",
        f"| reports stored | {o['reports']['acked']} in the history "
        f"(+{o['reports']['history_bytes_grew_by'] / MIB:.1f} MiB, 30 days) "
        f"| {n['reports']['queued']} queued until read, {sum(n['reports']['refused'].values())} "
        f"refused; history +{n['reports']['history_grew_by']} |",
        "",
        f"Server memory for {m['messages']} one-byte chunks in a node's stream: on one subject "
        f"+{m['one_subject']['rss_grew_mib']} MiB ({m['one_subject']['bytes_per_message']} B "
        f"each); each on a subject of its own +{m['a_subject_each']['rss_grew_mib']} MiB "
        f"({m['a_subject_each']['bytes_per_message']} B each).",
    ]
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chunk-kib", type=int, default=8)
    ap.add_argument("--max-gib", type=float, default=2.5, help="old: give up after this much")
    ap.add_argument("--reports", type=int, default=20_000)
    ap.add_argument("--tiny", type=int, default=NODE_LOG_MAX_MSGS)
    ap.add_argument("--settle-s", type=float, default=8.0, help="memory: wait, then measure")
    ap.add_argument("--only", choices=("all", "memory"), default="all")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "bounds.json")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-bounds-"))
    try:
        result: dict[str, Any] = {
            "settings": {
                "chunk_kib": a.chunk_kib, "max_gib": a.max_gib, "reports": a.reports,
                "tiny": a.tiny, "settle_s": a.settle_s, "cpus": psutil.cpu_count(),
                "machine": platform.machine(),
            },
        }  # fmt: skip
        if a.only == "all":
            result["old"] = await with_server(root, "old", lambda *s: old(a, *s))
            sent = result["old"].pop("_sent")
            result["new"] = await with_server(root, "new", lambda *s: new(a, sent, *s))
        result["memory"] = await memory(a, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result) if "old" in result else json.dumps(result["memory"], indent=2))


if __name__ == "__main__":
    asyncio.run(main())
