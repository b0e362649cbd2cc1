"""`just up`: the whole gpufleet system on this machine.

Starts nats-server and the embedded MongoDB with their data under `.run/`, then every
service and one node agent, checks that each service answers its health RPC, prints what
to try, and supervises the children until Ctrl-C (or SIGTERM), when it stops them all in
reverse order. `--no-block` starts, checks, prints and stops again (a smoke test).

    uv run python -m gpufleet_devstack.up [--no-block] [--require-healthy] [--gcp] [--data]

`--gcp` (or GPUFLEET_UP_GCP=1) also starts the local Google Cloud emulator
(`gpufleet_gcp_emulator`), points the provisioner at it, and enables an emulated GCP provider
(project `gpufleet-dev`) with the region `us-central1` for the account `local`: queued jobs
that allow bursting then run on emulated instances.

`--data` (or GPUFLEET_UP_DATA=1) also starts the storage servers a job's data, code and
checkpoints come from and its outputs go to (`gpufleet_devstack.storage`): S3 (moto), GCS
(gcp-storage-emulator), Azure Blob (Azurite, https), git over git:// and http, files over
https and FTP; fills the bucket (and container) `demo` with a small dataset archive and
serves a model repository `demo-model.git`; writes a demo job to `.run/storage/demo-job.yaml`
and a demo endpoint to `.run/storage/demo-endpoint.yaml`; and tells the node agent their
endpoints (GPUFLEET_STAGING_ALLOW, GPUFLEET_STAGING_CA_FILE).

Environment: GPUFLEET_NATS_PORT (default 4333; not 4222, which a system nats-server may
use), GPUFLEET_MONGO_PORT (default 27027), GPUFLEET_REGISTRY_PORT (default 5055: the local
image registry, when docker-registry is installed), GPUFLEET_STORAGE_PORT (default 5060:
`--data`'s servers take it and the next six, FTP's data connections 5070..5079),
GPUFLEET_RUN_DIR (default `<repo>/.run`), GPUFLEET_SIMULATED_GPUS (default `1`: the node
agent reports simulated 2 x RTX 3090; `0` for the machine's real GPUs through NVML),
GPUFLEET_PROMETHEUS_PORT (default 9090, another free port if taken: the Prometheus that
scrapes every service's and the node agent's /metrics every 5 s, its data in
`<run dir>/prometheus`; docs/metrics.md).

This module is the entry point; the parts are beside it: `children` (what is started, each
one's environment), `stack` (starting, supervising and stopping it all), `health` (the
health checks and the status table), `emulated_gcp` (`--gcp`), `storage.servers`
(`--data`), `what_to_try` (the commands printed at the end), `console` (rich or plain
output) and `config` (ports, run directory).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Sequence

from gpufleet_devstack import identities
from gpufleet_devstack.children import CONSOLE_PORT, NODE_NAME, SERVICES, ServiceSpec, child_env
from gpufleet_devstack.cli_context import Saved, save_local_context
from gpufleet_devstack.config import (
    DEFAULT_MONGO_PORT,
    DEFAULT_NATS_PORT,
    DEFAULT_PROMETHEUS_PORT,
    DEFAULT_REGISTRY_PORT,
    DEFAULT_STORAGE_PORT,
    find_repo_root,
    port_from_env,
    run_dir_from_env,
)
from gpufleet_devstack.console import make_out, rel
from gpufleet_devstack.emulated_gcp import GCP_PROJECT, GCP_REGION, enable_emulated_gcp
from gpufleet_devstack.health import HEALTH_TIMEOUT, check_health, print_status
from gpufleet_devstack.nats import ensure_nats_server
from gpufleet_devstack.processes import DevstackError, port_in_use
from gpufleet_devstack.registry import find_registry
from gpufleet_devstack.stack import SUPERVISE_INTERVAL, Stack
from gpufleet_devstack.storage.servers import StoragePorts
from gpufleet_devstack.what_to_try import print_what_to_try

# What `just up` starts, for the tests that start the same (tests/e2e, tests/security).
__all__ = ["NODE_NAME", "SERVICES", "ServiceSpec", "child_env", "find_repo_root", "main", "run"]


class _Stop(BaseException):
    """Raised from a signal handler to leave the blocking loop."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _save_context(stack: Stack) -> Saved | None:
    """The CLI's context for this stack; None (said) when it cannot be written."""
    try:
        return save_local_context(stack.nats.url, identities.user_creds(stack.nats))
    except (OSError, ValueError) as exc:
        stack.out.warn(f"the CLI's context `local` was not saved: {exc}")
        return None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in {"1", "true", "yes", "on"}


def run(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet_devstack.up", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--no-block", action="store_true", help="start, check health, print, stop, exit"
    )
    parser.add_argument(
        "--require-healthy",
        action="store_true",
        help="exit 1 when a service does not answer its health check",
    )
    parser.add_argument(
        "--health-timeout", type=float, default=HEALTH_TIMEOUT, help="seconds (default 60)"
    )
    parser.add_argument(
        "--gcp",
        action="store_true",
        default=_env_flag("GPUFLEET_UP_GCP"),
        help="also start the Google Cloud emulator with an emulated GCP provider enabled",
    )
    parser.add_argument(
        "--data",
        action="store_true",
        default=_env_flag("GPUFLEET_UP_DATA"),
        help="also start the storage servers (S3, GCS, Azure Blob, git, https, ftp) with demo data",
    )
    args = parser.parse_args(argv)
    out = make_out()

    try:
        nats_port = port_from_env("GPUFLEET_NATS_PORT", DEFAULT_NATS_PORT)
        mongo_port = port_from_env("GPUFLEET_MONGO_PORT", DEFAULT_MONGO_PORT)
        registry_port = port_from_env("GPUFLEET_REGISTRY_PORT", DEFAULT_REGISTRY_PORT)
        storage_port = port_from_env("GPUFLEET_STORAGE_PORT", DEFAULT_STORAGE_PORT)
        console_port = port_from_env("GPUFLEET_CONSOLE_PORT", CONSOLE_PORT)
        out.step("checking nats-server")
        binary = ensure_nats_server(log=out.step)
        out.ok(f"nats-server: {binary}")
    except DevstackError as exc:
        out.error(str(exc))
        return 1

    run_dir = run_dir_from_env()
    ports = [
        ("NATS", nats_port, "GPUFLEET_NATS_PORT"),
        ("MongoDB", mongo_port, "GPUFLEET_MONGO_PORT"),
        ("the web console", console_port, "GPUFLEET_CONSOLE_PORT"),
    ]
    if find_registry():
        ports.append(("the image registry", registry_port, "GPUFLEET_REGISTRY_PORT"))
    if args.data:
        for port in StoragePorts(storage_port).all():
            ports.append(("the storage servers", port, "GPUFLEET_STORAGE_PORT"))
    for name, port, var in ports:
        if port_in_use(port):
            out.error(
                f"port {port} for {name} is busy (is another `just up` running?). "
                f"Stop it, or pick another port with {var}=<port>."
            )
            return 1
    out.step(f"run directory: {rel(run_dir)} (data and logs; reused by the next `just up`)")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    stack = Stack(out, run_dir, nats_port, mongo_port, registry_port, storage_port)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        stack.start_servers()
        if args.gcp:
            stack.start_gcp()
        if args.data:
            stack.start_storage()
        stack.plan_prometheus(port_from_env("GPUFLEET_PROMETHEUS_PORT", DEFAULT_PROMETHEUS_PORT))
        stack.start_services()
        stack.start_prometheus()
        out.step(f"waiting up to {args.health_timeout:.0f}s for the services' health replies")
        status = asyncio.run(check_health(stack, args.health_timeout))
        print_status(stack, status)
        if args.gcp and status.get("provisioner", "").startswith("up"):
            for line in asyncio.run(enable_emulated_gcp(stack)):
                out.ok(f"GCP ({GCP_PROJECT}, {GCP_REGION}) {line}")
        if args.require_healthy and not all(s.startswith("up") for s in status.values()):
            code = 1
        print_what_to_try(stack, _save_context(stack))
        if not args.no_block:
            out.step("running; Ctrl-C stops everything")
            while True:
                stack.supervise_once()
                time.sleep(SUPERVISE_INTERVAL)
    except _Stop as stop:
        out.step(f"{stop}: shutting down")
    except DevstackError as exc:
        out.error(str(exc))
        code = 1
    finally:
        # A second Ctrl-C must not interrupt the orderly shutdown half way.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        stack.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    out.ok("stopped")
    return code


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
