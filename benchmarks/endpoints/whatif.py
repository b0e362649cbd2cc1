"""What the proxy's overhead would be with its forwarding done otherwise: the node agent's
ProxyApp with its `forward` replaced, served as proxyproc.py serves it, against the same route
server, in the same run as the proxy as it is. Not the proxy's code, and not complete (no
streamed or chunked bodies, no timeouts, no error answers): a way to size a fix before
making it (README, "Where the proxy's time goes").

- `as_is`: ProxyApp unchanged (httpcore's pool, the answer relayed by StreamingResponse).
- `buffered`: httpcore as now, the answer read whole and sent as one Response: without
  StreamingResponse's task group (uvicorn speaks ASGI spec 2.3, so Starlette listens for a
  disconnect in a task of its own for every streamed answer).
- `lean`: no httpcore: keep-alive asyncio streams to the worker's socket (a connection the
  worker closed is known to asyncio, no poll needed), the request written in one write, the
  answer read by its Content-Length and sent as one Response.

    uv run python benchmarks/endpoints/whatif.py --requests 4000 --rounds 3 --strace

`--strace`: a run more of each variant under `strace -c`, its system calls per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpcore
from gpufleet_node_agent.proxy import upstream
from gpufleet_node_agent.proxy.app import ProxyApp
from gpufleet_node_agent.proxy.served import Served
from starlette.requests import Request
from starlette.responses import Response

HERE = Path(__file__).resolve().parent
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Buffered(ProxyApp):
    async def forward(self, request: Request, served: Served) -> Response:
        target = request.scope.get("raw_path") or request.url.path.encode()
        body = await request.body()
        outgoing = httpcore.Request(
            request.method.encode(),
            httpcore.URL(scheme=b"http", host=b"worker", port=None, target=target),
            headers=self.headers(request, served),
            content=body,
            extensions={"timeout": dict(upstream.TIMEOUTS)},
        )
        answer = await served.pool.handle_async_request(outgoing)
        try:
            data = await answer.aread()
        finally:
            await answer.aclose()
        self.endpoints.answered(served)
        served.meter.answered(answer.status)
        response = Response(data, status_code=answer.status)
        response.raw_headers = upstream.response_headers(answer.headers)
        return response


class Lean(ProxyApp):
    idle: list[Stream]

    async def _connection(self, served: Served) -> Stream:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof():
                return reader, writer
            writer.close()
        return await asyncio.open_unix_connection(served.socket)

    async def forward(self, request: Request, served: Served) -> Response:
        target = request.scope.get("raw_path") or request.url.path.encode()
        body = await request.body()
        headers = [(k, v) for k, v in self.headers(request, served) if k != b"content-length"]
        head = b"%s %s HTTP/1.1\r\n" % (request.method.encode(), target)
        head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
        head += b"content-length: %d\r\n\r\n" % len(body)
        reader, writer = await self._connection(served)
        writer.write(head + body)
        lines = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
        answered: list[tuple[bytes, bytes]] = []
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            answered.append((name, value))
            if name == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self.idle.append((reader, writer))
        status = int(lines[0][9:12])
        self.endpoints.answered(served)
        served.meter.answered(status)
        response = Response(data, status_code=status)
        response.raw_headers = upstream.response_headers(answered)
        return response


def serve(variant: str, argv: list[str]) -> None:
    """proxyproc.py's proxy, with the variant's app."""
    import proxyproc

    app: type[ProxyApp] = {"as_is": ProxyApp, "buffered": Buffered, "lean": Lean}[variant]
    Lean.idle = []
    proxyproc.main(app, argv)


def syscalls(target: list[str], pid: int, c: int, n: int) -> dict[str, float]:
    """One more run with `strace -c` on the proxy: its system calls per request, by name."""
    import bench_endpoints as bench

    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out.name])
        time.sleep(1.0)  # attached
        try:
            bench.load(target, {"proxy": pid}, c, n, 0)
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        calls: dict[str, int] = {}
        for line in out.read().splitlines():  # % time, seconds, usecs/call, calls, [errors], name
            f = line.split()
            if len(f) >= 5 and f[3].isdigit() and f[-1] != "total":
                calls[f[-1]] = int(f[3])
    ranked = sorted(calls.items(), key=lambda kv: -kv[1])
    return {"total": round(sum(calls.values()) / n, 1)} | {
        k: round(v / n, 2) for k, v in ranked[:8]
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    import bench_endpoints as bench

    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": bench.machine(),
        "tree": bench.tree(),
    }
    work = Path(tempfile.mkdtemp(prefix="gfb-", dir="/tmp"))
    key = bench.new_key()
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    traced: dict[tuple[str, int], dict[str, float]] = {}
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        with bench.route_servers(work) as s:
            server = s["pids"]["server_uds"]
            for variant in ("as_is", "buffered", "lean"):
                port = bench.free_port()
                argv = [sys.executable, __file__, "--serve", variant, "--root", str(work)]
                argv += ["--job", bench.JOB, "--listen", f"127.0.0.1:{port}"]
                argv += ["--template", f"http://{{job}}.localhost:{port}"]
                p = subprocess.Popen(argv, stdout=subprocess.PIPE)
                assert p.stdout is not None
                if p.stdout.readline().strip() != b"ready":
                    raise RuntimeError(f"{variant} did not start")
                procs[variant] = (p, port)
            targets = {"direct_uds": (["--uds", s["sock"]], {"server": server})}
            for variant, (p, port) in procs.items():
                host = f"{bench.JOB}.localhost:{port}"
                target = ["--tcp", f"127.0.0.1:{port}", "--host", host, "--key", key]
                targets[variant] = (target, {"server": server, "proxy": p.pid})
            for _ in range(args.rounds):
                for c in args.concurrency:
                    for name, (target, watch) in targets.items():
                        out = bench.load(target, watch, c, args.requests, args.warmup)
                        runs.setdefault((name, c), []).append(out)
            if args.strace:
                for variant, (p, _) in procs.items():
                    target, _ = targets[variant]
                    for c in args.concurrency:
                        traced[(variant, c)] = syscalls(target, p.pid, c, 2000)
    finally:
        for p, _ in procs.values():
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    for c in args.concurrency:
        row = {name: bench.summary(runs[(name, c)]) for name in targets}
        d = row["direct_uds"]
        for name in procs:
            row[name]["vs_direct_uds"] = {
                "added_p50_ms": round(row[name]["p50_ms"] - d["p50_ms"], 3),
                "req_per_s_ratio": round(row[name]["req_per_s"] / d["req_per_s"], 2),
            }
            if (name, c) in traced:
                row[name]["syscalls_per_request"] = traced[(name, c)]
        result[f"c{c}"] = row
    result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[1, 16])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--strace", action="store_true", help="a run more under strace -c")
    p.add_argument("--out", type=Path, default=HERE / "results" / "whatif.json")
    args = p.parse_args()
    result = compare(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
