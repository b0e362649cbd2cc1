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
connections to 127.0.0.1:80 (gpufleet_endpoint.relay). A notebook runs JupyterLab on the
socket in /opt/ml (its token from the job's env, JUPYTER_TOKEN), or its own command under
the relay; the SHA-256 of its token is kept in the worker's directory (`notebook.json`,
which the container does not see) from its start on, for the proxy to check callers with.

A job in a container attached to a port reservation (R-RES-3) runs its command under the
relay too, on serve/port.sock to 127.0.0.1:<the reservation's port>, where the job listens:
the node carries the reservation's port on its LAN to that socket (host/port_forward.py).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gpufleet_endpoint
from gpufleet_contracts.serving import (
    NOTEBOOK_COMMAND,
    NOTEBOOK_TOKEN_ENV,
    Serving,
    ServingKind,
    key_digest,
)

from ..worker.files import read_json, write_text_atomic
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.spec import WorkerSpec
    from ..worker.workdir import Worker

SERVE_DIR = "serve"
ENDPOINT_DIR = "endpoint"
SOCKET = "http.sock"
PORT_SOCKET = "port.sock"  # a reserved job's port (R-RES-3)
ROUTES = "routes.json"
LIB = "lib"
IN_SERVE = "/run/gpufleet"  # the serve directory in the container
IN_SOCKET = f"{IN_SERVE}/{SOCKET}"
IN_PORT_SOCKET = f"{IN_SERVE}/{PORT_SOCKET}"
IN_ENDPOINT = "/opt/gpufleet"
IN_LIB = f"{IN_ENDPOINT}/{LIB}"
IN_ROUTES = f"{IN_ENDPOINT}/{ROUTES}"
RUN = "run.py"
IN_RUN = f"{IN_ENDPOINT}/{RUN}"
MODELS = "/opt/ml/models"
SERVER_PORT = 80  # where an endpoint's own server listens (R-JOB-6)
PYTHON = "python3"
NOTEBOOK_ROOT = "/opt/ml"  # what JupyterLab shows: models, input, output, checkpoint
TOKEN_FILE = "notebook.json"  # in the worker's directory: {"token_sha256": ...}
MIN_TOKEN_CHARS = 16  # the scheduler's are 43 (NOTEBOOK_TOKEN_BYTES, url-safe base64)


def socket_path(worker_dir: Path) -> Path:
    return worker_dir / SERVE_DIR / SOCKET


def port_socket_path(worker_dir: Path) -> Path:
    return worker_dir / SERVE_DIR / PORT_SOCKET


def relays_port(spec: WorkerSpec) -> bool:
    """A job (not an endpoint) attached to a port reservation: in a container, the node
    serves its port through the relay."""
    return spec.serving is None and spec.reservation is not None


def is_notebook(serving: Serving | None) -> bool:
    return serving is not None and serving.kind is ServingKind.notebook


def runs_jupyter(spec: WorkerSpec) -> bool:
    """A notebook that runs gpufleet's JupyterLab (it gave no command of its own)."""
    return is_notebook(spec.serving) and spec.command == NOTEBOOK_COMMAND


def command(
    spec: WorkerSpec, *, as_root: bool = False, reserved_port: int | None = None
) -> list[str]:
    """The container's command for the served worker of `spec`: the route server on the
    socket (the scheduler's `--port 80` command is not used), JupyterLab on the socket for a
    notebook without its own command (`as_root`: the container's user is root, which
    Jupyter refuses unless told), or else the job's own command under the relay; a job with
    a `reserved_port` under the relay from the port's socket to that port."""
    serving = spec.serving
    if serving is None:
        if reserved_port is not None and relays_port(spec):
            to = f"127.0.0.1:{reserved_port}"
            return [
                PYTHON,
                IN_RUN,
                "relay",
                "--uds",
                IN_PORT_SOCKET,
                "--to",
                to,
                "--",
                *spec.command,
            ]
        return list(spec.command)
    if serving.kind is ServingKind.routes:
        return [PYTHON, IN_RUN, "--routes", IN_ROUTES, "--models", MODELS, "--uds", IN_SOCKET]
    if runs_jupyter(spec):
        return [
            *NOTEBOOK_COMMAND,
            "--no-browser",
            f"--ServerApp.sock={IN_SOCKET}",
            f"--ServerApp.root_dir={NOTEBOOK_ROOT}",
            "--ServerApp.allow_remote_access=True",  # its Host is the proxy's URL
            *(["--allow-root"] if as_root else []),
        ]
    to = f"127.0.0.1:{SERVER_PORT}"
    return [PYTHON, IN_RUN, "relay", "--uds", IN_SOCKET, "--to", to, "--", *spec.command]


def kept_token(env: Mapping[str, str]) -> dict[str, Any] | None:
    """What a notebook's worker keeps of its token (the job's env value NOTEBOOK_TOKEN_ENV,
    opened from its sealed secrets): its SHA-256; None when it has none worth the name."""
    token = env.get(NOTEBOOK_TOKEN_ENV) or ""
    if len(token) < MIN_TOKEN_CHARS:
        return None
    return {"token_sha256": key_digest(token)}


def token_sha256(worker_dir: Path) -> str | None:
    """The SHA-256 (hex) of the token that opens the notebook of `worker_dir`; None when
    none is kept (nothing opens it)."""
    kept = read_json(worker_dir / TOKEN_FILE) or {}
    digest = kept.get("token_sha256")
    return digest if isinstance(digest, str) and len(digest) == 64 else None


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
        if serving is None and not relays_port(w.spec):
            return
        if serving is not None and serving.kind is not ServingKind.routes and not w.spec.command:
            raise WorkerFailed("a served worker with its own server needs a command")
        if is_notebook(serving) and token_sha256(w.dir) is None:
            raise WorkerFailed(f"a notebook needs its token ({NOTEBOOK_TOKEN_ENV})")
        serve = w.dir / SERVE_DIR
        serve.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(serve, self.uid, self.uid)
        socket_path(w.dir).unlink(missing_ok=True)  # an earlier try's
        port_socket_path(w.dir).unlink(missing_ok=True)
        endpoint = w.dir / ENDPOINT_DIR
        endpoint.mkdir(mode=0o755, exist_ok=True)
        routes = [r.model_dump(mode="json") for r in serving.routes] if serving else []
        for name, text in ((ROUTES, json.dumps(routes)), (RUN, RUN_PY)):
            write_text_atomic(endpoint / name, text)
            os.chmod(endpoint / name, 0o644)
        lib = endpoint / LIB / "gpufleet_endpoint"
        shutil.copytree(gpufleet_endpoint.PACKAGE_DIR, lib, ignore=_ignored, dirs_exist_ok=True)

    async def teardown(self, w: Worker) -> None:
        if w.spec.serving is not None:
            socket_path(w.dir).unlink(missing_ok=True)
        if relays_port(w.spec):
            port_socket_path(w.dir).unlink(missing_ok=True)
