"""Starting, supervising and stopping the processes of `just up`: nats-server, the embedded
MongoDB, the GCP emulator and the storage servers when asked for, then every service and
the node agent."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpufleet_devstack import identities
from gpufleet_devstack.children import CONSOLE, NODE_NAME, SERVICES, ServiceSpec, child_env
from gpufleet_devstack.config import DEFAULT_REGISTRY_PORT, DEFAULT_STORAGE_PORT, find_repo_root
from gpufleet_devstack.console import Out, rel
from gpufleet_devstack.mongo import EmbeddedMongo
from gpufleet_devstack.nats import NatsServer
from gpufleet_devstack.podman import node_runtime_env
from gpufleet_devstack.processes import (
    DevstackError,
    ServiceProcess,
    free_port,
    log_tail,
    port_in_use,
)
from gpufleet_devstack.prometheus import PrometheusServer, find_prometheus
from gpufleet_devstack.registry import LocalRegistry, find_registry
from gpufleet_devstack.storage.servers import StoragePorts, StorageServers

RESTART_BACKOFF: Final = 1.0
MAX_RESTARTS_PER_MINUTE: Final = 5
SUPERVISE_INTERVAL: Final = 0.5
SCRAPE_INTERVAL_S: Final = 5.0
PROMETHEUS_RETENTION: Final = "7d"


@dataclass
class Supervised:
    spec: ServiceSpec
    process: ServiceProcess
    restarts: deque[float] = field(default_factory=deque)  # monotonic times, last minute
    restart_at: float | None = None  # a restart is due at this time
    gave_up: bool = False


def running_workers(state_dir: Path) -> int:
    """The workers a node agent with this state directory started that have not ended (no
    exit.json yet: gpufleet_node_agent.worker.manager)."""
    root = state_dir / "workers"
    if not root.is_dir():
        return 0
    return sum(
        1
        for d in root.iterdir()
        if d.is_dir() and not d.name.startswith(".") and not (d / "exit.json").exists()
    )


def _last_line(path: Path) -> str:
    lines = [line for line in log_tail(path, 5).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


class Stack:
    """Everything `just up` started, so it can be stopped in reverse order."""

    def __init__(
        self,
        out: Out,
        run_dir: Path,
        nats_port: int,
        mongo_port: int,
        registry_port: int = DEFAULT_REGISTRY_PORT,
        storage_port: int = DEFAULT_STORAGE_PORT,
    ) -> None:
        self.out = out
        self.run_dir = run_dir
        self.log_dir = run_dir / "logs"
        # fsync before every acknowledgement: an acknowledged write survives a power cut
        # (docs/reliability.md); the tests' and benchmarks' throwaway servers keep the default.
        self.nats = NatsServer(
            run_dir / "nats",
            port=nats_port,
            log_file=self.log_dir / "nats.log",
            sync_interval="always",
        )
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
        # The local image registry (customer images, R-JOB-7), when docker-registry is here.
        self.registry: LocalRegistry | None = None
        self.registry_port = registry_port
        # `--data`: the storage servers jobs stage from and to, and their demo data.
        self.storage: StorageServers | None = None
        self.storage_ports = StoragePorts(storage_port)
        self._node_runtime: dict[str, str] | None = None
        # Each service's and the node agent's /metrics (the same port across restarts), and
        # the Prometheus that scrapes them every SCRAPE_INTERVAL_S (its data in run_dir).
        self.metrics_ports = {spec.name: free_port() for spec in SERVICES}
        self.prometheus: PrometheusServer | None = None
        # Its port, chosen before the services start (`plan_prometheus`): the provisioner
        # evaluates its alert rules against it (GPUFLEET_PROMETHEUS_URL).
        self.prometheus_port: int | None = None

    @property
    def node_runtime(self) -> dict[str, str]:
        """The node agents' runtime settings (containers, or bare own jobs without podman)."""
        if self._node_runtime is None:
            self._node_runtime = node_runtime_env(self.out.step)
        return self._node_runtime

    def platform_env(self) -> dict[str, str]:
        """The datastore's bucket of platform objects: the storage servers' S3 (`--data`),
        the bucket made by the datastore at its start. Without `--data`: none, and platform
        objects are refused as not configured (services/datastore/README.md)."""
        return {} if self.storage is None else self.storage.platform_env()

    @property
    def console_url(self) -> str:
        """Where the web console listens (GPUFLEET_CONSOLE_PORT, as its child reads it)."""
        port = os.environ.get("GPUFLEET_CONSOLE_PORT") or CONSOLE.defaults["GPUFLEET_CONSOLE_PORT"]
        return f"http://127.0.0.1:{port}"

    def service_env(self, spec: ServiceSpec) -> dict[str, str]:
        stack = {
            "GPUFLEET_NATS_URL": self.nats.url,
            **self.mongo.service_env,
            **self.gcp_env,
            **(
                {"GPUFLEET_WORKER_INSECURE_REGISTRIES": self.registry.address}
                if self.registry is not None
                else {}
            ),
            **identities.service_env(self.nats, spec.name),
            **self.node_env.get(spec.name, {}),
            **(
                self.storage.agent_env()
                if self.storage is not None and spec.name == "node-agent"
                else {}
            ),
            **(self.platform_env() if spec.name == "datastore" else {}),
            **(
                {"GPUFLEET_METRICS_PORT": str(self.metrics_ports[spec.name])}
                if spec.name in self.metrics_ports
                else {}
            ),
            **(
                {"GPUFLEET_PROMETHEUS_URL": f"http://127.0.0.1:{self.prometheus_port}"}
                if spec.name == "provisioner" and self.prometheus_port is not None
                else {}
            ),
        }
        if os.environ.get("GPUFLEET_SECRET_KEY"):  # one of the developer's: theirs wins
            stack.pop("GPUFLEET_SECRET_KEY", None)
        return child_env(spec, os.environ, stack, self.run_dir)

    def start_servers(self) -> None:
        self.out.step(f"starting nats-server on {self.nats.url} (data: {rel(self.nats.store_dir)})")
        # The stack's secret key (provisioner and scheduler); a GCP key sealed by an earlier
        # `just up --gcp` with .run/gcp-secret.key stays readable.
        identities.secret_key(self.nats, adopt=self.run_dir / "gcp-secret.key")
        self.nats.start()
        asyncio.run(identities.apply_streams(self.nats))
        self.out.ok(
            "nats-server up, JetStream enabled and encrypted at rest "
            f"(log: {rel(self.nats.log_file)})"
        )
        self.out.step(f"starting embedded MongoDB (nx-27017) on {self.mongo.url}")
        self.mongo.start()
        self.out.ok(
            f"MongoDB up, data in {rel(self.mongo.data_dir)} (log: {rel(self.mongo.log_file)})"
        )
        if find_registry() is None:
            self.out.step("no local image registry: docker-registry is not installed")
            return
        self.registry = LocalRegistry(self.run_dir / "registry", port=self.registry_port)
        self.registry.start()
        self.out.ok(f"image registry (docker-registry) up on {self.registry.address}")

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
            agent_env=self.node_runtime,  # its instances' agents: as the local node's
        ).start()
        self.gcp_env = {
            **self.gcp.env(),
            "GPUFLEET_BURST_IDLE_S": os.environ.get("GPUFLEET_BURST_IDLE_S", "60"),
        }
        self.out.ok(f"GCP emulator up: Compute {self.gcp.compute}, gRPC {self.gcp.grpc}")

    def start_storage(self) -> None:
        """The storage servers, with the demo bucket, container and repository; the node
        agent started after is told their endpoints (StorageServers.agent_env)."""
        ports = self.storage_ports
        low, high = ports.passive
        self.out.step(
            f"starting the storage servers on 127.0.0.1:{ports.base}..{ports.base + 6} "
            f"(FTP data {low}..{high}; data: {rel(self.run_dir / 'storage')})"
        )
        storage = StorageServers(self.run_dir / "storage", self.log_dir, ports)
        storage.start()
        self.storage = storage
        try:
            storage.seed()
            storage.seed_platform(self.mongo.url, identities.LOCAL_ACCOUNT)
        except Exception as exc:  # a client's error, whichever: the stack stops, said why
            raise DevstackError(f"the storage servers' demo data was not put: {exc}") from exc
        self.out.ok(
            "storage servers up: S3, GCS, Azure Blob, git (git://, http), files (https, ftp); "
            f"demo data in `demo` (logs: {rel(self.log_dir)})"
        )

    def start_services(self) -> None:
        (self.run_dir / "agent").mkdir(parents=True, exist_ok=True)
        for spec in (*SERVICES, CONSOLE):
            if spec.name == "node-agent":
                # A node enrols like a real one: a join token from the provisioner.
                self.node_env[spec.name] = {
                    **asyncio.run(
                        identities.prepare_node(self.nats, NODE_NAME, self.run_dir / "agent")
                    ),
                    **self.node_runtime,
                }
            proc = ServiceProcess(
                spec.name,
                [sys.executable, "-m", spec.module],
                self.service_env(spec),
                self.log_dir / f"{spec.name}.log",
                cwd=find_repo_root(),
                stop_timeout=spec.stop_timeout,
            )
            proc.start()
            self.children.append(Supervised(spec, proc))
            self.out.step(f"started {spec.name} (pid {proc.pid}, log {rel(proc.log_file)})")

    def plan_prometheus(self, port: int) -> None:
        """Prometheus's port: `port`, or another free one if it is taken (a developer's own
        Prometheus, say); none without Debian's `prometheus`."""
        if find_prometheus() is not None:
            self.prometheus_port = free_port() if port_in_use(port) else port

    def start_prometheus(self) -> None:
        """Prometheus over every metrics port, on the planned port."""
        if self.prometheus_port is None:
            self.out.warn("no metrics history: prometheus is not installed (`just setup`)")
            return
        targets = [f"127.0.0.1:{p}" for p in self.metrics_ports.values()]
        self.prometheus = PrometheusServer(
            self.run_dir / "prometheus",
            targets,
            SCRAPE_INTERVAL_S,
            port=self.prometheus_port,
            retention=PROMETHEUS_RETENTION,
        )
        self.out.step(f"starting prometheus (data: {rel(self.prometheus.data_dir)})")
        self.prometheus.start()
        self.out.ok(f"prometheus up on {self.prometheus.url}, scraping {len(targets)} targets")

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
                        f"in a minute; giving up on it (log: {rel(proc.log_file)})"
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
        if self.prometheus is not None:
            self.prometheus.stop()
        for child in reversed(self.children):
            name = child.spec.name
            agent = name == "node-agent"
            alive = child.process.alive
            busy = running_workers(self.run_dir / "agent") if agent and alive else 0
            if alive:
                more = f" and its {busy} running worker(s)" if busy else ""
                self.out.step(f"stopping {name}{more}")
            child.process.stop()
            left = running_workers(self.run_dir / "agent") if agent else 0
            if left:
                self.out.warn(
                    f"{left} worker(s) of {NODE_NAME} are still running (their node agent "
                    f"did not stop them in time: {rel(child.process.log_file)}); the next "
                    "`just up` re-attaches them"
                )
            elif agent and busy:
                self.out.ok(f"{NODE_NAME}: {busy} worker(s) stopped (containers, disks, MPS)")
        if self.gcp is not None:
            self.out.step("stopping the GCP emulator (and its instances' agents)")
            self.gcp.stop()
            self.gcp = None
        if self.storage is not None:
            self.out.step("stopping the storage servers")
            self.storage.stop()
        if self.registry is not None:
            self.registry.stop()
        if self.mongo.running:
            self.out.step("stopping MongoDB")
        self.mongo.stop()
        if self.nats.running:
            self.out.step("stopping nats-server")
        self.nats.stop()
