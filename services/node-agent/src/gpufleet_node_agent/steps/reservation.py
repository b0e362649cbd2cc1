"""A worker attached to a port reservation (R-RES-3): its hostname published with mDNS by
this node (host/mdns.py) from its setup until its teardown. The reservation's hostname and
port come from the datastore service, which answers only for this node's region and owner;
a rename on the LAN (`demo` taken: `demo-2`) is said in the worker's log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gpufleet_contracts.reservations import GetReservation, ReservationView

from ..host.mdns import MdnsPublisher, PublishFailed
from ..noderpc import NotAnswered, NotThere, ask_service
from ..staging.platform import Requester
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

AskReservation = Callable[[str], Awaitable[ReservationView]]


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
    """`ask(name)`: the reservation of this node's region, or WorkerFailed saying why not."""

    name = StepName.reservation
    marked = False  # publishing again is as cheap as a marker

    def __init__(self, publisher: MdnsPublisher, ask: AskReservation) -> None:
        self.publisher = publisher
        self.ask = ask

    async def setup(self, w: Worker) -> None:
        r = w.spec.reservation
        if r is None:
            return
        found = await self.ask(r.name)
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
        await self.publisher.withdraw(w.key)
