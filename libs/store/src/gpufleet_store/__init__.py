"""MongoDB access for gpufleet services through PyMongo's AsyncMongoClient.

Each service owns one database, `<prefix>_<service>`, and only its own collections in it.
State changes and the events they cause are written in one transaction (`Store.transaction`),
the events into the `outbox` collection; `gpufleet_bus.OutboxRelay` publishes them after the
commit. A crash between the two loses nothing: the relay publishes what is left on restart,
and JetStream drops the duplicate: each message keeps its id (`Nats-Msg-Id`) inside its
outbox document. Secrets are stored sealed (`SecretBox`, gpufleet_store.secrets), outbox
messages that carry one too.
"""

from gpufleet_contracts.clock import Clock, utcnow

from .secrets import SecretBox, SecretError
from .store import Doc, IndexSpec, Store, StoreSettings, Transaction, from_ms, now_ms

__all__ = [
    "Clock",
    "Doc",
    "IndexSpec",
    "SecretBox",
    "SecretError",
    "Store",
    "StoreSettings",
    "Transaction",
    "from_ms",
    "now_ms",
    "utcnow",
]
