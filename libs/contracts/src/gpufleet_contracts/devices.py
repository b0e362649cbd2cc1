"""Edge device events (PRODUCT.md section 4), as billing and other systems see them."""

from __future__ import annotations

from datetime import datetime

from . import subjects
from .base import Event
from .fields import Name


class DeviceAdded(Event):
    TYPE = "gpufleet.device.added.v1"
    SUBJECT = subjects.event("device", "added")
    device_id: str
    account: str
    region: Name
    model: str
    at: datetime


class DeviceRemoved(Event):
    TYPE = "gpufleet.device.removed.v1"
    SUBJECT = subjects.event("device", "removed")
    device_id: str
    account: str
    region: Name
    at: datetime
