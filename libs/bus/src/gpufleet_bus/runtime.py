"""The shape every gpufleet service (and the node agent) is built in.

A service's composition root (`app.py`) is a build function that takes its ports and
returns its `Service`, and declares in one table which subject goes to which handler:

    def build_app(ports: Ports, settings: BillingSettings | None = None) -> Service[Billing]:
        billing = Billing(ports.store, ports.clock)
        rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
        rt.wire(
            requests={"balance": handlers.balance},             # rpc.<service>.<verb>.<account>
            events={"worker-events": Events({WorkerPlaced: billing.worker_placed, ...})},
            every=[Every(settings.tick_s, billing.tick, "billing-clock")],
            publishes=[UsageCharged, ...],
        )
        return rt.built(billing)

- `requests` / `admin` / `direct`: request/reply, all served by gpufleet_bus.requests (one
  mechanism, one error mapping, one dead-letter path). A handler is `(body, account)` for an
  account's request, `(body)` for an operator's (`admin`) or a raw subject's (`direct`).
- `events`: durable JetStream consumers, one per entry, named `<service>-<durable>`. An
  entry is a handler (the message type is its body's annotation) or `Events`, a table of
  message type -> handler read from one consumer in stream order (the worker stream: placed,
  started and finished are seen in the order they were stored). The envelope is checked and
  the body decoded by its CloudEvents type before the handler runs; a handler is `(body)` or
  `(body, delivery)` (the subject it arrived on and when the stream stored it). The ack
  policy and the dead-letter path are deadletter.py's.
- `signals`: core NATS subjects without a reply (losing one is harmless: heartbeats, sync).
- `metrics`: the sources of its Prometheus `/metrics` (gpufleet_telemetry.exposition), served
  once serving when `ports.metrics.port` names a port.
- `every`: periodic work (periodic.py); hooks, each in order: `prepare` (before anything is
  consumed or served: streams and indexes exist), `startup` (once serving), `shutdown`.

Every runtime with infrastructure also answers `health`, an account's own `dead_letters` and
the operators' `dead_letters` (everyone's). `rt.table` lists every wired subject with its
handler as `module:function`, for the event catalogue.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from faststream import AsyncAPI, FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.deadletters import VERB as DEAD_LETTERS
from gpufleet_contracts.deadletters import DeadLetters, ListDeadLetters
from gpufleet_contracts.health import Health, HealthCheck
from gpufleet_store import IndexSpec
from gpufleet_telemetry.exposition import MetricsServer, Source
from nats.js.api import ConsumerConfig, DeliverPolicy

from . import tracing
from .accounts import account_subject, received_at
from .batches import BatchConsumer
from .broker import VERSION, inbox_of
from .deadletter import UnknownMessageType, check_envelope
from .dlq import read_dead_letters
from .outbox import OutboxRelay
from .periodic import Every
from .requests import Handler, Request, Requests, model_of, qualname, schema_handler
from .streams import ensure_streams_when_ready, stream_for
from .wiring import Batched, Delivery, EventHandler, Events, Ports, Service, T, Wired

log = logging.getLogger("gpufleet.bus")


class ServiceRuntime:
    def __init__(
        self,
        service: str,
        ports: Ports,
        *,
        indexes: IndexSpec | None = None,
        outbox_keep: timedelta = timedelta(hours=1),
        infrastructure: bool = True,
    ) -> None:
        """`infrastructure=False` (the node agent): no stream declarations and no shared
        health subject, which its credential does not allow."""
        self.service = service
        self.ports = ports
        self.broker = ports.broker
        self.store = ports.store
        self.indexes = indexes or {}
        self.bus = ports.bus
        self.source = f"gpufleet/{service}"
        self.table: list[Wired] = []
        self.relay = (
            OutboxRelay(self.store, self.broker, self.source, keep=outbox_keep)
            if self.store is not None
            else None
        )
        # Subjects served outside FastStream (requests.py) and the per-type subjects of a
        # dispatching consumer are declared here, for the AsyncAPI document only: this
        # broker is never connected.
        self.schema_broker = NatsBroker(self.broker.specification.url, logger=None)
        self.requests = Requests(service, self.broker, self.schema_broker)
        self.app = FastStream(
            self.broker,
            logger=logging.getLogger(f"gpufleet.{service}"),
            specification=AsyncAPI(
                self.broker,
                self.schema_broker,
                title=f"gpufleet {service}",
                version=VERSION,
                description=f"Subjects the gpufleet {service} handles and publishes.",
            ),
        )
        self.infrastructure = infrastructure
        self.inbox_prefix = (inbox_of(self.broker) + ".").encode()
        self._every: list[Every] = []
        self.metrics: list[Source] = []
        self.metrics_server: MetricsServer | None = None
        self.metrics_port: int | None = None  # where /metrics listens, once it does
        self.batches: list[BatchConsumer] = []
        self.app.on_startup(self._prepare)
        self.app.after_startup(self._started)
        self.app.on_shutdown(self._stopping)
        if infrastructure:
            self.wire(
                requests={
                    "health": Request(self._health, description="This service's health."),
                    DEAD_LETTERS: Request(
                        self._dead_letters,
                        description="The acting account's dead letters, newest first.",
                    ),
                },
                admin={
                    DEAD_LETTERS: Request(
                        self._all_dead_letters,
                        description="Every account's dead letters, newest first.",
                    )
                },
            )

    def built(self, core: T) -> Service[T]:
        return Service(self.app, core, self)

    # --- the wiring table -----------------------------------------------------------

    def wire(
        self,
        *,
        requests: Mapping[str, Handler | Request] | None = None,
        admin: Mapping[str, Handler | Request] | None = None,
        direct: Mapping[str, Handler | Request] | None = None,
        events: Mapping[str, EventHandler | Events | Batched] | None = None,
        signals: Mapping[str, Callable[..., Awaitable[None]]] | None = None,
        every: Sequence[Every] = (),
        metrics: Sequence[Source] = (),
        publishes: Sequence[type[Message] | tuple[type[Message], str]] = (),
        prepare: Sequence[Callable[[], Awaitable[Any]]] = (),
        startup: Sequence[Callable[[], Awaitable[Any]]] = (),
        shutdown: Sequence[Callable[[], Awaitable[Any]]] = (),
    ) -> None:
        for verb, entry in (requests or {}).items():
            subject = account_subject(self.service, verb)
            self._request("request", subject, entry, True, "rpc", f"{self.service}:{verb}")
        for verb, entry in (admin or {}).items():
            subject = subjects.admin(self.service, verb)
            self._request("admin", subject, entry, False, "adm", f"{self.service}:admin:{verb}")
        for subject, entry in (direct or {}).items():
            # titles name AsyncAPI channels: the handler's name, not a subject with wildcards
            name = (entry.handler if isinstance(entry, Request) else entry).__name__
            self._request("direct", subject, entry, False, "direct", f"{self.service}:{name}")
        for durable, spec in (events or {}).items():
            if isinstance(spec, Batched):
                self._batched(durable, spec)
                continue
            self._events(
                durable, spec if isinstance(spec, Events) else Events({_typed(spec): spec})
            )
        for subject, fn in (signals or {}).items():
            self._signal(subject, fn)
        self._every.extend(every)
        self.metrics.extend(metrics)
        self._publishes(publishes)
        for hook in prepare:
            self.app.on_startup(hook)
        for hook in startup:
            self.app.after_startup(hook)
        for hook in shutdown:
            self.app.on_shutdown(hook)

    def _request(
        self,
        kind: str,
        subject: str,
        entry: Handler | Request,
        by_account: bool,
        queue: str,
        title: str,
    ) -> None:
        req = entry if isinstance(entry, Request) else Request(entry)
        model = self.requests.add(
            subject, req, by_account=by_account, queue=f"{self.service}-{queue}", title=title
        )
        self._row(kind, subject, req.handler, model.__name__)

    def _events(self, durable: str, spec: Events) -> None:
        by_type = {m.TYPE: (m, fn, _arity(fn)) for m, fn in spec.handlers.items()}
        subject = spec.subject or _shared_subject(list(spec.handlers))
        stream = stream_for(subject)
        if stream is None:
            raise ValueError(f"no stream holds {subject}")
        name = (
            spec.consumer.durable_name
            if spec.consumer and spec.consumer.durable_name
            else f"{self.service}-{durable}"
        )
        expected = sorted(by_type)

        async def consume(body: Any, msg: NatsMessage) -> None:
            headers = msg.headers or {}
            check_envelope(headers, expected)
            model, fn, arity = by_type[str(headers["ce-type"])]
            decoded = model.model_validate(body)  # a ValidationError is the message's
            trace = tracing.from_headers(headers)
            with tracing.handling(trace, subject, message_id=str(headers["ce-id"])):
                if arity == 1:
                    await fn(decoded)
                else:
                    raw = msg.raw_message
                    delivery = Delivery(
                        str(raw.subject), received_at(msg), str(headers["ce-id"]), trace
                    )
                    await fn(decoded, delivery)

        consume.__name__ = f"{self.service}_{durable}"
        self.broker.subscriber(
            subject,
            stream=JStream(stream, declare=False),
            durable=name,
            # FastStream handles the messages of one pull batch concurrently, so the batch
            # is one message: each consumer sees its subjects in stream order, one at a time.
            pull_sub=PullSub(batch_size=1, timeout=1.0),
            config=spec.consumer
            or ConsumerConfig(
                durable_name=name, ack_wait=60, max_deliver=-1, deliver_policy=DeliverPolicy.ALL
            ),
            ack_policy=AckPolicy.MANUAL,
            max_workers=spec.max_workers,
            # pull requests are answered on this identity's own inbox (the only one its
            # credential may subscribe to); FastStream's default is the shared `_INBOX.`
            inbox_prefix=self.inbox_prefix,
            include_in_schema=False,
        )(consume)
        for model, fn in spec.handlers.items():
            typed = subjects.wildcard(model.SUBJECT)
            self.schema_broker.subscriber(
                typed,
                title=f"{self.service}:{durable}:{model.__name__}",
                description=fn.__doc__ or model.__doc__,
            )(schema_handler(model))
            self._row("event", model.SUBJECT, fn, model.__name__)

    def _batched(self, durable: str, spec: Batched) -> None:
        """A consumer handled a batch at a time (batches.py), started once serving."""
        subject = spec.subject or _shared_subject(list(spec.types))
        stream = stream_for(subject)
        if stream is None:
            raise ValueError(f"no stream holds {subject}")
        name = f"{self.service}-{durable}"
        self.batches.append(
            BatchConsumer(self.service, name, stream, subject, spec, self.inbox_prefix)
        )
        for model in spec.types:
            typed = spec.type_subjects.get(model, model.SUBJECT)
            self.schema_broker.subscriber(
                subjects.wildcard(typed),
                title=f"{self.service}:{durable}:{model.__name__}",
                description=spec.handler.__doc__ or model.__doc__,
            )(schema_handler(model))
            self._row("event", typed, spec.handler, model.__name__)

    def _signal(self, subject: str, fn: Callable[..., Awaitable[None]]) -> None:
        """`fn` is `(body)` or `(body, delivery)`: the subject it arrived on (a wildcard
        subject's sender, e.g. the node of a heartbeat)."""
        model = model_of(fn)
        arity = _arity(fn)

        async def on_signal(body: Any, msg: NatsMessage) -> None:
            decoded = model.model_validate(body)
            if arity == 1:
                await fn(decoded)
            else:
                await fn(decoded, Delivery(str(msg.raw_message.subject), None))

        on_signal.__name__ = fn.__name__
        self.broker.subscriber(
            subject, title=f"{self.service}:signal:{fn.__name__}", no_reply=True
        )(on_signal)
        self._row("signal", subject, fn, model.__name__)

    def _publishes(self, messages: Sequence[type[Message] | tuple[type[Message], str]]) -> None:
        """What this service publishes (through its outbox), for the AsyncAPI document: a
        message on its own subject, or `(message, subject)` on another (the scheduler's
        `kept` worker facts)."""
        for entry in messages:
            message, subject = entry if isinstance(entry, tuple) else (entry, entry.SUBJECT)
            stream = stream_for(subjects.wildcard(subject))
            self.broker.publisher(
                subject,
                stream=JStream(stream, declare=False) if stream else None,
                title=f"{self.service}:{message.__name__}",
                description=message.__doc__,
                schema=message,
            )
            self.table.append(Wired("publish", subject, "", message.__name__))

    def _row(self, kind: str, subject: str, fn: Callable[..., Any], message: str) -> None:
        self.table.append(Wired(kind, subject, qualname(fn), message))

    # --- lifecycle ------------------------------------------------------------------

    async def _prepare(self) -> None:
        # The broker's own connection (connect() is idempotent; start() reuses it).
        nc = await self.broker.connect()
        if self.infrastructure:
            await ensure_streams_when_ready(nc.jetstream(), replicas=self.bus.stream_replicas)
        if self.store is not None:
            await self.store.ensure_indexes(self.indexes)

    async def _started(self) -> None:
        await self.requests.start()
        if self.batches:
            nc = await self.broker.connect()
            for consumer in self.batches:
                await consumer.start(nc)
        if self.relay is not None:
            self.relay.start()
        for job in self._every:
            job.start()
        settings = self.ports.metrics
        if settings.port:
            self.metrics_server = MetricsServer(self.metrics, settings.host, settings.port)
            self.metrics_port = await self.metrics_server.start()

    async def _stopping(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        for consumer in self.batches:
            await consumer.stop()
        for job in self._every:
            await job.stop()
        await self.requests.stop()
        if self.relay is not None:
            await self.relay.stop()

    # --- what every service answers -------------------------------------------------

    async def _health(self, body: HealthCheck, account: str) -> Health:
        collections = await self.store.collections() if self.store is not None else []
        return Health(service=self.service, status="ok", version=VERSION, collections=collections)

    async def _dead_letters(self, body: ListDeadLetters, account: str) -> DeadLetters:
        """Only the acting account's: the subject it asked on names it (account_of)."""
        return await self._read_dead_letters(subjects.dead_letter(self.service, account), body)

    async def _all_dead_letters(self, body: ListDeadLetters) -> DeadLetters:
        return await self._read_dead_letters(subjects.dead_letter(self.service, "*"), body)

    async def _read_dead_letters(self, subject: str, body: ListDeadLetters) -> DeadLetters:
        nc = await self.broker.connect()
        records = await read_dead_letters(nc.jetstream(), subject, body.limit)
        return DeadLetters(service=self.service, dead_letters=records)


def _typed(fn: EventHandler) -> type[Message]:
    model = model_of(fn)
    if not issubclass(model, Message):
        raise TypeError(f"{qualname(fn)}: an event handler's body must be a Message")
    return model


def _arity(fn: Callable[..., Any]) -> int:
    return len(inspect.signature(fn).parameters)


def _shared_subject(models: list[type[Message]]) -> str:
    found = {subjects.wildcard(m.SUBJECT) for m in models}
    if len(found) != 1:
        raise ValueError(f"{[m.__name__ for m in models]} need an Events(subject=...)")
    return found.pop()


__all__ = [
    "Batched",
    "Delivery",
    "Events",
    "Every",
    "Ports",
    "Request",
    "Service",
    "ServiceRuntime",
    "UnknownMessageType",
    "Wired",
]
