"""`just up`: the whole gpufleet system on this machine.

Starts nats-server and the embedded MongoDB with their data under `.run/`, then every
service and one node agent, checks that each service answers its health RPC, prints what
to try, and supervises the children until Ctrl-C (or SIGTERM), when it stops them all in
reverse order. `--no-block` starts, checks, prints and stops again (a smoke test).

    uv run python -m gpufleet_devstack.up [--no-block] [--require-healthy] [--gcp]

`--gcp` (or GPUFLEET_UP_GCP=1) also starts the local Google Cloud emulator
(`gpufleet_gcp_emulator`), points the provisioner at it, and enables an emulated GCP provider
(project `gpufleet-dev`) with the region `us-central1` for the account `local`: queued jobs
that allow bursting then run on emulated instances.

Environment: GPUFLEET_NATS_PORT (default 4333; not 4222, which a system nats-server may
use), GPUFLEET_MONGO_PORT (default 27027), GPUFLEET_RUN_DIR (default `<repo>/.run`),
GPUFLEET_SIMULATED_GPUS (default `1`: the node agent reports simulated 2 x RTX 3090; `0`
for the machine's real GPUs through NVML).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from gpufleet_contracts import subjects

from gpufleet_devstack import identities
from gpufleet_devstack.mongo import EmbeddedMongo
from gpufleet_devstack.nats import NatsServer, ensure_nats_server
from gpufleet_devstack.processes import DevstackError, ServiceProcess, log_tail, port_in_use


@dataclass(frozen=True)
class ServiceSpec:
    """One child process of `just up`."""

    name: str  # log file name, and `health` subject part unless `health` says otherwise
    module: str  # run as `python -m <module>`
    health: str | None  # answers gpufleet.v1.rpc.<health>.health; None: no health RPC
    env: Mapping[str, str] = field(default_factory=dict)  # extra env; {run_dir} is expanded
    defaults: Mapping[str, str] = field(default_factory=dict)  # extra env, unless already set


NODE_NAME: Final = "local-node-1"

# Started in this order, stopped in the reverse order.
SERVICES: Final[tuple[ServiceSpec, ...]] = (
    ServiceSpec("provisioner", "gpufleet_provisioner", health="provisioner"),
    ServiceSpec("scheduler", "gpufleet_scheduler", health="scheduler"),
    ServiceSpec("billing", "gpufleet_billing", health="billing"),
    ServiceSpec("device-fleet", "gpufleet_device_fleet", health="device-fleet"),
    ServiceSpec("datastore", "gpufleet_datastore", health="datastore"),
    ServiceSpec(
        "node-agent",
        "gpufleet_node_agent",
        health=None,
        env={
            "GPUFLEET_MINION_ID": NODE_NAME,
            "GPUFLEET_NODE_NAME": NODE_NAME,
            "GPUFLEET_REGION": "local",
            "GPUFLEET_AGENT_STATE_DIR": "{run_dir}/agent",
        },
        # R-NODE-6: simulated GPUs only on request. `just up` asks for them (the same node on
        # every laptop); GPUFLEET_SIMULATED_GPUS=0 just up reads the real GPUs through NVML.
        defaults={"GPUFLEET_SIMULATED_GPUS": "1"},
    ),
)

DEFAULT_NATS_PORT: Final = 4333
DEFAULT_MONGO_PORT: Final = 27027
HEALTH_TIMEOUT: Final = 60.0
RESTART_BACKOFF: Final = 1.0
MAX_RESTARTS_PER_MINUTE: Final = 5
SUPERVISE_INTERVAL: Final = 0.5


def health_subject(service: str) -> str:
    """Asked as the local account (any account may ask a service's health)."""
    return subjects.as_account(subjects.rpc(service, "health"), identities.LOCAL_ACCOUNT)


def heartbeat_subject(minion_id: str) -> str:
    return subjects.heartbeat(minion_id)


# -- output -------------------------------------------------------------------------------


class _Out(Protocol):
    def step(self, text: str) -> None: ...
    def ok(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...
    def error(self, text: str) -> None: ...
    def plain(self, text: str) -> None: ...
    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None: ...


class _PlainOut:
    def step(self, text: str) -> None:
        print(f"==> {text}", flush=True)

    def ok(self, text: str) -> None:
        print(f"ok  {text}", flush=True)

    def warn(self, text: str) -> None:
        print(f"!!  {text}", flush=True)

    def error(self, text: str) -> None:
        print(f"error: {text}", flush=True)

    def plain(self, text: str) -> None:
        print(text, flush=True)

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
        print(title)
        for row in (headers, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
        sys.stdout.flush()


class _RichOut:
    def __init__(self) -> None:
        from rich.console import Console

        # soft_wrap: long lines (commands to copy) are not broken at the terminal width
        self._console = Console(highlight=False, soft_wrap=True)

    def step(self, text: str) -> None:
        self._console.print(f"[bold blue]==>[/] {_esc(text)}")

    def ok(self, text: str) -> None:
        self._console.print(f"[green]ok [/] {_esc(text)}")

    def warn(self, text: str) -> None:
        self._console.print(f"[yellow]!! [/] {_esc(text)}")

    def error(self, text: str) -> None:
        self._console.print(f"[bold red]error:[/] {_esc(text)}")

    def plain(self, text: str) -> None:
        self._console.print(_esc(text))

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in rows:
            styled = [_esc(c) for c in row]
            if row and len(row) > 1:
                colour = "green" if row[1].startswith("up") else "red"
                styled[1] = f"[{colour}]{styled[1]}[/]"
            table.add_row(*styled)
        self._console.print(table)


def _esc(text: str) -> str:
    try:
        from rich.markup import escape
    except ImportError:  # pragma: no cover
        return text
    return escape(text)


def _make_out() -> _Out:
    """rich when it is importable (it comes with the CLI), plain print otherwise."""
    try:
        return _RichOut()
    except ImportError:
        return _PlainOut()


# -- configuration ------------------------------------------------------------------------


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory (from cwd up) that holds a `justfile`; cwd when none does."""
    here = (start or Path.cwd()).absolute()
    for candidate in (here, *here.parents):
        if (candidate / "justfile").is_file() or (candidate / "Justfile").is_file():
            return candidate
    return here


def run_dir_from_env(env: Mapping[str, str] = os.environ) -> Path:
    override = env.get("GPUFLEET_RUN_DIR")
    if override:
        return Path(override).expanduser().absolute()
    return find_repo_root() / ".run"


def _port_from_env(name: str, default: int, env: Mapping[str, str] = os.environ) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise DevstackError(f"{name}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise DevstackError(f"{name}={port} is not a valid port")
    return port


# -- supervision ----------------------------------------------------------------------------


@dataclass
class Supervised:
    spec: ServiceSpec
    process: ServiceProcess
    restarts: deque[float] = field(default_factory=deque)  # monotonic times, last minute
    restart_at: float | None = None  # a restart is due at this time
    gave_up: bool = False


def _rel(path: Path) -> str:
    """`path` relative to cwd when it is below it (shorter to read and to copy)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _last_line(path: Path) -> str:
    lines = [line for line in log_tail(path, 5).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def child_env(
    spec: ServiceSpec, base: Mapping[str, str], stack: Mapping[str, str], run_dir: Path
) -> dict[str, str]:
    """A child's environment: `base` (ours), the spec's defaults where `base` has none, the
    stack's endpoints, then the spec's own settings."""
    env = dict(base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in spec.defaults.items():
        env.setdefault(key, value.format(run_dir=run_dir))
    env.update(stack)
    for key, value in spec.env.items():
        env[key] = value.format(run_dir=run_dir)
    return env


class Stack:
    """Everything `just up` started, so it can be stopped in reverse order."""

    def __init__(self, out: _Out, run_dir: Path, nats_port: int, mongo_port: int) -> None:
        self.out = out
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        self.nats = NatsServer(run_dir / "nats", port=nats_port, log_file=self.log_dir / "nats.log")
        self.mongo = EmbeddedMongo(
            run_dir / "mongo",
            port=mongo_port,
            log_file=self.log_dir / "mongo.log",
            pid_file=run_dir / "mongo.pid",
        )
        self.children: list[Supervised] = []
        self.stopping = False
        self.gcp: Any = None  # the GCP emulator (gpufleet_gcp_emulator.testing.EmulatorProcess)
        self.gcp_env: dict[str, str] = {}
        self.node_env: dict[str, dict[str, str]] = {}  # the node agent's join token

    def service_env(self, spec: ServiceSpec) -> dict[str, str]:
        stack = {
            "GPUFLEET_NATS_URL": self.nats.url,
            "GPUFLEET_MONGO_URL": self.mongo.url,
            **self.gcp_env,
            **identities.service_env(self.nats, spec.name),
            **self.node_env.get(spec.name, {}),
        }
        if os.environ.get("GPUFLEET_SECRET_KEY"):  # one of the developer's: theirs wins
            stack.pop("GPUFLEET_SECRET_KEY", None)
        return child_env(spec, os.environ, stack, self.run_dir)

    def start_servers(self) -> None:
        self.out.step(
            f"starting nats-server on {self.nats.url} (data: {_rel(self.nats.store_dir)})"
        )
        # The stack's secret key (provisioner and scheduler); a GCP key sealed by an earlier
        # `just up --gcp` with .run/gcp-secret.key stays readable.
        identities.secret_key(self.nats, adopt=self.run_dir / "gcp-secret.key")
        self.nats.start()
        asyncio.run(identities.apply_streams(self.nats))
        self.out.ok(
            "nats-server up, JetStream enabled and encrypted at rest "
            f"(log: {_rel(self.nats.log_file)})"
        )
        self.out.step(f"starting embedded MongoDB (nx-27017) on {self.mongo.url}")
        self.mongo.start()
        self.out.ok(
            f"MongoDB up, data in {_rel(self.mongo.data_dir)} (log: {_rel(self.mongo.log_file)})"
        )

    def start_gcp(self) -> None:
        """The GCP emulator and its endpoints for the services (the key that seals the GCP
        service-account key is the stack's, `identities.secret_key`); its instances boot
        simulated node agents on this stack's NATS."""
        from gpufleet_gcp_emulator.testing import EmulatorProcess

        self.out.step("starting the Google Cloud emulator (Compute, Pub/Sub, Logging)")
        self.gcp = EmulatorProcess(
            self.log_dir / "gcp-emulator.log",
            nats_url=self.nats.url,
            agent_dir=self.run_dir / "gcp-agents",
        ).start()
        self.gcp_env = {
            **self.gcp.env(),
            "GPUFLEET_BURST_IDLE_S": os.environ.get("GPUFLEET_BURST_IDLE_S", "60"),
        }
        self.out.ok(f"GCP emulator up: Compute {self.gcp.compute}, gRPC {self.gcp.grpc}")

    def start_services(self) -> None:
        (self.run_dir / "agent").mkdir(parents=True, exist_ok=True)
        for spec in SERVICES:
            if spec.name == "node-agent":
                # A node enrols like a real one: a join token from the provisioner.
                self.node_env[spec.name] = asyncio.run(
                    identities.prepare_node(self.nats, NODE_NAME, self.run_dir / "agent")
                )
            proc = ServiceProcess(
                spec.name,
                [sys.executable, "-m", spec.module],
                self.service_env(spec),
                self.log_dir / f"{spec.name}.log",
                cwd=find_repo_root(),
            )
            proc.start()
            self.children.append(Supervised(spec, proc))
            self.out.step(f"started {spec.name} (pid {proc.pid}, log {_rel(proc.log_file)})")

    def supervise_once(self) -> None:
        """Restart children that died on their own: after RESTART_BACKOFF seconds, and at
        most MAX_RESTARTS_PER_MINUTE times a minute, after which we give up on the child.
        Never blocks, so one crashing child does not delay the others."""
        now = time.monotonic()
        for child in self.children:
            if self.stopping or child.gave_up or child.process.alive:
                continue
            proc = child.process
            if child.restart_at is None:
                while child.restarts and now - child.restarts[0] > 60:
                    child.restarts.popleft()
                reason = f"exited with code {proc.returncode}: {_last_line(proc.log_file)}"
                if len(child.restarts) >= MAX_RESTARTS_PER_MINUTE:
                    child.gave_up = True
                    self.out.error(
                        f"{proc.name} {reason}\n  restarted {MAX_RESTARTS_PER_MINUTE} times "
                        f"in a minute; giving up on it (log: {_rel(proc.log_file)})"
                    )
                    continue
                if child.restarts:
                    self.out.warn(
                        f"{proc.name} exited again (code {proc.returncode}); restart "
                        f"{len(child.restarts) + 1}/{MAX_RESTARTS_PER_MINUTE} this minute"
                    )
                else:
                    self.out.warn(f"{proc.name} {reason}\n  restarting in {RESTART_BACKOFF:.0f}s")
                child.restart_at = now + RESTART_BACKOFF
            elif now >= child.restart_at:
                child.restart_at = None
                child.restarts.append(now)
                proc.start()

    def stop_all(self) -> None:
        self.stopping = True
        for child in reversed(self.children):
            if child.process.alive:
                self.out.step(f"stopping {child.spec.name}")
            child.process.stop()
        if self.gcp is not None:
            self.out.step("stopping the GCP emulator (and its instances' agents)")
            self.gcp.stop()
            self.gcp = None
        if self.mongo.running:
            self.out.step("stopping MongoDB")
        self.mongo.stop()
        if self.nats.running:
            self.out.step("stopping nats-server")
        self.nats.stop()


# -- health -----------------------------------------------------------------------------------


async def _wait_healthy(nc: Any, child: Supervised, deadline: float) -> bool:
    assert child.spec.health is not None
    subject = health_subject(child.spec.health)
    loop = asyncio.get_running_loop()
    while loop.time() < deadline and not child.gave_up:
        try:
            await nc.request(subject, b"{}", timeout=1)
            return True
        except Exception:
            # no responders yet (NoRespondersError) or a slow start (TimeoutError)
            await asyncio.sleep(0.2)
    return False


async def check_health(stack: Stack, wait_s: float = HEALTH_TIMEOUT) -> dict[str, str]:
    """Ask every service its health RPC; the node agent counts as up when it heartbeats."""
    import nats

    status: dict[str, str] = {}
    nc = await nats.connect(
        stack.nats.url, connect_timeout=5, max_reconnect_attempts=-1, **stack.nats.admin()
    )
    try:
        heartbeats: set[str] = set()

        async def on_heartbeat(msg: Any) -> None:
            heartbeats.add(msg.subject)

        hb_sub = await nc.subscribe(heartbeat_subject(NODE_NAME), cb=on_heartbeat)
        deadline = asyncio.get_running_loop().time() + wait_s
        checked = [c for c in stack.children if c.spec.health is not None]

        async def supervise() -> None:
            while True:
                stack.supervise_once()
                await asyncio.sleep(SUPERVISE_INTERVAL)

        supervisor = asyncio.create_task(supervise())
        try:
            results = await asyncio.gather(*(_wait_healthy(nc, c, deadline) for c in checked))
        finally:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        for child, healthy in zip(checked, results, strict=True):
            status[child.spec.name] = "up" if healthy else "DOWN"
        await hb_sub.unsubscribe()
        for child in stack.children:
            if child.spec.health is None:
                if not child.process.alive:
                    status[child.spec.name] = "DOWN"
                elif heartbeats:
                    status[child.spec.name] = "up (heartbeating)"
                else:
                    status[child.spec.name] = "up (running, no heartbeat seen yet)"
    finally:
        await nc.close()
    return status


def print_status(stack: Stack, status: Mapping[str, str]) -> None:
    rows: list[list[str]] = [
        ["nats-server", "up", stack.nats.url, ""],
        ["mongodb (nx-27017)", "up", stack.mongo.url, ""],
    ]
    for child in stack.children:
        state = status.get(child.spec.name, "DOWN")
        where = (
            health_subject(child.spec.health) if child.spec.health else heartbeat_subject(NODE_NAME)
        )
        log = _rel(child.process.log_file) if not state.startswith("up") else ""
        rows.append([child.spec.name, state, where, log])
    stack.out.table("gpufleet local stack", ["component", "state", "address", "log"], rows)


GCP_PROJECT: Final = "gpufleet-dev"
GCP_REGION: Final = "us-central1"


async def enable_emulated_gcp(stack: Stack) -> list[str]:
    """Enable the gcp provider (an emulated service-account key) and its region, once."""
    import json

    import nats
    from gpufleet_gcp_emulator.testing import service_account_key

    key = service_account_key(GCP_PROJECT)
    said: list[str] = []
    nc = await nats.connect(
        stack.nats.url, connect_timeout=5, **stack.nats.client(identities.user_creds(stack.nats))
    )
    try:
        for verb, body in (
            ("enable_provider", {"provider": "gcp", "key_json": json.dumps(key)}),
            ("create_region", {"provider": "gcp", "name": GCP_REGION}),
        ):
            reply = json.loads(
                (
                    await nc.request(
                        subjects.as_account(
                            subjects.rpc("provisioner", verb), identities.LOCAL_ACCOUNT
                        ),
                        json.dumps(body).encode(),
                        timeout=30,
                    )
                ).data
            )
            error = reply.get("error") if reply.get("ok") is False else None
            if error and error.get("code") != "conflict":
                raise DevstackError(f"{verb}: {error.get('message')}")
            said.append(f"{verb}: {'already done' if error else 'ok'}")
    finally:
        await nc.close()
    return said


def print_what_to_try(stack: Stack) -> None:
    out = stack.out
    out.plain("")
    out.plain("What to try (in another terminal):")
    creds = identities.user_creds(stack.nats)
    for line in (
        f"uv run gpufleet login --creds {_rel(creds)} --url {stack.nats.url} --context local",
        "   # or, for one shell: export GPUFLEET_NATS_URL="
        f"{stack.nats.url} GPUFLEET_NATS_CREDS={_rel(creds)}",
        "uv run gpufleet context show   # user dev of account local (plan team)",
        "uv run gpufleet node list",
        'uv run gpufleet job submit --name hello --gpu-type "RTX 3090" --gpu-count 1 '
        "--max-price 1.0 -- python -c \"print('hi')\"",
        "uv run gpufleet job show <id>",
        "uv run gpufleet billing balance",
        *(
            (
                "uv run gpufleet region list   # the emulated GCP region and its runnable jobs",
                "uv run gpufleet job submit --name cloud --gpu-type V100 --gpu-count 1 "
                "--max-price 1.0 --allow-burst -- python -c \"print('from the cloud')\"",
            )
            if stack.gcp is not None
            else ()
        ),
    ):
        out.plain(f"  {line}")
    out.plain("")


# -- main --------------------------------------------------------------------------------------


class _Stop(BaseException):
    """Raised from a signal handler to leave the blocking loop."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


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
        default=os.environ.get("GPUFLEET_UP_GCP", "").lower() in {"1", "true", "yes", "on"},
        help="also start the Google Cloud emulator with an emulated GCP provider enabled",
    )
    args = parser.parse_args(argv)
    out = _make_out()

    try:
        nats_port = _port_from_env("GPUFLEET_NATS_PORT", DEFAULT_NATS_PORT)
        mongo_port = _port_from_env("GPUFLEET_MONGO_PORT", DEFAULT_MONGO_PORT)
        out.step("checking nats-server")
        binary = ensure_nats_server(log=out.step)
        out.ok(f"nats-server: {binary}")
    except DevstackError as exc:
        out.error(str(exc))
        return 1

    run_dir = run_dir_from_env()
    for name, port, var in (
        ("NATS", nats_port, "GPUFLEET_NATS_PORT"),
        ("MongoDB", mongo_port, "GPUFLEET_MONGO_PORT"),
    ):
        if port_in_use(port):
            out.error(
                f"port {port} for {name} is busy (is another `just up` running?). "
                f"Stop it, or pick another port with {var}=<port>."
            )
            return 1
    out.step(f"run directory: {_rel(run_dir)} (data and logs; reused by the next `just up`)")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    stack = Stack(out, run_dir, nats_port, mongo_port)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        stack.start_servers()
        if args.gcp:
            stack.start_gcp()
        stack.start_services()
        out.step(f"waiting up to {args.health_timeout:.0f}s for the services' health replies")
        status = asyncio.run(check_health(stack, args.health_timeout))
        print_status(stack, status)
        if args.gcp and status.get("provisioner", "").startswith("up"):
            for line in asyncio.run(enable_emulated_gcp(stack)):
                out.ok(f"GCP ({GCP_PROJECT}, {GCP_REGION}) {line}")
        if args.require_healthy and not all(s.startswith("up") for s in status.values()):
            code = 1
        print_what_to_try(stack)
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
