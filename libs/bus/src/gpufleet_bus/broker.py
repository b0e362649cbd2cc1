"""A service's connection to the bus: its settings (`GPUFLEET_NATS_*`) and its broker."""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsSecurity
from gpufleet_auth.creds import connect_options
from gpufleet_telemetry import configure
from pydantic_settings import BaseSettings, SettingsConfigDict

from .deadletter import dead_letter_middleware

VERSION = "0.1.0"


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")
    nats_url: str = "nats://127.0.0.1:4333"
    stream_replicas: int = 1
    # This process's credential (a NATS `.creds` file): who it is on the bus.
    nats_creds: Path | None = None
    # TLS: the CA that signed the servers' certificates (compose); tls:// URLs then verify.
    nats_ca: Path | None = None

    @property
    def servers(self) -> list[str]:
        return [s.strip() for s in self.nats_url.split(",") if s.strip()]

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of `nats.connect` (and NatsBroker) for this identity."""
        return connect_options(self.nats_creds, self.nats_ca)


@dataclass(frozen=True)
class _Made:
    """What make_broker knew of a broker that FastStream does not keep."""

    inbox: str  # its identity's own inbox prefix: `_INBOX.<public key>`
    dead_letters_as: str  # the service token of its dead letters


_MADE: weakref.WeakKeyDictionary[NatsBroker, _Made] = weakref.WeakKeyDictionary()


def inbox_of(broker: NatsBroker) -> str:
    """The inbox prefix of a broker made by make_broker (`_INBOX` for any other)."""
    made = _MADE.get(broker)
    return made.inbox if made else "_INBOX"


def dead_letters_of(broker: NatsBroker) -> str | None:
    """The name a broker made by make_broker dead-letters under (`dead_letters_as`)."""
    made = _MADE.get(broker)
    return made.dead_letters_as if made else None


def make_broker(
    service: str, settings: BusSettings | None = None, *, dead_letters_as: str | None = None
) -> NatsBroker:
    """The broker of `service`; its dead letters go to `gpufleet.v1.dlq.<dead_letters_as or
    service>.<account>` (a node agent: `node-<minion_id>`, the only one it may publish)."""
    settings = settings or BusSettings()
    configure(service)
    options = settings.connect_options()
    creds, tls = options.pop("user_credentials", None), options.pop("tls", None)
    security: NatsSecurity | None = None
    if creds is not None:
        security = NatsCredentials(creds, ssl_context=tls)
    elif tls is not None:
        security = NatsSecurity(ssl_context=tls)
    broker = NatsBroker(
        settings.servers,
        name=f"gpufleet-{service}",
        security=security,
        **options,
        # FastStream's per-message access log goes through our log format, at DEBUG.
        logger=logging.getLogger(f"gpufleet.{service}.bus"),
        log_level=logging.DEBUG,
        # No FastStream telemetry middleware: its span per message is what tracing.py makes
        # for the sampled jobs alone.
        middlewares=[dead_letter_middleware(dead_letters_as or service)],
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
    )
    _MADE[broker] = _Made(str(options.get("inbox_prefix", "_INBOX")), dead_letters_as or service)
    return broker


def env_flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    return default if v is None else v.lower() in {"1", "true", "yes", "on"}


__all__: Sequence[str] = ["BusSettings", "env_flag", "inbox_of", "make_broker"]
