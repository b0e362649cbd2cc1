"""Endpoint benchmark (issue 28): the node's proxy against the route server reached directly,
in the same run; the cold start of a route endpoint whose image is cached, phase by phase.

    uv run --with py-spy python benchmarks/endpoints/bench_endpoints.py --profile  # recorded
    uv run python benchmarks/endpoints/bench_endpoints.py --only proxy --requests 500 \
        --rounds 1 --out /tmp/quick.json                                          # a quick look

Each figure (benchmarks/endpoints/README.md):
- `proxy`: gpufleet's route server (`python -m gpufleet_endpoint`, one POST route whose
  function adds two integers) on a unix socket, and the node agent's proxy (proxy/: ProxyApp
  served by ProxyServer, the verdict on the key cached `open`) in front of it on TCP, each a
  process of its own, and the client in a third (loadgen.py: keep-alive HTTP/1.1, `c`
  connections each sending the same POST one after another). Targets: `direct_uds` (the
  server's socket, as the proxy reaches it), `direct_tcp` (a second server process of the
  same code on 127.0.0.1, the fair comparison for a client on TCP), `proxy` (through the
  proxy, by the job's Host and a key). Rounds interleave the targets; latencies are pooled
  over the rounds, req/s is the median round's. CPU: each process's user+system time per
  request during the timed part (/proc).
- `cold`: the running system (nats, MongoDB, every service, one node agent with podman, as
  tests/e2e/test_endpoints.py starts it): a route endpoint submitted once to warm the
  node's caches (the base image built, if it was not), then `--cold-runs` more, each timed:
  submit (the SubmitJob request as the CLI sends it, from this process) -> key created ->
  the first 200 of a POST through the URL, the client asking from the moment it has the key
  (404 while the job is not on the node yet, held by the proxy once it is); the worker's
  phases as `gpufleet job show --json` gives them (seconds after placement).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
JOB = "jbench0000001"
MODEL = """\
def add(a, b):
    return {"sum": a + b}
"""
ROUTES = [
    {
        "verb": "POST",
        "path": "/add",
        "file": "calc.py",
        "function": "add",
        "body": [{"name": "a", "type": "integer"}, {"name": "b", "type": "integer"}],
    }
]
HEALTH = "/__gpufleet/health"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pct(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def tree() -> dict[str, Any]:
    """The commit measured, and what of the measured code differed from it (the working tree
    of a shared checkout)."""

    def git(*argv: str) -> str:
        done = subprocess.run(
            ["git", *argv], cwd=HERE.parent.parent, capture_output=True, text=True, check=False
        )
        return done.stdout.rstrip()

    paths = ["services/node-agent/src/gpufleet_node_agent/proxy", "libs/endpoint"]
    changed = git("status", "--short", "--", *paths)
    return {"commit": git("rev-parse", "HEAD"), "changed": changed.splitlines()}


def new_key() -> str:
    return f"gfk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


# --- processes ---------------------------------------------------------------------------


class Proc:
    """A child process of the benchmark's, stopped by its pid."""

    def __init__(self, name: str, argv: list[str], log: Path, **kw: Any) -> None:
        self.name = name
        self.log = log.open("wb")
        self.p = subprocess.Popen(argv, stdout=kw.pop("stdout", self.log), stderr=self.log, **kw)

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def wait_answering(client: httpx.Client, what: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if client.get(HEALTH).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} does not answer")
        time.sleep(0.05)


@contextlib.contextmanager
def route_servers(work: Path) -> Iterator[dict[str, Any]]:
    """The route server on the worker's socket (for the proxy and direct_uds), a second one on
    TCP (direct_tcp), and the proxy; their pids and addresses."""
    models = work / "models"
    models.mkdir()
    (models / "calc.py").write_text(MODEL)
    routes = work / "routes.json"
    routes.write_text(json.dumps(ROUTES))
    serve_dir = work / "p1" / "serve"
    serve_dir.mkdir(parents=True)
    sock = serve_dir / "http.sock"
    tcp_port, proxy_port = free_port(), free_port()
    server = [sys.executable, "-m", "gpufleet_endpoint", "--routes", str(routes)]
    server += ["--models", str(models)]
    procs: list[Proc] = []
    try:
        uds = Proc("server_uds", [*server, "--uds", str(sock)], work / "server_uds.log")
        procs.append(uds)
        tcp = Proc(
            "server_tcp",
            [*server, "--host", "127.0.0.1", "--port", str(tcp_port)],
            work / "server_tcp.log",
        )
        procs.append(tcp)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://w") as c:
            wait_answering(c, "the route server on its socket")
        with httpx.Client(base_url=f"http://127.0.0.1:{tcp_port}") as c:
            wait_answering(c, "the route server on TCP")
        template = f"http://{{job}}.localhost:{proxy_port}"
        proxy = Proc(
            "proxy",
            [
                *[sys.executable, str(HERE / "proxyproc.py"), "--root", str(work)],
                *["--job", JOB, "--listen", f"127.0.0.1:{proxy_port}", "--template", template],
            ],
            work / "proxy.log",
            stdout=subprocess.PIPE,
        )
        procs.append(proxy)
        assert proxy.p.stdout is not None
        if proxy.p.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the proxy did not start: {(work / 'proxy.log').read_text()}")
        yield {
            "sock": str(sock),
            "tcp": f"127.0.0.1:{tcp_port}",
            "proxy": f"127.0.0.1:{proxy_port}",
            "host": f"{JOB}.localhost:{proxy_port}",
            "pids": {p.name: p.pid for p in procs},
        }
    finally:
        for p in reversed(procs):
            p.stop()


# --- proxy overhead ----------------------------------------------------------------------


def load(target: list[str], watch: dict[str, int], c: int, n: int, warmup: int) -> dict[str, Any]:
    pids = ",".join(str(p) for p in watch.values())
    argv = [sys.executable, str(HERE / "loadgen.py"), *target]
    argv += ["--concurrency", str(c), "--requests", str(n), "--warmup", str(warmup)]
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        argv += ["--watch", pids, "--out", f.name]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        text = f.read()
    if not text:
        raise RuntimeError(f"loadgen failed: {done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(text)
    if out["errors"]:
        raise RuntimeError(f"{target}: {out['errors']} bad answers: {out['first_errors']}")
    by_pid = out.pop("watched_cpu_s")
    out["cpu_s"] = {name: by_pid[str(pid)] for name, pid in watch.items()}
    out["cpu_s"]["client"] = out.pop("client_cpu_s")
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = sorted(x * 1000 for r in runs for x in r["latencies_s"])
    n = len(lat)
    rates = sorted(r["requests"] / r["wall_s"] for r in runs)
    cpu = {k: sum(r["cpu_s"][k] for r in runs) for k in runs[0]["cpu_s"]}
    return {
        "requests": n,
        "p50_ms": round(pct(lat, 0.5), 3),
        "p90_ms": round(pct(lat, 0.9), 3),
        "p99_ms": round(pct(lat, 0.99), 3),
        "mean_ms": round(sum(lat) / n, 3),
        "req_per_s": round(statistics.median(rates), 1),
        "req_per_s_rounds": [round(r, 1) for r in rates],
        "cpu_us_per_request": {k: round(v / n * 1e6, 1) for k, v in cpu.items()},
    }


PACKAGES = (  # a frame's file -> what it is part of, first match (py-spy's short paths)
    ("gpufleet_node_agent/proxy/", "the proxy's own code (gpufleet_node_agent/proxy)"),
    ("gpufleet_", "gpufleet (other)"),
    ("starlette/", "starlette (Request, its refusals' JSONResponse)"),
    ("anyio/", "anyio"),
    ("uvicorn/", "uvicorn (httptools protocol)"),
    ("asyncio/", "asyncio event loop and transports"),
)


# Always on the proxy's stack, so left out of the inclusive ranking.
DRIVING = ("proxyproc.py", "asyncio/runners.py", "BaseEventLoop.run_")


def frame_of(frame: str) -> tuple[str, str]:
    """(`function (file)`, its package) of a py-spy frame `function (path:line)`."""
    name, _, where = frame.rpartition(" (")
    path = where.rsplit(":", 1)[0]
    package = next((label for prefix, label in PACKAGES if prefix in path), "other (stdlib, C)")
    return f"{name} ({path})", package


def spied(raw: Path, top: int = 30) -> dict[str, Any]:
    """py-spy's collapsed stacks: samples by the package of the frame running (self), and
    the functions most often on the stack (inclusive), in % of the samples."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [frame_of(f) for f in stack.split(";")]
        own[frames[-1][1]] = own.get(frames[-1][1], 0) + n
        for name in {f for f, _ in frames if not any(d in f for d in DRIVING)}:
            inclusive[name] = inclusive.get(name, 0) + n

    def pcts(counts: dict[str, int], k: int) -> dict[str, float]:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:k]
        return {name: round(100 * n / total, 1) for name, n in ranked}

    return {
        "samples": total,
        "self_by_package_pct": pcts(own, 20),
        "inclusive_pct": pcts(inclusive, top),
    }


def profile(target: list[str], pid: int, c: int, n: int, out: Path) -> dict[str, Any]:
    """One more run through the proxy with py-spy sampling it (200 Hz, its raw stacks kept
    in `out`)."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed: uv run --with py-spy python ...")
    argv = [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
    argv += ["--output", str(out), "--nonblocking"]
    recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attached
    try:
        load(target, {"proxy": pid}, c, n, 20)
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        recorder.wait(30)
    return spied(out)


def syscalls(target: list[str], pid: int, c: int, n: int) -> dict[str, float]:
    """One more run through the proxy with `strace -c` on it: its system calls per request,
    the most frequent by name."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out.name])
        time.sleep(1.0)  # attached
        try:
            load(target, {"proxy": pid}, c, n, 0)
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


def proxy_overhead(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="gfb-", dir="/tmp"))  # a socket's path: 108 bytes
    key = new_key()
    try:
        with route_servers(work) as s:
            pids = s["pids"]
            targets = {
                "direct_uds": (["--uds", s["sock"]], {"server": pids["server_uds"]}),
                "direct_tcp": (["--tcp", s["tcp"]], {"server": pids["server_tcp"]}),
                "proxy": (
                    ["--tcp", s["proxy"], "--host", s["host"], "--key", key],
                    {"server": pids["server_uds"], "proxy": pids["proxy"]},
                ),
            }
            runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
            profiles: dict[str, Any] = {}
            traced: dict[str, Any] = {}
            for r in range(args.rounds):
                for c in args.concurrency:
                    for name, (target, watch) in targets.items():
                        out = load(target, watch, c, args.requests, args.warmup)
                        runs.setdefault((name, c), []).append(out)
                        rate = out["requests"] / out["wall_s"]
                        print(f"round {r} c={c} {name}: {rate:.0f} req/s", file=sys.stderr)
            if args.profile:
                for c in args.concurrency:
                    raw = Path(tempfile.gettempdir()) / f"bench_endpoints_proxy_c{c}.pyspy"
                    target, _ = targets["proxy"]
                    profiles[f"c{c}"] = profile(target, pids["proxy"], c, args.requests, raw)
                    print(f"py-spy's stacks of the proxy at c={c}: {raw}", file=sys.stderr)
            if args.strace:
                target, _ = targets["proxy"]
                traced = {
                    f"c{c}": syscalls(target, pids["proxy"], c, 2000) for c in args.concurrency
                }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {}
    for c in args.concurrency:
        row = {name: summary(runs[(name, c)]) for name in targets}
        p = row["proxy"]
        for base in ("direct_uds", "direct_tcp"):
            d = row[base]
            # each round's ratio, the proxy's against the baseline's run just before it: on a
            # shared machine the load moves between rounds more than between the targets
            paired = sorted(
                (q["requests"] / q["wall_s"]) / (b["requests"] / b["wall_s"])
                for q, b in zip(runs[("proxy", c)], runs[(base, c)], strict=True)
            )
            row[f"proxy_vs_{base}"] = {
                "added_p50_ms": round(p["p50_ms"] - d["p50_ms"], 3),
                "added_p99_ms": round(p["p99_ms"] - d["p99_ms"], 3),
                "req_per_s_ratio": round(p["req_per_s"] / d["req_per_s"], 2),
                "req_per_s_ratio_by_round": [round(r, 2) for r in paired],
                "req_per_s_ratio_round_median": round(statistics.median(paired), 2),
            }
        result[f"c{c}"] = row
    if profiles:
        result["profile"] = profiles
    if traced:
        result["syscalls_per_request"] = traced
    return result


# --- main --------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--only", choices=["proxy", "cold"], default=None)
    p.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[1, 16])
    p.add_argument("--requests", type=int, default=4000, help="timed requests per target a round")
    p.add_argument("--warmup", type=int, default=50, help="untimed requests per connection")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold-runs", type=int, default=5, help="timed cold starts after the warm one")
    p.add_argument(
        "--profile", action="store_true", help="proxy: a run more with py-spy sampling it"
    )
    p.add_argument("--strace", action="store_true", help="proxy: a run more under strace -c")
    p.add_argument("--keep", action="store_true", help="cold: keep the run directory (logs)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "bench_endpoints.json")
    args = p.parse_args()
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(),
        "tree": tree(),
    }
    if args.only in (None, "proxy"):
        result["proxy"] = proxy_overhead(args)
    if args.only in (None, "cold"):
        from coldstart import cold_start  # the running system: only when asked

        result["cold"] = cold_start(args)
    result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
