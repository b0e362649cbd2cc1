"""A worker attached to a port reservation (R-RES-3): its hostname published with mDNS by
this node (host/mdns.py) from its setup until its teardown. The reservation's hostname and
port come from the datastore service, which answers only for this node's region and owner;
a rename on the LAN (`demo` taken: `demo-2`) is said in the worker's log.

A bare process listens on the node's port itself. A job in a container (which keeps no
network) is served by the node: the reservation's port on the allowed interfaces carried
to the worker's socket (host/port_forward.py), which the relay in its container takes on to
the job's port (steps/serve.py); the reservation is kept in the worker's directory
(`reservation.json`) for its container to be made with. An endpoint's or notebook's port is
served by the node's proxy (proxy/reserved.py), which checks its callers' keys or token as
on its URL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet_contracts.reservations import GetReservation, ReservationView

from ..host.mdns import MdnsPublisher, PublishFailed
from ..host.port_forward import ForwardFailed, PortForwards
from ..noderpc import NotAnswered, NotThere, ask_service
from ..staging.platform import Requester
from ..worker.files import read_json, write_json_atomic
from . import serve
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..proxy.reserved import ReservedPorts
    from ..worker.workdir import Worker

AskReservation = Callable[[str], Awaitable[ReservationView]]
KEPT = "reservation.json"  # in the worker's directory: the reservation it serves on
BARE = "process"  # the runtime of a bare process (runtimes/policy.py), which serves itself


def kept(worker_dir: Path) -> ReservationView | None:
    """The reservation the worker of `worker_dir` serves on, once its setup found it."""
    doc = read_json(worker_dir / KEPT)
    return ReservationView.model_validate(doc) if doc else None


def node_serves(w: Worker) -> bool:
    """Whether the node carries the worker's reserved port to it: a job in a container
    (an endpoint's is served by the proxy: `proxy_serves`; a bare process listens itself)."""
    return w.spec.reservation is not None and w.spec.serving is None and w.runtime != BARE


def proxy_serves(w: Worker) -> bool:
    """Whether the node's proxy serves the worker's reserved port: an endpoint or notebook."""
    return w.spec.reservation is not None and w.spec.serving is not None


def reservation_asker(minion_id: str, request: Requester) -> AskReservation:
    """GetReservation for this node: the reservation, or WorkerFailed saying why not."""

    async def ask(name: str) -> ReservationView:
        try:
            return await ask_service(request, minion_id, GetReservation(name=name), ReservationView)
        except NotThere:
            raise WorkerFailed(f"reservation {name} not found in this node's region") from None
        except NotAnswered as exc:
            raise WorkerFailed(f"reservation {name}: {exc}") from None

    return ask


class ReservationStep:
    """`ask(name)`: the reservation of this node's region, or WorkerFailed saying why not;
    `forwards`: a container job's port carried to it; `reserved`: an endpoint's port served
    by the proxy (None: the node has no proxy, and an endpoint with a reservation fails)."""

    name = StepName.reservation
    marked = False  # publishing again is as cheap as a marker

    def __init__(
        self,
        publisher: MdnsPublisher,
        ask: AskReservation,
        forwards: PortForwards | None = None,
        reserved: ReservedPorts | None = None,
    ) -> None:
        self.publisher = publisher
        self.ask = ask
        self.forwards = forwards
        self.reserved = reserved

    async def setup(self, w: Worker) -> None:
        r = w.spec.reservation
        if r is None:
            return
        found = await self.ask(r.name)
        write_json_atomic(w.file(KEPT), found.model_dump(mode="json"))
        if self.forwards is not None and node_serves(w):
            try:
                await self.forwards.open(w.key, found.port, serve.port_socket_path(w.dir))
            except ForwardFailed as exc:
                raise WorkerFailed(f"reservation {r.name}: {exc}") from None
        if proxy_serves(w):
            if self.reserved is None:
                raise WorkerFailed(
                    f"reservation {r.name}: this node has no endpoint proxy "
                    "(GPUFLEET_PROXY_LISTEN=off) to serve its port"
                )
            try:
                await self.reserved.open(w.key, w.job_id, found.port)
            except ForwardFailed as exc:
                raise WorkerFailed(f"reservation {r.name}: {exc}") from None
        try:
            done = await self.publisher.publish(w.key, found.hostname, found.port)
        except PublishFailed as exc:
            raise WorkerFailed(f"reservation {r.name}: {exc}") from None
        if done.renamed_from is not None:
            with w.file("log").open("a") as log:
                log.write(
                    f"[gpufleet] {done.renamed_from}.local is taken on the LAN: reservation "
                    f"{r.name} is published as {done.hostname}.local:{done.port}\n"
                )

    async def teardown(self, w: Worker) -> None:
        if self.forwards is not None:
            await self.forwards.close(w.key)
        if self.reserved is not None:
            await self.reserved.close(w.key)
        await self.publisher.withdraw(w.key)
