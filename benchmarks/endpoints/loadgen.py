"""The benchmark's client, in a process of its own: `--concurrency` keep-alive HTTP/1.1
connections (a raw asyncio client on uvloop: a few tens of µs of CPU per request, where
httpx takes several hundred) to a unix socket or a TCP port, each sending the same POST one
after another; prints one JSON line: every timed request's latency, the wall time, and the CPU
that this process and the `--watch` processes used during the timed part.

    python loadgen.py --uds /tmp/x/serve/http.sock --concurrency 16 --requests 4000
    python loadgen.py --tcp 127.0.0.1:8480 --host j1.localhost:8480 --key gfk_... ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

import uvloop

TICKS = os.sysconf("SC_CLK_TCK")
BODY = b'{"a": 1, "b": 2}'
EXPECTED = b'{"sum":3}'


def proc_cpu(pid: int) -> float:
    """utime + stime of `pid`, seconds (/proc: its threads included)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rindex(")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / TICKS


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def request_bytes(path: str, host: str, key: str | None) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(BODY)}",
    ]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + BODY


class BadAnswer(Exception):
    pass


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response's status and body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = -1
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if length >= 0:
        return status, await reader.readexactly(length)
    if not chunked:
        raise BadAnswer(f"no length: {head!r}")
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, body
        body += chunk[:-2]


async def connect(args: argparse.Namespace) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if args.uds:
        return await asyncio.open_unix_connection(args.uds)
    host, _, port = args.tcp.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def run(args: argparse.Namespace) -> dict[str, object]:
    request = request_bytes(args.path, args.host, args.key)
    conns = [await connect(args) for _ in range(args.concurrency)]
    per_conn = args.requests // args.concurrency
    latencies: list[float] = []
    errors: list[str] = []

    async def loop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int, keep: bool
    ) -> None:
        clock = time.perf_counter
        for _ in range(n):
            t = clock()
            writer.write(request)
            status, body = await answer(reader)
            if keep:
                latencies.append(clock() - t)
            if status != 200 or body != EXPECTED:
                errors.append(f"{status} {body[:200]!r}")

    await asyncio.gather(*(loop(r, w, args.warmup, False) for r, w in conns))
    watched = [int(p) for p in args.watch.split(",") if p] if args.watch else []
    cpu0 = [proc_cpu(p) for p in watched]
    own0, t0 = own_cpu(), time.perf_counter()
    await asyncio.gather(*(loop(r, w, per_conn, True) for r, w in conns))
    wall = time.perf_counter() - t0
    own1 = own_cpu()
    cpu1 = [proc_cpu(p) for p in watched]
    for _, w in conns:
        w.close()
    return {
        "concurrency": args.concurrency,
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "wall_s": wall,
        "client_cpu_s": own1 - own0,
        "watched_cpu_s": {str(p): b - a for p, a, b in zip(watched, cpu0, cpu1, strict=True)},
        "latencies_s": latencies,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="a unix socket")
    where.add_argument("--tcp", help="host:port")
    p.add_argument("--host", default="localhost", help="the Host header")
    p.add_argument("--key", default=None, help="sent as Authorization: Bearer KEY")
    p.add_argument("--path", default="/add")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=2000, help="timed requests, in all")
    p.add_argument("--warmup", type=int, default=100, help="untimed requests per connection")
    p.add_argument("--watch", default="", help="pids whose CPU to count, comma-separated")
    p.add_argument("--out", type=Path, default=None, help="the JSON to this file, not stdout")
    args = p.parse_args()
    result = uvloop.run(run(args))
    if args.out is not None:  # every latency: larger than a pipe's buffer
        args.out.write_text(json.dumps(result))
    else:
        sys.stdout.write(json.dumps(result) + "\n")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
