"""The bus shared by gpufleet services: FastStream on NATS JetStream."""

from .deadletter import MAX_DELIVER, dead_letter_middleware
from .outbox import OutboxRelay
from .publish import emit, publish, publish_raw
from .service import ACCOUNT_HEADER, BusSettings, ServiceRuntime, account_of, env_flag, make_broker
from .streams import STREAMS, ensure_streams, stream_for

__all__ = [
    "ACCOUNT_HEADER",
    "MAX_DELIVER",
    "STREAMS",
    "BusSettings",
    "OutboxRelay",
    "ServiceRuntime",
    "account_of",
    "dead_letter_middleware",
    "emit",
    "ensure_streams",
    "env_flag",
    "make_broker",
    "publish",
    "publish_raw",
    "stream_for",
]
