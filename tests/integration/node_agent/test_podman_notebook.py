"""A notebook against real podman: its base environment with JupyterLab built (Debian's pip,
then jupyterlab's wheels from the package index, binary only), JupyterLab started on the
worker's socket in /opt/ml with the job's token, reached through the node's proxy: with the
token it answers (`/api`, `/lab`, a kernel over a websocket), without it the proxy answers
401 and Jupyter sees nothing.

The environment is built once per podman store; a later run finds
`localhost/gpufleet/env:py3.11-deep_learning-notebook` and builds nothing. To build it, the
wheels JupyterLab installs are fetched on the host (its pip, its certificates: a build
container trusts Debian's CAs only, which a TLS-inspecting proxy in front of the package
index fails) into a local index the build reaches, as the operator's
GPUFLEET_PACKAGE_INDEX_URL would be. Skipped, when it is to be built, where Debian's
archive, the package index or the host's pip cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gpufleet_contracts.jobs import StartWorker, WorkerState
from gpufleet_contracts.jobspec import BaseEnvironment
from gpufleet_contracts.serving import (
    NOTEBOOK_COMMAND,
    NOTEBOOK_HEALTH_PATH,
    NOTEBOOK_TOKEN_ENV,
    Serving,
)
from gpufleet_devstack.pyindex import image_python, wheels_index
from gpufleet_node_agent.baseimage import podman_env
from gpufleet_node_agent.builds import BuildConfig
from gpufleet_node_agent.environments import JUPYTERLAB
from gpufleet_node_agent.proxy.app import ProxyApp
from gpufleet_node_agent.proxy.auth import Verdicts
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.proxy.served import Endpoints
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.manager import WorkerManager
from gpufleet_node_agent.worker.workdir import LAUNCHED
from unit.node_agent.proxykit import listening, new_token
from websockets.asyncio.client import connect
from websockets.typing import Origin

from .podman_support import CONF, Broker, until_finished

TEMPLATE = UrlTemplate.parse("http://{job}.localhost:8480")
NOTEBOOK_ENV = "localhost/gpufleet/env:py3.11-deep_learning-notebook"


pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")


@pytest.fixture
def index_url(tmp_path_factory: pytest.TempPathFactory, image: str) -> Iterator[str | None]:
    """None when the notebook's environment is in podman's store already (nothing is built);
    else a local index of the wheels it installs, fetched by the host's pip for the base
    image's Python (bookworm's 3.11.2: some releases want a later 3.11)."""
    env = podman_env(CONF)
    if subprocess.run(["podman", "image", "exists", NOTEBOOK_ENV], env=env).returncode == 0:
        yield None
        return
    version = image_python(image, env)
    local = wheels_index(tmp_path_factory.mktemp("jupyter-index"), JUPYTERLAB, version)
    if isinstance(local, str):
        pytest.skip(local)
    try:
        yield local.url
    finally:
        local.stop()


async def nobody_asked(subject: str, body: bytes) -> bytes:
    raise AssertionError("a notebook's token is never the scheduler's to check")


async def test_jupyterlab_answers_through_the_proxy_with_its_token_only(
    tmp_path: Path, image: str, minion: str, index_url: str | None
) -> None:
    build = BuildConfig(index_url=index_url, timeout_s=900, build_dir=tmp_path / "builds")
    config = PodmanConfig(
        image=image, containers_conf=CONF, memory_mb=1024, cpus=1, stop_grace_s=2, build=build
    )
    runtime = PodmanRuntime(config, minion)
    runtime.node_gpus = 1
    m = WorkerManager(tmp_path / "state", minion, Broker(), gpu_indices=[0], runtime=runtime)
    endpoints = Endpoints(
        lambda: m.active.values(),
        minion_id=minion,
        publisher=None,
        template=TEMPLATE,
        uid=config.uid,
    )
    app = ProxyApp(endpoints, Verdicts(minion, nobody_asked), TEMPLATE, hold_s=240)
    token = new_token()
    placement = uuid.uuid4().hex
    job = f"nb{placement[:8]}"
    host = f"{job}.localhost:8480"
    cmd = StartWorker(
        minion_id=minion,
        job_id=job,
        job_name="nb",
        worker=0,
        command=list(NOTEBOOK_COMMAND),
        gpu_indices=[0],
        placement_id=placement,
        owner="acct-nb",
        creator="acct-nb",
        env={NOTEBOOK_TOKEN_ENV: token},
        base_environment=BaseEnvironment(python_version="3.11", framework="deep_learning"),
        serving=Serving(kind="notebook", health_path=NOTEBOOK_HEALTH_PATH),
    )
    probing = asyncio.create_task(endpoints.run())
    transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 5555))
    began = time.monotonic()
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url=f"http://{host}", timeout=300
        ) as c:
            assert m.start(cmd)
            r = await c.get("/lab")  # no token: the proxy's answer, at once
            assert r.status_code == 401
            r = await c.get(NOTEBOOK_HEALTH_PATH, headers={"authorization": f"token {token}"})
            ready_s = time.monotonic() - began  # held until JupyterLab answered
            assert r.status_code == 200 and "version" in r.json(), r.text
            w = m.active[placement]
            served = endpoints.of(job)[0]
            assert served.first_answer is not None
            image_s = (w.done_at["image"] - w.done_at["inputs"]).total_seconds()
            jupyter_s = (served.first_answer - w.done_at[LAUNCHED]).total_seconds()
            built = NOTEBOOK_ENV in runtime.builder.built
            print(
                f"notebook: first 200 after {ready_s:.1f} s; image step {image_s:.1f} s "
                f"(environment built now: {built}); JupyterLab answered {jupyter_s:.1f} s "
                "after its container started"
            )
            # as a browser: the URL with the token once, then its cookies only
            c.cookies.clear()
            r = await c.get(f"/lab?token={token}")
            assert r.status_code == 200 and "JupyterLab" in r.text
            jar = dict(v.split(";")[0].split("=", 1) for v in r.headers.get_list("set-cookie"))
            assert jar.pop("gpufleet-notebook") == token  # the proxy's; Jupyter's own beside
            assert "_xsrf" in jar and any(k.startswith("username-") for k in jar)
            cookies = "; ".join(f"{k}={v}" for k, v in jar.items())
            cookies += f"; gpufleet-notebook={token}"
            c.cookies.clear()
            r = await c.get("/lab", headers={"cookie": f"gpufleet-notebook={new_token()}"})
            assert r.status_code == 401
            r = await c.get("/api/contents", headers={"cookie": cookies})
            assert sorted(i["name"] for i in r.json()["content"]) == [
                "checkpoint",
                "input",
                "models",
                "output",
            ]
            headers = {"cookie": cookies, "x-xsrftoken": jar["_xsrf"], "origin": f"http://{host}"}
            r = await c.post("/api/kernels", json={"name": "python3"}, headers=headers)
            assert r.status_code == 201, r.text
            kernel = r.json()["id"]
        async with listening(app) as port:
            code = run_code(port, host, cookies, jar["_xsrf"], kernel, "6 * 7")
            assert await asyncio.wait_for(code, 60) == "42"
        m.stop(job, 0, placement)
        finished = await until_finished(m, placement)
        assert finished.state is WorkerState.stopped
    finally:
        probing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probing
        if placement in m.active:  # failed on the way: its container stopped, its disk freed
            m.stop(job, 0, placement)
            with contextlib.suppress(AssertionError):
                await until_finished(m, placement)


async def run_code(port: int, host: str, cookies: str, xsrf: str, kernel: str, code: str) -> str:
    """`code` run by the kernel over its websocket through the proxy, as JupyterLab does in a
    browser (its cookies, its Origin, the XSRF token in the query); its result's text."""
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "",
            "session": "s1",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False},
        "channel": "shell",
    }
    async with connect(
        f"ws://{host}/api/kernels/{kernel}/channels?session_id=s1&_xsrf={xsrf}",
        host="127.0.0.1",
        port=port,
        origin=Origin(f"http://{host}"),
        additional_headers={"cookie": cookies},
        open_timeout=30,
    ) as ws:
        await ws.send(json.dumps(request))
        async for raw in ws:
            msg = json.loads(raw)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_result":
                return str(msg["content"]["data"]["text/plain"])
            if msg["msg_type"] == "error":
                raise AssertionError(msg["content"])
    raise AssertionError("the kernel's websocket closed")
