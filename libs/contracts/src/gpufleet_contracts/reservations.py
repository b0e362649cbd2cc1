"""Port reservations (R-RES-3): an account's `hostname` + `port` in one of its regions, which
a job or endpoint attached to it serves on, published with mDNS (`<hostname>.local`) by the
node that runs it, on the interfaces its operator allows. Two reservations of a region of an
owner never share hostname and port; a region is the owner's own (`<owner>/<region>`)."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from . import limits, subjects
from .base import Command, Event
from .fields import Int, Name

# One DNS label, lower case (mDNS names are compared without case): `<label>.local`.
HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
HOSTNAME_VALID = "one DNS label: 1-63 lower-case letters, digits and -, not at either end"


class ReservationType(StrEnum):
    port = "port"  # the only one (R-RES-3)


def hostname_problem(hostname: str) -> str | None:
    if HOSTNAME.fullmatch(hostname) is None:
        return "not " + HOSTNAME_VALID
    return None


class ReservationView(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    region: str
    region_id: str  # `<owner>/<region>`
    type: ReservationType
    hostname: str
    port: int
    created_at: datetime


class Reservations(BaseModel):
    reservations: list[ReservationView]


class AddReservation(Command):
    """A port reservation in one of the acting account's regions (R-RES-1, R-RES-3)."""

    TYPE = "gpufleet.datastore.add_reservation.v1"
    SUBJECT = subjects.rpc("datastore", "add_reservation")
    REPLY = ReservationView
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    type: ReservationType = ReservationType.port
    hostname: str = Field(min_length=1, max_length=63)
    port: Int = Field(ge=1, le=65535)


class ListReservations(Command):
    READ = True
    TYPE = "gpufleet.datastore.list_reservations.v1"
    SUBJECT = subjects.rpc("datastore", "list_reservations")
    REPLY = Reservations
    region: Name | None = Field(default=None, max_length=limits.NAME_CHARS)


class RemoveReservation(Command):
    TYPE = "gpufleet.datastore.remove_reservation.v1"
    SUBJECT = subjects.rpc("datastore", "remove_reservation")
    REPLY = ReservationView
    region: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)


class ReservationAdded(Event):
    TYPE = "gpufleet.reservation.added.v1"
    SUBJECT = subjects.event("datastore", "reservation_added")
    account: str
    region_id: str
    name: str
    hostname: str
    port: int
    at: datetime


class ReservationRemoved(Event):
    TYPE = "gpufleet.reservation.removed.v1"
    SUBJECT = subjects.event("datastore", "reservation_removed")
    account: str
    region_id: str
    name: str
    at: datetime


class GetReservation(Command):
    """A node agent's request for a reservation of its own region and owner, to publish
    (the datastore service reads the node from the subject): another's is "not found"."""

    READ = True

    TYPE = "gpufleet.datastore.node_reservation.v1"
    SUBJECT = subjects.node_request("datastore", "node_reservation")
    REPLY = ReservationView
    name: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
