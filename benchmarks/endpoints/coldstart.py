"""The cold start of a route endpoint through the running system (bench_endpoints.py
`cold`): nats-server, MongoDB, every service of `just up` and one node agent with podman
(benchmarks/fleetstack.py), the model code served by a web server of the benchmark's (a
`web` source, as tests/e2e/test_endpoints.py has it).

Each run: SubmitJob as the CLI sends it (from this process, a user of the node's owner
account), CreateEndpointKey, then a POST through the job's URL at once and again after each
404 (the job not on the node yet) until one is answered (held by the proxy while the worker
starts); the worker's phases as `gpufleet job show --json` gives them; the job cancelled and
its worker's end awaited before the next run. The first run warms the node (its imports,
the base image checked); the runs after it are the recorded ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from gpufleet_cli.client import request_headers
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import CancelJob, JobSpec, SubmitJob
from gpufleet_contracts.serving import CreateEndpointKey
from gpufleet_devstack import identities
from gpufleet_devstack.processes import free_port
from gpufleet_devstack.storage.archives import tar_gz
from gpufleet_devstack.storage.web import WebServer
from gpufleet_node_agent.baseimage import BASE_IMAGE, default_containers_conf, ensure_image
from gpufleet_node_agent.baseimage import podman_env as make_podman_env

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the shared fleetstack

from fleetstack import MODULES, AgentSpec, Fleet, Watch, connect_admin, connect_user  # noqa: E402

ACCOUNT = identities.LOCAL_ACCOUNT
MINION = "bench-ep"
CLI = str(Path(sys.executable).parent / "gpufleet")
MODEL = b"""\
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


async def ask(nc: Any, base: str, body: bytes, ce_type: str | None = None) -> dict[str, Any]:
    """An account request as the CLI makes it; a refusal raised."""
    msg = await nc.request(
        subjects.as_account(base, ACCOUNT), body, timeout=30, headers=request_headers(base, ce_type)
    )
    data: dict[str, Any] = json.loads(msg.data)
    if data.get("ok") is False:
        raise RuntimeError(f"{base}: {data}")
    return data


class Bench:
    def __init__(self, fleet: Fleet, proxy_port: int, model_url: str) -> None:
        self.fleet = fleet
        self.proxy_port = proxy_port
        self.model_url = model_url
        self.cli_env = {
            **fleet.base_env(),
            "GPUFLEET_NATS_CREDS": str(identities.user_creds(fleet.nats, ACCOUNT, "bench")),
            "GPUFLEET_CONFIG_DIR": str(fleet.root / "cli-config"),
        }

    def spec(self, name: str) -> JobSpec:
        return JobSpec.model_validate(
            {
                "name": name,
                "type": "endpoint",
                "gpu_types": ["RTX 3090"],
                "gpu_count": 1,
                "max_price": "1.0",
                "model": {"source": "web", "path": self.model_url},
                "endpoint": {"routes": ROUTES},
            }
        )

    def job_show(self, job_id: str) -> tuple[dict[str, Any], float]:
        """`gpufleet job show --json` and how long the CLI took."""
        t = time.perf_counter()
        done = subprocess.run(
            [CLI, "job", "show", job_id, "--json"],
            env=self.cli_env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return json.loads(done.stdout), time.perf_counter() - t

    async def first_200(self, job_id: str, key: str, limit_s: float = 180) -> dict[str, Any]:
        """POST until answered 200: 404 while the job is not on the node, then held."""
        headers = {
            "host": f"{job_id}.localhost:{self.proxy_port}",
            "authorization": f"Bearer {key}",
        }
        seen: dict[str, Any] = {"not_found": 0, "unavailable": 0, "last_404": None}
        deadline = time.perf_counter() + limit_s
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.proxy_port}", headers=headers, timeout=limit_s
        ) as c:
            while time.perf_counter() < deadline:
                r = await c.post("/add", json={"a": 1, "b": 2})
                if r.status_code == 200:
                    assert r.json() == {"sum": 3}, r.text
                    seen["at"] = time.perf_counter()
                    return seen
                if r.status_code == 404:
                    seen["not_found"] += 1
                    seen["last_404"] = time.perf_counter()
                    await asyncio.sleep(0.02)
                elif r.status_code == 503:
                    seen["unavailable"] += 1
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"{job_id}: {r.status_code} {r.text[:300]}")
        raise TimeoutError(f"{job_id}: no 200 in {limit_s} s")

    async def one(self, user: Any, watch: Watch, name: str) -> dict[str, Any]:
        msg = SubmitJob(spec=self.spec(name), request_id=uuid.uuid4().hex)
        t0 = time.perf_counter()
        for _ in range(120):  # the scheduler may not know the node yet (the first run)
            try:
                job_id = str((await ask(user, msg.SUBJECT, msg.to_bytes(), msg.TYPE))["id"])
                break
            except RuntimeError:
                await asyncio.sleep(0.5)
                t0 = time.perf_counter()
        t_submitted = time.perf_counter()
        created = await ask(
            user, CreateEndpointKey.SUBJECT, CreateEndpointKey(job_id=job_id).to_bytes()
        )
        t_key = time.perf_counter()
        seen = await self.first_200(job_id, str(created["key"]))
        shown: dict[str, Any] = {}
        cli_s: list[float] = []
        for _ in range(50):  # the node's EndpointReady reaches the scheduler a moment later
            shown, s = await asyncio.to_thread(self.job_show, job_id)
            cli_s.append(s)
            if "first_answer" in (shown.get("cold_start") or {}):
                break
            await asyncio.sleep(0.3)
        at = watch.at.get(job_id, {})
        cancel = CancelJob(job_id=job_id)
        await ask(user, cancel.SUBJECT, cancel.to_bytes(), cancel.TYPE)
        for _ in range(600):  # its worker's end, before the next run (60 s at most)
            if "worker_finished" in watch.at.get(job_id, {}):
                break
            await asyncio.sleep(0.1)

        def since(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 3)

        return {
            "job_id": job_id,
            "client_s": {  # this process's clock, from the SubmitJob request sent
                "submitted": since(t_submitted),
                "key_created": since(t_key),
                "placed_event": since(at.get("placed")),
                "started_event": since(at.get("started")),
                "running_event": since(at.get("running")),
                "last_404": since(seen["last_404"]),
                "first_200": since(seen["at"]),
            },
            "requests_404": seen["not_found"],
            "requests_503": seen["unavailable"],
            "phases_after_placed_s": shown.get("cold_start"),
            "state": shown.get("state"),
            "cli_job_show_s": [round(s, 2) for s in cli_s],
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    podman_env = make_podman_env(default_containers_conf())
    t = time.perf_counter()
    error = await ensure_image(BASE_IMAGE, podman_env)  # built now if the store has none
    if error:
        raise RuntimeError(error)
    result["base_image"] = {"name": BASE_IMAGE, "ensure_s": round(time.perf_counter() - t, 2)}
    proxy_port = free_port()
    root = Path(tempfile.mkdtemp(prefix="gfb-cold-", dir="/tmp"))
    (root / "models").mkdir()
    (root / "models" / "calc.tar.gz").write_bytes(tar_gz({"calc.py": MODEL}))
    files = WebServer(root / "models")
    files.start()
    fleet = Fleet(root)
    try:
        t = time.perf_counter()
        await fleet.start_servers()
        fleet.start_services(list(MODULES))
        await fleet.wait_services_up()
        env = {
            "GPUFLEET_PROXY_LISTEN": f"127.0.0.1:{proxy_port}",
            "GPUFLEET_STOP_WORKERS_ON_EXIT": "true",
            "GPUFLEET_STAGING_ALLOW": files.address,
        }
        await fleet.start_agents([AgentSpec(MINION, ACCOUNT, env)])
        nc_admin = await connect_admin(fleet)
        watch = Watch()
        await watch.subscribe(nc_admin)
        await fleet.wait_nodes_up(nc_admin, [MINION])
        user = await connect_user(fleet, ACCOUNT)
        result["system_start_s"] = round(time.perf_counter() - t, 1)
        bench = Bench(fleet, proxy_port, files.url("calc.tar.gz"))
        runs = []
        for i in range(1 + args.cold_runs):
            out = await bench.one(user, watch, f"cold{i}")
            out["warm_up"] = i == 0
            runs.append(out)
            print(f"cold start {i}: {json.dumps(out)}", file=sys.stderr, flush=True)
        result["runs"] = runs
        timed = [r for r in runs if not r["warm_up"]]
        firsts = sorted(r["client_s"]["first_200"] for r in timed)
        result["submit_to_first_200_s"] = {
            "runs": firsts,
            "median": firsts[len(firsts) // 2] if firsts else None,
            "goal_s": 3.0,
        }
        await nc_admin.close()
        await user.close()
    finally:
        fleet.stop()
        files.stop()
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return result


def cold_start(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(run(args))


if __name__ == "__main__":  # alone: python coldstart.py [--cold-runs N] [--keep]
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--cold-runs", type=int, default=5)
    p.add_argument("--keep", action="store_true", help="keep the run directory (its logs)")
    print(json.dumps(cold_start(p.parse_args()), indent=1))
