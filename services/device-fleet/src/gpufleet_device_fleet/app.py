"""Composition root of device-fleet.

Edge devices (Jetson) and their inference configurations (R-DEV-*).
This release: the service starts, owns its collections and answers health; the
features follow in their own issues.
"""

from __future__ import annotations

from faststream import FastStream
from faststream.nats import NatsBroker
from gpufleet_bus import ServiceRuntime
from gpufleet_store import Store
from pymongo import ASCENDING, IndexModel

SERVICE = "device-fleet"

INDEXES = {
    "devices": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True),
        IndexModel([("minion_id", ASCENDING)], unique=True),
    ],
    "device_configs": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True)
    ],
}


def build_app(store: Store, broker: NatsBroker) -> FastStream:
    return ServiceRuntime(SERVICE, broker, store, indexes=INDEXES).app
