"""The agent's behaviour: inventory, registration, heartbeats, and the worker commands."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, cast

from faststream.nats import NatsBroker
from gpufleet_bus import publish
from gpufleet_bus.publish import Publisher
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_contracts.health import HealthCheck, NodeHealth
from gpufleet_contracts.jobs import StartWorker, StopWorker
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode

from .baseimage import default_containers_conf
from .buildnet import parse_allow
from .builds import BuildConfig
from .environments import offer, parse_env_map
from .host.gpu_access import GpuAccess, host_access
from .host.gpuchecks import GpuChecks, gpus_in_use
from .host.inventory import Inventory, offered_cpus, read_inventory
from .host.mdns import MdnsPublisher, addresses_of, parse_interfaces
from .host.metrics import NodeLabels, NodeMetrics
from .host.mps import Mps, find_control
from .host.port_forward import PortForwards
from .host.telemetry import GpuSampler, HostSampler, NoGpus, gpu_sampler
from .mounts.node import node_datastores
from .proxy.app import ProxyApp
from .proxy.auth import Verdicts
from .proxy.hosts import UrlTemplate
from .proxy.reserved import ReservedPorts
from .proxy.served import Endpoints
from .proxy.server import ProxyServer
from .runtimes.podman import PodmanRuntime
from .runtimes.podman_args import PodmanConfig
from .runtimes.policy import OWN_JOBS, RuntimePolicy, container_problem
from .runtimes.process import ProcessRuntime
from .runtimes.supervise import STOP_GRACE_S
from .sealing import NodeKey
from .settings import AgentSettings, retired_settings
from .staging.node import node_staging
from .staging.platform import Requester
from .staging.registry import Fetchers, Uploaders
from .staging.tally import TransferTally
from .steps.base import Step, WorkerFailed
from .steps.datastores import DatastoresStep
from .steps.outputs import prune_kept
from .steps.reservation import ReservationStep, reservation_asker
from .worker.manager import SOURCE, Recovery, WorkerManager
from .worker.progress import track
from .worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent")
KEPT_OUTPUTS_PRUNE_S = 3600.0  # kept output archives past their time, removed this often

VERSION = "0.1.0"
WORKERS_STOP_REASON = "stopped with the node agent (GPUFLEET_STOP_WORKERS_ON_EXIT)"
WORKERS_STOP_TIMEOUT_S = STOP_GRACE_S + 10.0  # their grace period, then their reports


def container_runtime(
    settings: AgentSettings,
    control_plane: Sequence[str] = (),
    fetchers: Fetchers | None = None,
    uploaders: Uploaders | None = None,
    regional: Sequence[Step] = (),
) -> PodmanRuntime:
    """The container runtime `GPUFLEET_WORKER_RUNTIME` names (podman, the only one yet);
    `control_plane`: the NATS servers' URLs, which its package builds never reach;
    `fetchers`, `uploaders`: the node's staging (staging/registry.py)."""
    config = PodmanConfig(
        image=settings.worker_image,
        uid=settings.worker_uid,
        network=settings.worker_network,
        memory_mb=settings.worker_memory_mb,
        cpus=settings.worker_cpus,
        pids=settings.worker_pids,
        parallel=settings.podman_parallel,
        launcher=settings.container_launcher,
        disk_quota=settings.worker_disk_quota == "loop",
        containers_conf=settings.podman_containers_conf or default_containers_conf(),
        insecure_registries=tuple(
            r.strip() for r in settings.worker_insecure_registries.split(",") if r.strip()
        ),
        base_environments=parse_env_map(settings.base_environments),
        build=BuildConfig(
            network=settings.package_build_network,
            memory_mb=settings.package_build_memory_mb,
            timeout_s=settings.package_build_timeout_s,
            index_url=settings.package_index_url or None,
            allow=parse_allow(settings.package_build_allow),
            control_plane=tuple(control_plane),
        ),
    )
    return PodmanRuntime(
        config, settings.minion_id, fetchers=fetchers, uploaders=uploaders, regional=regional
    )


def gpu_runtime(settings: AgentSettings) -> tuple[GpuAccess, Mps]:
    """How this node's real GPUs reach a container, and its MPS shares (NVML has started)."""
    gpu = host_access(settings.gpu_access, settings.nvidia_driver_dir)
    control = find_control(settings.mps_control)
    if control is None:
        log.warning("no nvidia-cuda-mps-control: fractional GPU jobs will fail on this node")
    return gpu, Mps(settings.mps_dir, control, settings.worker_uid)


def runtime_policy(settings: AgentSettings) -> RuntimePolicy:
    """Containers for every job; bare processes for the node owner's own jobs only when the
    operator opted in (policy.py). Whether podman works is checked at start-up (prepare)."""
    return RuntimePolicy(
        node_owner=settings.account,
        allow_bare=settings.allow_bare_processes == OWN_JOBS,
        container=settings.worker_runtime,
    )


def endpoint_proxy(
    settings: AgentSettings,
    active: Callable[[], Iterable[Worker]],
    request: Requester,
    publisher: Publisher,
    clock: Clock,
) -> tuple[Endpoints, ProxyApp, ProxyServer] | None:
    """The proxy to the endpoints this node serves (proxy/), None with
    GPUFLEET_PROXY_LISTEN=off: its endpoint workers as the manager has them (`active`),
    their keys checked by the scheduler over `request`."""
    if settings.proxy_listen.strip().lower() == "off":
        return None
    template = UrlTemplate.parse(settings.proxy_template())
    endpoints = Endpoints(
        active,
        minion_id=settings.minion_id,
        publisher=publisher,
        template=template,
        uid=settings.worker_uid,
        clock=clock,
    )
    verdicts = Verdicts(settings.minion_id, request)
    app = ProxyApp(endpoints, verdicts, template, hold_s=settings.proxy_hold_s)
    server = ProxyServer(
        app, settings.proxy_listen, cert=settings.proxy_cert, key=settings.proxy_key
    )
    return endpoints, app, server


def bus_requester(broker: NatsBroker, timeout_s: float = 10.0) -> Requester:
    """A request on the broker's connection, which takes the node credential's inbox
    prefix: the answer reaches this node alone."""

    async def request(subject: str, body: bytes) -> bytes:
        nc = await broker.connect()
        answer = await nc.request(subject, body, timeout=timeout_s)
        return bytes(answer.data)

    return request


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        broker: NatsBroker,
        clock: Clock = utcnow,
        inventory_reader: Callable[[AgentSettings], Inventory] = read_inventory,
        sealing_key: NodeKey | None = None,
        control_plane: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        # what its workers' secrets are sealed to (sealing.py); its public half registered,
        # with the node's nkey's signature of it
        self.sealing_key = sealing_key
        self.broker = broker
        # NatsBroker.publish takes these arguments by keyword, as publish() passes them;
        # the Publisher protocol declares them positional, hence the cast.
        self.publisher = cast(Publisher, broker)
        self.clock = clock
        self._heartbeat_seq = 0  # NodeHeartbeat.seq
        self.read_inventory = inventory_reader
        self.started_at = clock()
        self.hostname = socket.gethostname()
        self.inventory: Inventory | None = None
        self.recovery: Recovery | None = None  # what start-up found of a previous run
        # What fetches a worker's data and puts its output where the job says, by kind of
        # location (staging/node.py), shared by both runtimes' steps.
        # `platform` objects are asked of the scheduler over the node's own connection (its
        # answers come back to the node's inbox, `_INBOX.node.<minion_id>`).
        # The region's datastores its workers read and write, mounted while they need them
        # and healed by `heal_datastores` (mounts/keeper.py); the staging reads their roots.
        self.datastores = node_datastores(settings, bus_requester(broker), sealing_key)
        # The bytes they move, per job, for its /metrics (staging/tally.py).
        self.transfers = TransferTally()
        fetchers, uploaders = node_staging(
            settings, bus_requester(broker), self.datastores.roots, self.transfers
        )
        # Its endpoints' URLs (proxy/): the proxy over the manager's workers (made below),
        # and the template registered once it listens (None: no proxy, or its port was
        # taken).
        self.proxy = endpoint_proxy(
            settings,
            lambda: self.workers.active.values(),
            bus_requester(broker, 5.0),
            self.publisher,
            clock,
        )
        self.proxy_url: str | None = None
        # Port reservations its workers serve on, published with mDNS (host/mdns.py).
        # A container's reserved port is served by the node, on the same interfaces; an
        # endpoint's by the proxy's app there (proxy/reserved.py).
        lan = parse_interfaces(settings.mdns_interfaces)
        self.mdns = MdnsPublisher(lan)
        self.forwards = PortForwards(lambda: addresses_of(lan))
        self.reserved = (
            None
            if self.proxy is None
            else ReservedPorts(
                self.proxy[1], lambda: addresses_of(lan), lambda: self.proxy_url is not None
            )
        )
        self.regional: tuple[Step, ...] = (
            DatastoresStep(self.datastores, track, wait_s=settings.datastore_wait_s),
            ReservationStep(
                self.mdns,
                reservation_asker(settings.minion_id, bus_requester(broker)),
                self.forwards,
                self.reserved,
            ),
        )
        self.workers = WorkerManager(
            settings.agent_state_dir,
            settings.minion_id,
            self.publisher,
            log_chunk_bytes=settings.log_chunk_bytes,
            log_max_bytes=settings.worker_log_max_bytes,
            clock=clock,
            runtime=container_runtime(settings, control_plane, fetchers, uploaders, self.regional),
            # Bare processes: the owner's own jobs when allowed, and to re-attach workers a
            # previous run started that way.
            others=[ProcessRuntime(fetchers=fetchers, uploaders=uploaders, regional=self.regional)],
            policy=runtime_policy(settings),
            sealing_key=sealing_key,
        )
        self.registered = asyncio.Event()
        self._host = HostSampler(disk=settings.agent_state_dir)
        self._gpus: GpuSampler = NoGpus()  # its GPUs' sampler, once the inventory is read
        # Its /metrics (host/metrics.py): the heartbeat's last sample, labelled with the jobs
        # that hold each GPU at the scrape.
        self.metrics = NodeMetrics(
            NodeLabels(settings.minion_id, settings.region, settings.account),
            lambda: [w.spec for w in self.workers.active.values()],
            self.transfers,
        )
        # The control plane's GPU checks (verified nodes), answered out of process.
        self.checks = GpuChecks(
            settings.minion_id,
            self.publisher,
            simulated=lambda: self._inventory().simulated,
            in_use=lambda: gpus_in_use(self.workers),
            clock=clock,
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def minion_id(self) -> str:
        return self.settings.minion_id

    # --- lifecycle (FastStream hooks) -----------------------------------------------

    async def prepare(self) -> None:
        """Before the broker consumes: know the GPUs and the workers left by a previous run,
        and have the sealing key (made now if this is the node's first start with one)."""
        if self.sealing_key is not None:
            await asyncio.to_thread(self.sealing_key.load)
        for name in retired_settings(os.environ):
            log.warning("%s is no longer read; use GPUFLEET_SIMULATED_GPUS", name)
        inv = await asyncio.to_thread(self.read_inventory, self.settings)
        self.inventory = inv
        self._gpus = gpu_sampler(inv, self.settings.agent_state_dir, self.clock)
        self.metrics.inventory(inv.gpus)
        # Real, simulated or none, and how many: the first thing an operator needs to see.
        level = logging.WARNING if inv.simulated or not inv.gpus else logging.INFO
        log.log(level, "node agent %s: %s", self.minion_id, inv.describe())
        self.workers.gpu_indices = {g.index for g in inv.gpus}
        policy = self.workers.policy
        for rt in self.workers.runtimes.values():
            if isinstance(rt, PodmanRuntime):
                if inv.gpus and not inv.simulated:
                    rt.gpu, rt.mps = await asyncio.to_thread(gpu_runtime, self.settings)
                    log.info("GPUs reach containers by %s", rt.gpu.describe())
                rt.node_gpus = len(inv.gpus)
                rt.node_cpus = inv.logical_cpus()
                rt.cpu_job_cpus = offered_cpus(
                    self.settings.cpu_job_cpus, rt.node_cpus, len(inv.gpus)
                )
                if policy is not None:
                    policy.container_error = container_problem(rt.config.podman, rt.env)
        if policy is not None:
            self._log_policy(policy)
        found = self.recovery = self.workers.recover()
        for rt in self.workers.runtimes.values():
            if isinstance(rt, PodmanRuntime) and rt.mps is not None:
                # the MPS daemons of shares whose worker ended while the agent was away
                await asyncio.to_thread(rt.mps.sweep, [*found.reattached, *found.finished])
        if found.finished or found.reattached or found.lost:
            log.info(
                "recovered workers: %d ended while away, %d re-attached, %d lost",
                len(found.finished),
                len(found.reattached),
                len(found.lost),
            )

    def _log_policy(self, policy: RuntimePolicy) -> None:
        bare = (
            f"bare processes for jobs of {policy.node_owner} (GPUFLEET_ALLOW_BARE_PROCESSES)"
            if policy.allow_bare
            else "no bare processes"
        )
        if policy.container_error is None:
            log.info("worker runtime: %s containers; %s", policy.container, bare)
        else:
            log.warning(
                "worker runtime: NO containers (%s): every job that must run in one is refused; %s",
                policy.container_error,
                bare,
            )

    async def start(self) -> None:
        """After the broker connected: the proxy listening, register, then heartbeat and
        watch workers."""
        await self._start_proxy()
        self._spawn(self._register(), "register")
        self._spawn(self._heartbeats(), "heartbeat")
        s = self.settings
        self._spawn(self.workers.run(s.worker_poll_s, s.worker_check_s), "workers")
        self._spawn(self._prune_kept_outputs(), "kept-outputs")
        self._spawn(self._regional_again(), "regional-again")

    async def _regional_again(self) -> None:
        """The datastores and reservations of the workers a previous run launched, held and
        published again: their steps do not run again after a launch (pipeline.py), yet
        their outputs are put into a datastore and their names answered until they end."""

        async def again(w: Worker) -> None:
            for step in self.regional:
                try:
                    await step.setup(w)
                except WorkerFailed as exc:
                    log.warning("worker %s: %s", w.key, exc.reason)

        launched = [w for w in self.workers.active.values() if not w.setting_up]
        await asyncio.gather(*(again(w) for w in launched))

    async def stop(self) -> None:
        """Stop the loops. Workers are detached and keep running; a restart picks them up,
        unless the node goes with its agent (`stop_workers_on_exit`): then they are stopped
        and reported first, while the loops still run."""
        if self.settings.stop_workers_on_exit and self.workers.active:
            count = len(self.workers.active)
            log.info("stopping the %d worker(s) of this node before exiting", count)
            left = await self.workers.stop_all(WORKERS_STOP_REASON, WORKERS_STOP_TIMEOUT_S)
            if left:
                log.warning("%d worker(s) did not end in time: %s", len(left), ", ".join(left))
            else:
                log.info("stopped and reported %d worker(s)", count)
        await self.checks.stop()
        await self.mdns.close()  # its names withdrawn: no responder is left behind them
        await self.forwards.close_all()
        if self.reserved is not None:
            await self.reserved.close_all()
        if self.proxy is not None:
            await self.proxy[2].stop()
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._gpus.close)  # NVML shut down after the last heartbeat

    async def _start_proxy(self) -> None:
        if self.proxy is None:
            return
        endpoints, _, server = self.proxy
        try:
            await server.start()
        except OSError as exc:
            log.error(
                "the endpoint proxy cannot listen on %s (%s): this node serves no endpoint "
                "URL (GPUFLEET_PROXY_LISTEN)",
                self.settings.proxy_listen,
                exc,
            )
            return
        self.proxy_url = endpoints.template.template
        self._spawn(endpoints.run(), "endpoints")
        log.info("endpoint proxy on %s: %s", self.settings.proxy_listen, self.proxy_url)

    async def _prune_kept_outputs(self) -> None:
        """The output archives kept after a failed upload, removed past their time, now
        and every hour (steps/outputs.py)."""
        root, max_age_s = self.settings.agent_state_dir, self.settings.kept_outputs_hours * 3600
        while True:
            gone = await asyncio.to_thread(prune_kept, root, max_age_s)
            if gone:
                log.info("kept outputs removed after their time: %s", ", ".join(gone))
            await asyncio.sleep(KEPT_OUTPUTS_PRUNE_S)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=f"node-agent-{name}"))

    # --- registration and heartbeats ------------------------------------------------

    def registration(self) -> RegisterNode:
        inv = self._inventory()
        s = self.settings
        return RegisterNode(
            minion_id=s.minion_id,
            name=s.node_name,
            region=s.region,
            owner=s.account,
            hostname=self.hostname,
            gpus=inv.gpus,
            simulated=inv.simulated,
            inventory_source=inv.source,
            driver_version=inv.driver_version,
            price_per_gpu_hour=s.price_per_gpu_hour,
            gpu_shares=s.gpu_shares,
            cpu_job_cpus=offered_cpus(s.cpu_job_cpus, inv.logical_cpus(), len(inv.gpus)),
            price_per_cpu_hour=s.price_per_cpu_hour,
            agent_started_at=self.started_at,
            hardware=inv.hardware,
            heartbeat_s=s.heartbeat_s,
            sealing_key=None if self.sealing_key is None else self.sealing_key.public_key,
            sealing_key_signature=None if self.sealing_key is None else self.sealing_key.signature,
            environments=offer(parse_env_map(s.base_environments)),  # R-JOB-7
            proxy_url=self.proxy_url,  # its endpoints' URLs (proxy/)
        )

    async def _register(self) -> None:
        msg = self.registration()
        msg_id = f"register:{self.minion_id}:{self.started_at.isoformat()}"
        delay = 0.5
        while True:
            try:
                await publish(self.publisher, msg, source=SOURCE, msg_id=msg_id)
            except Exception as exc:
                log.warning("registration not acknowledged, retrying in %.0fs: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            log.info(
                "registered node %s (%d GPUs, simulated=%s)",
                self.minion_id,
                len(msg.gpus),
                msg.simulated,
            )
            self.registered.set()
            return

    async def heartbeat(self) -> NodeHeartbeat:
        gpus = await asyncio.to_thread(self._gpus.sample, gpus_in_use(self.workers))
        host = await asyncio.to_thread(self._host.sample)
        self.metrics.sampled(gpus, host)
        self._heartbeat_seq += 1
        return NodeHeartbeat(
            minion_id=self.minion_id,
            at=self.clock(),
            seq=self._heartbeat_seq,
            running=self.workers.running(),
            gpus=gpus,
            cpu_pct=host.cpu_pct,
            ram_used_mb=host.ram_used_mb,
            disk_used_pct=host.disk_used_pct,
            disk_free_gb=host.disk_free_gb,
            disk_read_bytes=host.disk_read_bytes,
            disk_write_bytes=host.disk_write_bytes,
        )

    async def _heartbeats(self) -> None:
        while True:
            try:
                hb = await self.heartbeat()
                await publish(self.publisher, hb, source=SOURCE)  # core NATS: no stream holds it
            except Exception as exc:
                log.warning("heartbeat not sent: %s", exc)
            await asyncio.sleep(self.settings.heartbeat_s)

    def _inventory(self) -> Inventory:
        if self.inventory is None:
            raise RuntimeError("the inventory is read at start-up, before this")
        return self.inventory

    # --- commands ---------------------------------------------------------------------

    async def on_start_worker(self, cmd: StartWorker) -> None:
        if cmd.minion_id != self.minion_id:
            log.error(
                "StartWorker for minion %s reached %s; ignored", cmd.minion_id, self.minion_id
            )
            return
        self.workers.start(cmd)

    async def on_stop_worker(self, cmd: StopWorker) -> None:
        if cmd.minion_id != self.minion_id:
            log.error("StopWorker for minion %s reached %s; ignored", cmd.minion_id, self.minion_id)
            return
        self.workers.stop(cmd.job_id, cmd.worker, cmd.placement_id, cmd.reason)

    async def health(self, body: HealthCheck) -> NodeHealth:
        """This node's health: its GPUs and the workers it runs."""
        inv = self.inventory
        return NodeHealth(
            service="node-agent",
            status="ok" if inv is not None else "starting",
            version=VERSION,
            collections=[],
            minion_id=self.minion_id,
            simulated=None if inv is None else inv.simulated,
            gpus=0 if inv is None else len(inv.gpus),
            running=self.workers.running(),
            started_at=self.started_at.isoformat(),
        )
