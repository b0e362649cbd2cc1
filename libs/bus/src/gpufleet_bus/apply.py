"""`python -m gpufleet_bus.apply`: as an operator, apply this release's stream configuration
(create what is missing, update what differs, delete the streams of earlier releases).

A service may create a missing stream but never change one (streams.py), so an upgrade that
changes a stream's subjects or limits waits for an operator: `just up` does it itself; in
compose, run this once with an operator's credential (docs/reliability.md, "Upgrading the
streams"). It reads the bus settings every process reads (GPUFLEET_NATS_URL,
GPUFLEET_NATS_CREDS, GPUFLEET_NATS_CA, GPUFLEET_STREAM_REPLICAS).
"""

from __future__ import annotations

import asyncio

import nats

from .broker import BusSettings
from .streams import STREAMS, ensure_streams


async def apply(settings: BusSettings) -> list[str]:
    """The names of the streams as they are now, applied."""
    nc = await nats.connect(settings.servers, connect_timeout=5, **settings.connect_options())
    try:
        await ensure_streams(nc.jetstream(), settings.stream_replicas, update=True)
    finally:
        await nc.close()
    return [spec.name for spec in STREAMS]


def main() -> None:
    names = asyncio.run(apply(BusSettings()))
    print("applied:", ", ".join(names))


if __name__ == "__main__":
    main()
