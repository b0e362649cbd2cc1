"""The `reservations` collection: an account's port reservations (R-RES-3), each in one of its
own regions (R-RES-1, as for datastores: a region with a compute node or device, a `team`+
plan), unique by name and by hostname + port in that region of that owner (two unique
indexes: a race of two adds ends with one `conflict`). A node of the region and owner may
read one to publish it (`for_node`); another account's answers "not found"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpufleet_bus.ask import Asker
from gpufleet_bus.publish import emit
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.datastores import GetNodeFacts, NodeFacts
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.fields import name_problem
from gpufleet_contracts.reservations import (
    HOSTNAME_VALID,
    AddReservation,
    ReservationAdded,
    ReservationRemoved,
    ReservationView,
    hostname_problem,
)
from gpufleet_store import Store, Transaction
from gpufleet_store.duplicates import colliding_key
from pymongo.errors import DuplicateKeyError

from .inregion import InRegion
from .regionfacts import checked_region
from .shares import invalid

COLLECTION = "reservations"


def view(doc: dict[str, Any]) -> ReservationView:
    return ReservationView.model_validate(doc)


def check_reservation(body: AddReservation) -> None:
    """Its name and hostname (the port's range is the contract's)."""
    for field, problem, valid in (
        ("name", name_problem(body.name), None),
        ("hostname", hostname_problem(body.hostname), HOSTNAME_VALID),
    ):
        if problem is not None:
            raise invalid(field, "R-RES-3", problem, valid)


# The unique keys of a reservation: its hostname + port (first), its name (its `_id` holds it).
UNIQUE_KEYS = (("owner", "region", "hostname", "port"), ("_id",), ("owner", "region", "name"))


class PortReservations:
    def __init__(self, store: Store, provisioner: Asker, clock: Clock) -> None:
        self.store = store
        self.records = InRegion(store, COLLECTION, "reservation", clock)
        self.coll = self.records.coll
        self.provisioner = provisioner
        self.clock = clock

    async def add(self, account: str, body: AddReservation) -> ReservationView:
        check_reservation(body)
        facts = await checked_region(self.provisioner, account, body.region)
        now = self.clock()
        doc: dict[str, Any] = {
            "_id": f"{account}/{body.region}/{body.name}",
            "owner": account,
            "region": body.region,
            "region_id": facts.region_id,
            "name": body.name,
            "type": body.type.value,
            "hostname": body.hostname,
            "port": body.port,
            "created_at": now,
        }

        async def tx_body(tx: Transaction) -> None:
            await self.coll.insert_one(doc, session=tx.session)
            emit(
                tx,
                ReservationAdded(
                    account=account,
                    region_id=facts.region_id,
                    name=body.name,
                    hostname=body.hostname,
                    port=body.port,
                    at=now,
                ),
                msg_id=f"reservation-added:{doc['_id']}:{now.timestamp()}",
            )

        try:
            await self.store.transaction(tx_body)
        except DuplicateKeyError as exc:
            which = await colliding_key(exc, self.coll, doc, UNIQUE_KEYS)
            if which is None:
                raise
            taken = "hostname" if which == 0 else "name"
            says = (
                f"{body.hostname}:{body.port} is reserved already in region {body.region}"
                if taken == "hostname"
                else f"reservation {body.name!r} exists already in region {body.region}"
            )
            raise Refused.of_field(
                "conflict", says, field=taken, rule="R-RES-3", says="unique in its region"
            ) from None
        return view(doc)

    async def list(self, account: str, region: str | None) -> list[ReservationView]:
        return [view(d) for d in await self.records.docs(account, region)]

    async def remove(self, account: str, region: str, name: str) -> ReservationView:
        def removed(doc: dict[str, Any], now: datetime) -> ReservationRemoved:
            return ReservationRemoved(
                account=account, region_id=doc["region_id"], name=name, at=now
            )

        return view(await self.records.remove(account, region, name, removed))

    async def for_node(self, minion_id: str, name: str) -> ReservationView:
        """The reservation `name` of the asking node's own region and owner."""
        node = await self.provisioner(GetNodeFacts(minion_id=minion_id), NodeFacts)
        return view(await self.records.own(node.owner, node.region, name))
