"""The node's proxy for notebooks (proxy/, steps/serve.py): opened by the notebook's token (in
the query, an Authorization header or the proxy's cookie, which a token in the query sets),
never by the scheduler; Jupyter's own cookies and Authorization passed on, the proxy's cookie
not; websockets relayed both ways, for notebooks and endpoints alike, and refused with the
HTTP answer a request would get; against real servers on unix sockets."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.serving import NOTEBOOK_COMMAND, NOTEBOOK_TOKEN_ENV, Serving
from gpufleet_contracts.serving import key_digest as token_digest
from gpufleet_node_agent.proxy.auth import notebook_tokens, token_opens
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_spec
from gpufleet_node_agent.steps.serve import TOKEN_FILE, ServeStep
from gpufleet_node_agent.worker.manager import WorkerManager
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .proxykit import (
    Proxy,
    Scheduler,
    Upstream,
    endpoint_worker,
    listening,
    new_token,
    notebook_worker,
    running_proxy,
    short_dir,
    socket_of,
)
from .test_pipeline import FakeRuntime, Noted
from .test_workers import FakeBroker

HOST = "j1.localhost:8480"
COOKIE = "gpufleet-notebook"


def client(proxy: Proxy, host: str = HOST) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=proxy.app, client=("203.0.113.7", 5555))
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}", timeout=30)


def ws(port: int, path: str, host: str = HOST, **kw: Any) -> Any:
    """A websocket to the proxy on `port`, its Host `host`."""
    return connect(f"ws://{host}{path}", host="127.0.0.1", port=port, open_timeout=10, **kw)


# --- the worker: its command, its token kept ------------------------------------------------


def notebook_spec(command: tuple[str, ...] = NOTEBOOK_COMMAND) -> WorkerSpec:
    return WorkerSpec(
        placement_id="pl-1",
        job_id="j1",
        worker=0,
        command=command,
        serving=Serving(kind="notebook", health_path="/api"),
    )


def test_a_notebook_runs_jupyterlab_on_its_socket_in_opt_ml_or_its_own_command_relayed() -> None:
    wd = Path("/state/workers/pl-1")
    c = container_spec(notebook_spec(), wd, "m1", PodmanConfig())
    assert c.command == [
        "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.sock=/run/gpufleet/http.sock",
        "--ServerApp.root_dir=/opt/ml",
        "--ServerApp.allow_remote_access=True",
    ]
    assert c.user == "10000:10000" and c.network == "none"
    assert {b.target for b in c.binds} >= {"/run/gpufleet", "/opt/ml/models", "/opt/ml/output"}
    as_root = container_spec(notebook_spec(), wd, "m1", PodmanConfig(uid=0))
    assert as_root.command[-1] == "--allow-root"
    own = container_spec(
        notebook_spec(("python3", "-m", "http.server", "80")), wd, "m1", PodmanConfig()
    )
    assert own.command == [
        *("python3", "/opt/gpufleet/run.py", "relay", "--uds", "/run/gpufleet/http.sock"),
        *("--to", "127.0.0.1:80", "--", "python3", "-m", "http.server", "80"),
    ]


def notebook_cmd(env: dict[str, str]) -> StartWorker:
    return StartWorker(
        minion_id="m1",
        job_id="j1",
        job_name="nb",
        worker=0,
        command=list(NOTEBOOK_COMMAND),
        gpu_indices=[0],
        placement_id="pl-1",
        env=env,
        serving=Serving(kind="notebook", health_path="/api"),
    )


async def test_the_token_digest_is_kept_from_the_start_and_a_notebook_without_token_refused(
    tmp_path: Path,
) -> None:
    token = new_token()
    m = WorkerManager(
        tmp_path / "a", "m1", FakeBroker(), gpu_indices=[0], runtime=FakeRuntime(Noted(), [])
    )
    assert m.start(notebook_cmd({NOTEBOOK_TOKEN_ENV: token}))
    kept = m.worker_dir("pl-1") / TOKEN_FILE
    assert json.loads(kept.read_text()) == {"token_sha256": token_digest(token)}
    assert kept.stat().st_mode & 0o777 == 0o600
    assert token not in kept.read_text()
    step = ServeStep(uid=os.getuid())  # finds it: the worker goes on
    await step.setup(Worker(notebook_spec(), m.worker_dir("pl-1")))
    for env in ({}, {NOTEBOOK_TOKEN_ENV: "short"}):
        m = WorkerManager(tmp_path / f"b{len(env)}", "m1", FakeBroker(), gpu_indices=[0])
        assert not m.start(notebook_cmd(env))
        exit_data = json.loads((m.worker_dir("pl-1") / "exit.json").read_text())
        assert exit_data["error"] == f"a notebook needs its token ({NOTEBOOK_TOKEN_ENV})"
        assert not (m.worker_dir("pl-1") / TOKEN_FILE).exists()


def test_the_tokens_a_request_shows_and_which_opens() -> None:
    assert notebook_tokens("q", "token a", "c") == ["q", "c", "a"]
    assert notebook_tokens(None, "Bearer  b ", None) == ["b"]
    assert notebook_tokens(None, "Basic eA==", None) == []
    assert token_opens("t" * 43, token_digest("t" * 43))
    assert not token_opens("t" * 43, token_digest("u" * 43))
    assert not token_opens("t" * 43, None)


# --- HTTP --------------------------------------------------------------------------------


async def test_a_token_in_the_query_opens_it_and_sets_the_cookie_which_then_opens_alone() -> None:
    with short_dir() as root:
        token = new_token()
        w = notebook_worker(root, "j1", "p1", token)
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        try:
            async with running_proxy([w], sched) as proxy, client(proxy) as c:
                r = await c.get(
                    f"/lab?token={token}",
                    headers={"cookie": "_xsrf=x1; username-j1=u", "x-mine": "kept"},
                )
                assert r.status_code == 200
                assert r.headers["set-cookie"] == (
                    f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
                )
                got = r.json()
                assert got["target"] == f"/lab?token={token}"  # Jupyter sets its own cookie
                assert got["headers"]["cookie"] == "_xsrf=x1; username-j1=u"
                assert got["headers"]["host"] == HOST and got["headers"]["x-mine"] == "kept"
                c.cookies.clear()
                # the proxy's cookie alone opens it, and is not passed on
                r = await c.get("/api/contents", headers={"cookie": f"{COOKIE}={token}; _xsrf=x1"})
                assert r.status_code == 200 and "set-cookie" not in r.headers
                assert r.json()["headers"]["cookie"] == "_xsrf=x1"
                r = await c.get("/api/contents", headers={"cookie": f"{COOKIE}={token}"})
                assert r.status_code == 200 and "cookie" not in r.json()["headers"]
                # Authorization, as Jupyter's clients send it: opens, and passed on
                for scheme in ("token", "Bearer"):
                    auth = {"authorization": f"{scheme} {token}"}
                    r = await c.post("/api/sessions", content=b"{}", headers=auth)
                    assert r.status_code == 200
                    assert r.json()["headers"]["authorization"] == f"{scheme} {token}"
                assert sched.asked == 0  # never the scheduler's to say
                assert proxy.endpoints.of("j1")[0].meter.requests == 5
        finally:
            await up.stop()


async def test_no_token_or_a_wrong_one_is_401_and_an_unknown_host_404() -> None:
    with short_dir() as root:
        token = new_token()
        w = notebook_worker(root, "j1", "p1", token)
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        key = sched.key_for("j1")
        wrong = new_token()
        try:
            async with running_proxy([w], sched) as proxy, client(proxy) as c:
                for headers, target in (
                    ({}, "/lab"),
                    ({}, f"/lab?token={wrong}"),
                    ({}, f"/lab?token={token[:-1]}"),
                    ({"cookie": f"{COOKIE}={wrong}"}, "/lab"),
                    ({"cookie": f"other={token}"}, "/lab"),  # not the proxy's cookie
                    ({"authorization": f"token {wrong}"}, "/api"),
                    ({"authorization": f"Bearer {key}"}, "/api"),  # an endpoint key: no
                    ({"authorization": f"Basic {token}"}, "/api"),
                ):
                    r = await c.get(target, headers=headers)
                    assert r.status_code == 401, (headers, target)
                    assert "set-cookie" not in r.headers
                r = await c.get("/lab")
                assert r.headers["www-authenticate"] == "Bearer"
                for host in ("j2.localhost:8480", "localhost:8480"):
                    r = await c.get(f"/lab?token={token}", headers={"host": host})
                    assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                assert up.seen == [] and sched.asked == 0
        finally:
            await up.stop()


async def test_over_https_the_cookie_is_secure() -> None:
    with short_dir() as root:
        token = new_token()
        w = notebook_worker(root, "j1", "p1", token)
        up = await Upstream(socket_of(w)).start()
        template = UrlTemplate.parse("https://{job}.nb.example.com")
        try:
            async with running_proxy([w], Scheduler(), template=template) as proxy:
                transport = httpx.ASGITransport(app=proxy.app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="https://j1.nb.example.com"
                ) as c:
                    r = await c.get(f"/lab?token={token}")
                    assert r.status_code == 200
                    assert r.headers["set-cookie"].endswith("; HttpOnly; SameSite=Strict; Secure")
                    assert "domain" not in r.headers["set-cookie"].lower()  # this origin only
        finally:
            await up.stop()


# --- websockets --------------------------------------------------------------------------


async def test_a_websocket_is_relayed_both_ways_with_the_token_and_refused_without() -> None:
    with short_dir() as root:
        token = new_token()
        w = notebook_worker(root, "j1", "p1", token)
        up = await Upstream(socket_of(w)).start()
        try:
            async with running_proxy([w], Scheduler()) as proxy, listening(proxy.app) as port:
                for path, host, status in (
                    ("/api/kernels/k/channels", HOST, 401),
                    (f"/api/kernels/k/channels?token={new_token()}", HOST, 401),
                    (f"/api/kernels/k/channels?token={token}", "j2.localhost:8480", 404),
                    (f"/ws-refused?token={token}", HOST, 403),  # the worker's own refusal
                ):
                    with pytest.raises(InvalidStatus) as refused:
                        await ws(port, path, host)
                    assert refused.value.response.status_code == status
                assert refused.value.response.body == b"blocked"  # the worker's, passed on
                assert [s.target for s in up.sockets] == [f"/ws-refused?token={token}"]
                conn: ClientConnection
                async with ws(
                    port,
                    f"/api/kernels/k/channels?session_id=s1&token={token}",
                    subprotocols=["v1.kernel.websocket.jupyter.org"],
                    origin="http://j1.localhost:8480",
                    additional_headers={"cookie": f"{COOKIE}={token}; _xsrf=x"},
                ) as conn:
                    assert conn.subprotocol == "v1.kernel.websocket.jupyter.org"
                    await conn.send("hello")
                    assert await conn.recv() == "w:hello"
                    await conn.send(b"\x00\xff" * 1000)
                    assert await conn.recv() == b"w:" + b"\x00\xff" * 1000
                seen = up.sockets[-1]
                assert seen.target == f"/api/kernels/k/channels?session_id=s1&token={token}"
                h = seen.headers
                assert h["host"] == HOST and h["origin"] == "http://j1.localhost:8480"
                assert h["cookie"] == "_xsrf=x"  # Jupyter's, not the proxy's
                assert h["sec-websocket-protocol"] == "v1.kernel.websocket.jupyter.org"
                for _ in range(50):  # the caller closed: the worker's side closed with it
                    if up.closed:
                        break
                    await asyncio.sleep(0.05)
                assert up.closed == [1000]
                # the worker closes: the caller's side closes with its code
                async with ws(
                    port, "/ws-bye", additional_headers={"authorization": f"token {token}"}
                ) as conn:
                    await conn.send("x")
                    with pytest.raises(ConnectionClosed) as closed:
                        await conn.recv()
                    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
                m = proxy.endpoints.of("j1")[0].meter
                assert m.messages == 5 and m.bytes_in == 5 + 2000 + 1
                assert m.bytes_out == len("w:hello") + 2 + 2000
        finally:
            await up.stop()


async def test_an_endpoints_websocket_opens_with_its_key_and_takes_no_credential() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        key, other = sched.key_for("j1"), sched.key_for("j2")
        try:
            async with running_proxy([w], sched) as proxy, listening(proxy.app) as port:
                for headers, status in (({}, 401), ({"authorization": f"Bearer {other}"}, 404)):
                    with pytest.raises(InvalidStatus) as refused:
                        await ws(port, "/stream", additional_headers=headers)
                    assert refused.value.response.status_code == status
                auth = {"authorization": f"Bearer {key}", "cookie": "s=1"}
                async with ws(port, "/stream", additional_headers=auth) as conn:
                    await conn.send("ping")
                    assert await conn.recv() == "w:ping"
                h = up.sockets[-1].headers
                assert "authorization" not in h and "cookie" not in h
                assert h["x-forwarded-for"] == "127.0.0.1"
        finally:
            await up.stop()
