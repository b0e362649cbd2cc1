"""Composition root of device-fleet.

Edge devices (Jetson) and their inference configurations (R-DEV-*).
This release: the service starts, owns its collections and answers health; the
features follow in their own issues.
"""

from __future__ import annotations

from gpufleet_bus import Ports, Service, ServiceRuntime
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


def build_app(ports: Ports) -> Service[None]:
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
    rt.wire()  # health and dead letters only, for now
    return rt.built(None)
