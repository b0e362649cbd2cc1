"""Composition root of datastore.

Regional datastores and port reservations (R-RES-*).
This release: the service starts, owns its collections and answers health; the
features follow in their own issues.
"""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsBroker
from gpufleet_bus import ServiceRuntime
from gpufleet_store import Store
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


def build_app(store: Store, broker: NatsBroker) -> FastStream:
    return ServiceRuntime(SERVICE, broker, store, indexes=INDEXES).app
