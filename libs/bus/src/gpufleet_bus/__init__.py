"""The bus shared by gpufleet services: FastStream on NATS JetStream (runtime.py: the shape)."""

from gpufleet_auth.creds import connect_options

from .accounts import (
    NoAccountError,
    account_of,
    account_subject,
    node_of,
    on_its_own_subject,
    received_at,
)
from .ask import Asker, ask
from .broker import BusSettings, env_flag, make_broker
from .deadletter import MAX_DELIVER, UnknownMessageType, dead_letter_middleware
from .outbox import OutboxRelay
from .periodic import Every
from .publish import emit, publish, publish_raw
from .requests import Request
from .runner import StartError, run_service
from .runtime import ServiceRuntime
from .streams import STREAMS, ensure_streams, stream_for
from .wiring import Batched, Delivery, Events, Ports, Service, Wired

__all__ = [
    "MAX_DELIVER",
    "STREAMS",
    "Asker",
    "Batched",
    "BusSettings",
    "Delivery",
    "Events",
    "Every",
    "NoAccountError",
    "OutboxRelay",
    "Ports",
    "Request",
    "Service",
    "ServiceRuntime",
    "StartError",
    "UnknownMessageType",
    "Wired",
    "account_of",
    "account_subject",
    "ask",
    "connect_options",
    "dead_letter_middleware",
    "emit",
    "ensure_streams",
    "env_flag",
    "make_broker",
    "node_of",
    "on_its_own_subject",
    "publish",
    "publish_raw",
    "received_at",
    "run_service",
    "stream_for",
]
