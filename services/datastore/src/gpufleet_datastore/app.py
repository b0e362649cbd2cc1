"""Composition root of datastore.

Regional datastores and port reservations (R-RES-*).
This release: the service starts, owns its collections and answers health; the
features follow in their own issues.
"""

from __future__ import annotations

from gpufleet_bus import Ports, Service, ServiceRuntime
from pymongo import ASCENDING, IndexModel

SERVICE = "datastore"

INDEXES = {
    "datastores": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True)
    ],
    "reservations": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True),
        IndexModel(
            [("region", ASCENDING), ("hostname", ASCENDING), ("port", ASCENDING)], unique=True
        ),
    ],
}


def build_app(ports: Ports) -> Service[None]:
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
    rt.wire()  # health and dead letters only, for now
    return rt.built(None)
