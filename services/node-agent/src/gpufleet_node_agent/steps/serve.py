"""An endpoint's worker (R-JOB-6): what its container serves with, and the unix socket the
node's proxy reaches it by, its container keeping no network (README, "Endpoints: the proxy
and its trust model").

In the worker's directory:

    serve/          bound read-write at /run/gpufleet, the worker's uid's: its server
                    listens on serve/http.sock (/run/gpufleet/http.sock)
    endpoint/       bound read-only at /opt/gpufleet, root's: `routes.json` (the job's
                    routes), `lib/gpufleet_endpoint/` (a copy of the route server and the
                    relay, so a running worker keeps the code it started with) and
                    `run.py`, which runs it (`python3 /opt/gpufleet/run.py ARGS` is
                    `python -m gpufleet_endpoint ARGS`, the job's PYTHONPATH untouched)

A worker with routes runs gpufleet's route server on the socket; one with its own server
(listening on port 80 in the container) runs it under the relay, which carries the socket's
connections to 127.0.0.1:80 (gpufleet_endpoint.relay).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import gpufleet_endpoint
from gpufleet_contracts.serving import ServingKind

from ..worker.files import write_text_atomic
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.spec import WorkerSpec
    from ..worker.workdir import Worker

SERVE_DIR = "serve"
ENDPOINT_DIR = "endpoint"
SOCKET = "http.sock"
ROUTES = "routes.json"
LIB = "lib"
IN_SERVE = "/run/gpufleet"  # the serve directory in the container
IN_SOCKET = f"{IN_SERVE}/{SOCKET}"
IN_ENDPOINT = "/opt/gpufleet"
IN_LIB = f"{IN_ENDPOINT}/{LIB}"
IN_ROUTES = f"{IN_ENDPOINT}/{ROUTES}"
RUN = "run.py"
IN_RUN = f"{IN_ENDPOINT}/{RUN}"
MODELS = "/opt/ml/models"
SERVER_PORT = 80  # where an endpoint's own server listens (R-JOB-6)
PYTHON = "python3"


def socket_path(worker_dir: Path) -> Path:
    return worker_dir / SERVE_DIR / SOCKET


def command(spec: WorkerSpec) -> list[str]:
    """The container's command for the endpoint worker of `spec`: the route server on the
    socket (the scheduler's `--port 80` command is not used), or the job's own command under
    the relay."""
    serving = spec.serving
    if serving is None:
        return list(spec.command)
    if serving.kind is ServingKind.routes:
        return [PYTHON, IN_RUN, "--routes", IN_ROUTES, "--models", MODELS, "--uds", IN_SOCKET]
    to = f"127.0.0.1:{SERVER_PORT}"
    return [PYTHON, IN_RUN, "relay", "--uds", IN_SOCKET, "--to", to, "--", *spec.command]


# `python3 /opt/gpufleet/run.py ARGS`: `python -m gpufleet_endpoint ARGS` with the shipped
# package importable, the job's environment (its PYTHONPATH) left as it is.
RUN_PY = f"""import runpy, sys
sys.path.insert(0, {IN_LIB!r})
runpy.run_module("gpufleet_endpoint", run_name="__main__", alter_sys=True)
"""


def _ignored(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


class ServeStep:
    """serve/ made for the worker's uid, endpoint/ filled; at the end the socket removed
    (the proxy answers 404 for a job with no worker here)."""

    name = StepName.serve
    marked = False  # its setup finds its work done (directories there, files rewritten)

    def __init__(self, uid: int) -> None:
        self.uid = uid

    async def setup(self, w: Worker) -> None:
        serving = w.spec.serving
        if serving is None:
            return
        if serving.kind is ServingKind.server and not w.spec.command:
            raise WorkerFailed("an endpoint with its own server needs a command")
        serve = w.dir / SERVE_DIR
        serve.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(serve, self.uid, self.uid)
        socket_path(w.dir).unlink(missing_ok=True)  # an earlier try's
        endpoint = w.dir / ENDPOINT_DIR
        endpoint.mkdir(mode=0o755, exist_ok=True)
        routes = [r.model_dump(mode="json") for r in serving.routes]
        for name, text in ((ROUTES, json.dumps(routes)), (RUN, RUN_PY)):
            write_text_atomic(endpoint / name, text)
            os.chmod(endpoint / name, 0o644)
        lib = endpoint / LIB / "gpufleet_endpoint"
        shutil.copytree(gpufleet_endpoint.PACKAGE_DIR, lib, ignore=_ignored, dirs_exist_ok=True)

    async def teardown(self, w: Worker) -> None:
        if w.spec.serving is not None:
            socket_path(w.dir).unlink(missing_ok=True)
