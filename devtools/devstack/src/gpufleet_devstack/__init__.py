"""Starts the real servers gpufleet needs (nats-server, an embedded MongoDB) and its
service processes, for the test suite and for `just up`."""

from gpufleet_devstack.mongo import EmbeddedMongo
from gpufleet_devstack.nats import NatsServer, NatsServerNotFoundError, ensure_nats_server
from gpufleet_devstack.processes import (
    DevstackError,
    PortInUseError,
    ServiceProcess,
    free_port,
    port_in_use,
    wait_for,
    wait_for_async,
)

__all__ = [
    "DevstackError",
    "EmbeddedMongo",
    "NatsServer",
    "NatsServerNotFoundError",
    "PortInUseError",
    "ServiceProcess",
    "ensure_nats_server",
    "free_port",
    "port_in_use",
    "wait_for",
    "wait_for_async",
]
