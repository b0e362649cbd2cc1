"""What every gpufleet service process shares: broker, streams, store, outbox relay, health.

A service's composition root (`app.py`) builds a `ServiceRuntime` from its ports and then
declares, in one readable block, which subject goes to which handler:

    rt = ServiceRuntime("billing", broker, store, indexes=INDEXES)
    rt.on_event(WorkerFinished, "on-worker-finished")(handler)
    rt.on_request("balance")(handler)
    app = rt.app

Every runtime with infrastructure also answers `health` and `dead_letters` (an account's
own dead letters) and the operators' `dead_letters` (everyone's): gpufleet_contracts.deadletters.
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from faststream import AsyncAPI, FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.security import NatsCredentials, NatsSecurity
from gpufleet_auth.creds import connect_options
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.deadletters import VERB as DEAD_LETTERS
from gpufleet_contracts.deadletters import ListDeadLetters
from gpufleet_contracts.health import Health
from gpufleet_store import IndexSpec, Store
from gpufleet_telemetry import configure
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic_settings import BaseSettings, SettingsConfigDict

from .accounts import NoAccountError, account_of, account_subject
from .deadletter import dead_letter_middleware, envelope_decoder
from .dlq import read_dead_letters
from .fastpath import FastRequests, Handler
from .outbox import OutboxRelay
from .streams import ensure_streams, stream_for

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

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


# The inbox prefix each broker was made with (its identity's own: `_INBOX.<public key>`).
_INBOXES: weakref.WeakKeyDictionary[NatsBroker, str] = weakref.WeakKeyDictionary()


def inbox_of(broker: NatsBroker) -> str:
    """The inbox prefix of a broker made by make_broker (`_INBOX` for any other)."""
    return _INBOXES.get(broker, "_INBOX")


def make_broker(
    service: str, settings: BusSettings | None = None, *, dead_letters_as: str | None = None
) -> NatsBroker:
    """The broker of `service`; its dead letters go to `gpufleet.v1.dlq.<dead_letters_as or
    service>.<account>` (a node agent: `node-<minion_id>`, the only one it may publish)."""
    settings = settings or BusSettings()
    tracer_provider, meter_provider = configure(service)
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
        middlewares=[
            NatsTelemetryMiddleware(tracer_provider=tracer_provider, meter_provider=meter_provider),
            dead_letter_middleware(dead_letters_as or service),
        ],
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
    )
    _INBOXES[broker] = str(options.get("inbox_prefix", "_INBOX"))
    return broker


class ServiceRuntime:
    def __init__(
        self,
        service: str,
        broker: NatsBroker,
        store: Store | None,
        *,
        indexes: IndexSpec | None = None,
        bus: BusSettings | None = None,
        outbox_keep: timedelta = timedelta(hours=1),
        infrastructure: bool = True,
    ) -> None:
        """`infrastructure=False` (the node agent): no stream declarations and no shared
        health subject, which its credential does not allow."""
        self.service = service
        self.broker = broker
        self.store = store
        self.indexes = indexes or {}
        self.bus = bus or BusSettings()
        self.source = f"gpufleet/{service}"
        self.relay = (
            OutboxRelay(store, broker, self.source, keep=outbox_keep) if store is not None else None
        )
        # Subjects served on the raw connection (fastpath.py) are declared here, for the
        # AsyncAPI document only: this broker is never connected.
        self.schema_broker = NatsBroker(broker.specification.url, logger=None)
        self.fast = FastRequests(service, broker, self.schema_broker)
        self.app = FastStream(
            broker,
            logger=logging.getLogger(f"gpufleet.{service}"),
            specification=AsyncAPI(
                broker,
                self.schema_broker,
                title=f"gpufleet {service}",
                version=VERSION,
                description=f"Subjects the gpufleet {service} handles and publishes.",
            ),
        )
        self.infrastructure = infrastructure
        self.inbox_prefix = (inbox_of(broker) + ".").encode()
        self.app.on_startup(self._prepare)
        self.app.after_startup(self._started)
        self.app.on_shutdown(self._stopping)
        if infrastructure:
            self.on_request("health")(self._health)
            self.on_request(
                DEAD_LETTERS, description="The acting account's dead letters, newest first."
            )(self._dead_letters)
            self.on_admin(DEAD_LETTERS, description="Every account's dead letters, newest first.")(
                self._all_dead_letters
            )

    async def _prepare(self) -> None:
        # The broker's own connection (connect() is idempotent; start() reuses it).
        nc = await self.broker.connect()
        if self.infrastructure:
            await ensure_streams(nc.jetstream(), replicas=self.bus.stream_replicas)
        if self.store is not None:
            await self.store.ensure_indexes(self.indexes)

    async def _started(self) -> None:
        await self.fast.start()
        if self.relay is not None:
            self.relay.start()

    async def _stopping(self) -> None:
        await self.fast.stop()
        if self.relay is not None:
            await self.relay.stop()

    async def _health(self) -> dict[str, Any]:
        collections = await self.store.collections() if self.store is not None else []
        return Health(
            service=self.service, status="ok", version=VERSION, collections=collections
        ).model_dump()

    async def _dead_letters(self, body: ListDeadLetters, msg: NatsMessage) -> dict[str, Any]:
        """Only the acting account's: the subject it asked on names it (account_of)."""
        return await self._read_dead_letters(
            subjects.dead_letter(self.service, account_of(msg)), body.limit
        )

    async def _all_dead_letters(self, body: ListDeadLetters) -> dict[str, Any]:
        return await self._read_dead_letters(subjects.dead_letter(self.service, "*"), body.limit)

    async def _read_dead_letters(self, subject: str, limit: int) -> dict[str, Any]:
        nc = await self.broker.connect()
        records = await read_dead_letters(nc.jetstream(), subject, limit)
        return {"service": self.service, "dead_letters": records}

    # --- wiring ---------------------------------------------------------------------

    def on_event(
        self,
        message: type[Message],
        durable: str,
        *,
        subject: str | None = None,
        max_workers: int = 1,
        consumer: ConsumerConfig | None = None,
        types: Sequence[type[Message]] = (),
    ) -> Callable[[F], F]:
        """A durable JetStream pull consumer for `message`, acked by the dead-letter policy.

        Its messages must carry the CloudEvents headers of a command or event, and a
        `ce-type` that is `message`'s TYPE (or that of one of `types`, when the subject
        carries several): any other is dead-lettered before the handler runs
        (deadletter.envelope_decoder).

        FastStream handles the messages of one pull batch concurrently, so the batch is one
        message: each consumer sees its subject in stream order, one at a time. `consumer`
        names an existing consumer (made by someone allowed to) instead of
        `<service>-<durable>`.
        """
        # `{minion_id}`-style keys of the subject: every value of them
        subject = subject or re.sub(r"\{[^}]*\}", "*", message.SUBJECT)
        stream = stream_for(subject)
        if stream is None:
            raise ValueError(f"no stream holds {subject}")
        name = (
            consumer.durable_name
            if consumer and consumer.durable_name
            else f"{self.service}-{durable}"
        )
        return self._decorator(
            self.broker.subscriber(
                subject,
                stream=JStream(stream, declare=False),
                durable=name,
                pull_sub=PullSub(batch_size=1, timeout=1.0),
                config=consumer
                or ConsumerConfig(
                    durable_name=name,
                    ack_wait=60,
                    max_deliver=-1,
                    deliver_policy=DeliverPolicy.ALL,
                ),
                ack_policy=AckPolicy.MANUAL,
                max_workers=max_workers,
                # pull requests are answered on this identity's own inbox (the only one its
                # credential may subscribe to); FastStream's default is the shared `_INBOX.`
                inbox_prefix=self.inbox_prefix,
                title=f"{self.service}:{durable}",
                description=message.__doc__,
                decoder=envelope_decoder([m.TYPE for m in (types or (message,))]),
            )
        )

    def publishes(self, *messages: type[Message]) -> None:
        """Declare what this service publishes (through its outbox), for the AsyncAPI document.

        The outbox relay does the publishing; these publishers exist so the generated
        document lists every subject a service emits, with its payload schema.
        """
        for message in messages:
            stream = stream_for(message.SUBJECT.replace("{", "").replace("}", ""))
            self.broker.publisher(
                message.SUBJECT,
                stream=JStream(stream, declare=False) if stream else None,
                title=f"{self.service}:{message.__name__}",
                description=message.__doc__,
                schema=message,
            )

    def on_request(
        self, verb: str, *, description: str | None = None, max_workers: int = 1
    ) -> Callable[[F], F]:
        """An account's request/reply on `gpufleet.v1.rpc.<service>.<verb>.<account>` (core
        NATS, queue-grouped); the handler reads the acting account with `account_of(msg)`."""
        return self._decorator(
            self.broker.subscriber(
                account_subject(self.service, verb),
                queue=f"{self.service}-rpc",
                max_workers=max_workers,
                ack_policy=AckPolicy.MANUAL,
                title=f"{self.service}:{verb}",
                description=description,
            )
        )

    def on_admin(self, verb: str, *, description: str | None = None) -> Callable[[F], F]:
        """An operator's request/reply on `gpufleet.v1.adm.<service>.<verb>`: only operator
        credentials may publish there (gpufleet_auth.permissions)."""
        return self._decorator(
            self.broker.subscriber(
                subjects.admin(self.service, verb),
                queue=f"{self.service}-adm",
                ack_policy=AckPolicy.MANUAL,
                title=f"{self.service}:admin:{verb}",
                description=description,
            )
        )

    def on_fast_request(
        self,
        verb: str,
        model: type[Message],
        *,
        description: str | None = None,
        concurrency: int = 256,
    ) -> Callable[[Handler], Handler]:
        """Like `on_request`, served on the raw nats-py connection (see fastpath.py): for the
        subjects that carry a fleet's load. The handler gets the decoded body and the acting
        account."""
        return self.fast.route(verb, model, description, concurrency)

    @staticmethod
    def _decorator(subscriber: Any) -> Callable[[F], F]:
        """A FastStream subscriber used as a plain decorator that keeps the handler's type."""

        def register(fn: F) -> F:
            subscriber(fn)
            return fn

        return register


def env_flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    return default if v is None else v.lower() in {"1", "true", "yes", "on"}


__all__: Sequence[str] = [
    "BusSettings",
    "NoAccountError",
    "ServiceRuntime",
    "account_of",
    "env_flag",
    "make_broker",
]
