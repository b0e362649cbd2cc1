"""Endpoints (R-JOB-6) through the running system and the CLI: a job with two routes and a
job with its own server on port 80, each in a container with no network, reached at its URL
through the node's proxy with a key from `gpufleet endpoint key create`; a request sent
while the endpoint starts is held and answered; another endpoint's key, no key, a bad body,
a GET each get their answer; another account gets no key; after `job cancel` the URL
answers 404 (services/node-agent/README.md, "Endpoints: the proxy and its trust model").
A notebook submitted with no command serves JupyterLab at the URL `gpufleet job open`
prints with its token, and 401 without it or with another; cancelled, its URL is gone.

The model code comes from a web server of the test's (a `web` source, the archive
unpacked at /opt/ml/models); its module sleeps 6 s as it is imported (a model loading), so
that the first request, sent as soon as the endpoint has a key, is held by the proxy while
the endpoint starts.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from gpufleet_devstack import identities
from gpufleet_devstack.processes import free_port
from gpufleet_devstack.pyindex import LocalIndex, image_python, wheels_index
from gpufleet_devstack.storage.archives import tar_gz
from gpufleet_devstack.storage.web import running_web
from gpufleet_node_agent.baseimage import BASE_IMAGE, default_containers_conf, ensure_image
from gpufleet_node_agent.baseimage import podman_env as make_podman_env
from gpufleet_node_agent.environments import JUPYTERLAB

from .conftest import System

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None, reason="podman is not installed (just setup installs it)"
)

NOTEBOOK_ENV = "localhost/gpufleet/env:py3.11-deep_learning-notebook"

MODEL = """\
import time

time.sleep(6)  # a model loading: the route server listens only once it is imported


def add(a, b):
    return {"sum": a + b}


def concat(x, y):
    return x + y
"""
ROUTES = [
    {
        "verb": "POST",
        "path": "/add",
        "file": "calc.py",
        "function": "add",
        "body": [
            {"name": "a", "type": "integer"},
            {"name": "b", "type": "integer", "optional": True, "default": "10"},
        ],
    },
    {  # declared y first: positional calls concat(y, x)
        "verb": "POST",
        "path": "/concat",
        "file": "calc.py",
        "function": "concat",
        "positional": True,
        "body": [{"name": "y", "type": "string"}, {"name": "x", "type": "string"}],
    },
]


@dataclass
class Endpoints:
    system: System
    proxy_port: int
    model_url: str

    def submit(self, name: str, endpoint: dict[str, Any]) -> str:
        path = self.system.root / f"{name}.yaml"
        spec = {
            "name": name,
            "type": "endpoint",
            "gpu_types": ["RTX 3090"],
            "gpu_count": 1,
            "max_price": 1.0,
            "model": {"source": "web", "path": self.model_url},
            "endpoint": endpoint,
        }
        path.write_text(yaml.safe_dump(spec))
        return str(self.system.json("job", "submit", "-f", str(path))["id"])

    def key(self, job_id: str) -> str:
        created = self.system.json("endpoint", "key", "create", job_id)
        assert created["view"]["job_id"] == job_id
        return str(created["key"])

    def url(self, job_id: str, timeout: float = 120) -> str:
        """The job's URL, once `job show` has one (it is placed on a node)."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.system.json("job", "show", job_id)
            if job.get("url"):
                return str(job["url"])
            assert job["state"] not in ("failed", "stopped", "finished"), job
            assert time.monotonic() < deadline, f"no URL for {job_id}: {job}"
            time.sleep(0.2)

    def call(self, url: str, method: str, path: str, key: str | None, **kw: Any) -> httpx.Response:
        """A request to `url` (http://<job>.localhost:<port>) at the proxy on 127.0.0.1."""
        host = urlsplit(url).netloc
        assert urlsplit(url).port == self.proxy_port
        headers = {"host": host, **({"authorization": f"Bearer {key}"} if key else {})}
        headers.update(kw.pop("headers", {}))
        with httpx.Client(base_url=f"http://127.0.0.1:{self.proxy_port}", timeout=120) as c:
            return c.request(method, path, headers=headers, **kw)


@dataclass
class Served:
    job_id: str
    key: str
    url: str
    first: httpx.Response  # the request sent as soon as it had a URL
    first_s: float


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    podman_env = make_podman_env(default_containers_conf())
    error = asyncio.run(ensure_image(BASE_IMAGE, podman_env))  # once: the base image
    assert error is None, error
    models = tmp_path_factory.mktemp("models")
    (models / "calc.tar.gz").write_bytes(tar_gz({"calc.py": MODEL.encode()}))
    with running_web(models) as files:
        proxy_port = free_port()
        agent_env = {  # containers (the default): endpoints never run as bare processes
            "GPUFLEET_PROXY_LISTEN": f"127.0.0.1:{proxy_port}",
            "GPUFLEET_STOP_WORKERS_ON_EXIT": "true",  # its containers go with the system
            "GPUFLEET_STAGING_ALLOW": files.address,
        }
        index = _notebook_index(tmp_path_factory, podman_env)
        if index is not None:  # the notebook's environment is built from it
            agent_env["GPUFLEET_PACKAGE_INDEX_URL"] = index.url
        system = System(tmp_path_factory.mktemp("endpoints"), agent_env=agent_env)
        try:
            system.start()
            yield Endpoints(system, proxy_port, files.url("calc.tar.gz"))
        finally:
            system.stop()
            if index is not None:
                index.stop()


def _notebook_index(
    tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]
) -> LocalIndex | None:
    """None when the notebook environment is in podman's store; else an index of
    JupyterLab's wheels the build reaches (gpufleet_devstack.pyindex), where one can be."""
    exists = subprocess.run(["podman", "image", "exists", NOTEBOOK_ENV], env=env)
    if exists.returncode == 0:
        return None
    python = image_python(BASE_IMAGE, env)
    index = wheels_index(tmp_path_factory.mktemp("jupyter-index"), JUPYTERLAB, python)
    return None if isinstance(index, str) else index


@pytest.fixture(scope="module")
def routes(endpoints: Endpoints) -> Iterator[Served]:
    """The endpoint with two routes, called the moment it has a key: its URL is its node's
    template's (`job show` says so too, once the CLI gets to it), and it is still starting."""
    job_id = endpoints.submit("calc", {"routes": ROUTES})
    try:
        key = endpoints.key(job_id)
        url = f"http://{job_id}.localhost:{endpoints.proxy_port}"
        began = time.monotonic()
        first = endpoints.call(url, "POST", "/add", key, json={"a": 5})
        yield Served(job_id, key, url, first, time.monotonic() - began)
    finally:
        endpoints.system.cli("job", "cancel", job_id, check=False)


def test_a_request_sent_while_it_starts_is_held_and_answered(
    endpoints: Endpoints, routes: Served
) -> None:
    assert endpoints.url(routes.job_id) == routes.url  # as `job show` says
    assert (routes.first.status_code, routes.first.json()) == (200, {"sum": 15})  # b's default
    assert routes.first_s >= 1.0, routes.first_s  # held while the model loaded (6 s)


def test_each_route_answers_with_the_declared_types(endpoints: Endpoints, routes: Served) -> None:
    r = endpoints.call(routes.url, "POST", "/add", routes.key, json={"a": 2, "b": 3})
    assert (r.status_code, r.json()) == (200, {"sum": 5})
    r = endpoints.call(routes.url, "POST", "/concat", routes.key, json={"x": "a", "y": "b"})
    assert (r.status_code, r.json()) == (200, "ba")  # positional, in the declared order
    r = endpoints.call(routes.url, "POST", "/add", routes.key, json={"a": "two"})
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["body", "a"]]
    assert endpoints.call(routes.url, "GET", "/add", routes.key).status_code == 405
    r = endpoints.call(routes.url, "POST", "/add", None, json={"a": 1})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = endpoints.call(routes.url, "POST", "/add", "gfk_" + "0" * 12 + "_" + "A" * 43, json={})
    assert r.status_code == 401


def test_a_manual_server_answers_and_keys_open_only_their_own_endpoint(
    endpoints: Endpoints, routes: Served
) -> None:
    job_id = endpoints.submit("files", {"server_command": ["python3", "-m", "http.server", "80"]})
    try:
        key = endpoints.key(job_id)
        url = endpoints.url(job_id)
        r = endpoints.call(url, "GET", "/", key)
        assert r.status_code == 200 and "Directory listing" in r.text
        # each key is its own endpoint's: the other's answers as a job that is not there
        r = endpoints.call(url, "GET", "/", routes.key)
        assert (r.status_code, r.json()) == (404, {"detail": "not found"})
        r = endpoints.call(routes.url, "POST", "/add", key, json={"a": 1})
        assert (r.status_code, r.json()) == (404, {"detail": "not found"})
    finally:
        endpoints.system.cli("job", "cancel", job_id)


def test_another_account_gets_no_key_of_my_endpoint(endpoints: Endpoints, routes: Served) -> None:
    system = endpoints.system
    asyncio.run(identities.ensure_account(system.nats, "mallory", "team"))
    eve = system.nats.creds("user", "eve", account="mallory")
    made = system.cli(
        "endpoint",
        "key",
        "create",
        routes.job_id,
        check=False,
        env={**system.cli_env, "GPUFLEET_NATS_CREDS": str(eve)},
    )
    assert made.returncode != 0 and "gfk_" not in made.stdout
    assert "not found" in (made.stdout + made.stderr).lower()


def test_after_cancel_the_url_answers_not_found(endpoints: Endpoints, routes: Served) -> None:
    endpoints.system.cli("job", "cancel", routes.job_id)
    endpoints.system.wait_state(routes.job_id, "stopped", timeout=60)
    r = endpoints.call(routes.url, "POST", "/add", routes.key, json={"a": 1})
    assert (r.status_code, r.json()) == (404, {"detail": "not found"})


def test_a_notebook_opens_with_its_token_only(endpoints: Endpoints) -> None:
    system = endpoints.system
    submitted = system.json("job", "submit", "--type", "notebook", "--gpu-type", "RTX 3090")
    job_id = str(submitted["id"])
    try:
        deadline = time.monotonic() + 300  # its environment may be built first
        while (opened := system.cli("job", "open", job_id, check=False)).returncode != 0:
            assert time.monotonic() < deadline, opened.stderr
            time.sleep(0.5)
        url = httpx.URL(opened.stdout.strip())  # http://<job>.localhost:<port>/lab?token=...
        token = url.params["token"]
        assert url.path == "/lab" and "secret" in opened.stderr
        base = f"http://{url.host}:{url.port}"
        while (lab := endpoints.call(base, "GET", f"/lab?token={token}", None)).status_code == 503:
            assert time.monotonic() < deadline, lab.text
        assert lab.status_code == 200 and "JupyterLab" in lab.text, lab.text[:500]
        assert "gpufleet-notebook=" in lab.headers.get("set-cookie", "")
        assert endpoints.call(base, "GET", "/lab", None).status_code == 401
        assert endpoints.call(base, "GET", "/lab?token=not-its-token", None).status_code == 401
        header = {"authorization": f"token {token}"}
        api = endpoints.call(base, "GET", "/api/status", None, headers=header)
        assert api.status_code == 200, api.text
        assert token not in json.dumps(system.job(job_id))  # `job show` never has it
    finally:
        system.cli("job", "cancel", job_id, check=False)
    system.wait_state(job_id, "stopped", "failed", timeout=60)
    assert endpoints.call(base, "GET", f"/lab?token={token}", None).status_code == 404
