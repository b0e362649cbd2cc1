"""The bus shared by gpufleet services: FastStream on NATS JetStream."""

from gpufleet_auth.creds import connect_options

from .accounts import (
    NoAccountError,
    account_of,
    account_subject,
    node_of,
    on_its_own_subject,
    received_at,
)
from .deadletter import MAX_DELIVER, UnknownMessageType, dead_letter_middleware
from .outbox import OutboxRelay
from .publish import emit, publish, publish_raw
from .service import (
    BusSettings,
    ServiceRuntime,
    env_flag,
    make_broker,
)
from .streams import STREAMS, ensure_streams, stream_for

__all__ = [
    "MAX_DELIVER",
    "STREAMS",
    "BusSettings",
    "NoAccountError",
    "OutboxRelay",
    "ServiceRuntime",
    "UnknownMessageType",
    "account_of",
    "account_subject",
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
    "stream_for",
]
