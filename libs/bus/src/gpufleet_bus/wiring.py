"""The parts of the service shape (runtime.py): what a build function takes (`Ports`) and
returns (`Service`), and the entries of a wiring table that are not plain handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker
from gpufleet_contracts import Message
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_store import Store
from gpufleet_telemetry.exposition import MetricsSettings
from nats.js.api import ConsumerConfig

from .broker import BusSettings

if TYPE_CHECKING:
    from .runtime import ServiceRuntime

T = TypeVar("T")
EventHandler = Callable[..., Awaitable[object]]  # what it returns is ignored


@dataclass(frozen=True)
class Ports:
    """What a service is built from: its bus connection, its database, its clock."""

    broker: NatsBroker
    store: Store | None = None
    clock: Clock = utcnow
    bus: BusSettings = field(default_factory=BusSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)  # its /metrics, if any

    @property
    def db(self) -> Store:
        if self.store is None:
            raise RuntimeError("this service was built without a store")
        return self.store


@dataclass(frozen=True)
class Service(Generic[T]):
    """What a build function returns: the FastStream app to run and the service's core."""

    app: FastStream
    core: T
    runtime: ServiceRuntime


@dataclass(frozen=True)
class Delivery:
    """Where and when an event arrived: the subject the server let through (who said it)
    and when the stream stored it (None for a message that did not come through JetStream)."""

    subject: str
    received_at: datetime | None
    id: str | None = None  # its CloudEvents id (`ce-id`, also its Nats-Msg-Id)
    # the W3C trace context its headers carried, well-formed (tracing.py), or None: what a
    # batch's handler emits for this message continues it (`emit(..., trace=...)`)
    trace: str | None = None


@dataclass(frozen=True)
class Events:
    """One consumer dispatching by CloudEvents type (see the module's docstring)."""

    handlers: Mapping[type[Message], EventHandler]
    subject: str | None = None  # default: the one subject all the types share
    consumer: ConsumerConfig | None = None  # an existing consumer made by someone allowed to
    max_workers: int = 1


@dataclass(frozen=True)
class Batched:
    """One consumer of several types whose messages are handled a batch at a time, in
    stream order: `handler` takes [(message, delivery)] and the batch is acked once it
    returned (batches.py)."""

    types: Sequence[type[Message]]
    handler: Callable[[list[tuple[Message, Delivery]]], Awaitable[object]]
    subject: str | None = None  # default: the one subject all the types share
    max_batch: int = 256
    # After a batch of several messages smaller than max_batch, wait this long before
    # fetching the next, so that under load a batch (one transaction) carries more
    # messages; messages that come one at a time are each handled at once (batches.py).
    linger_s: float = 0.0
    # The subject a type arrives on when not its own SUBJECT (billing reads the nodes'
    # WorkerStarted/WorkerFinished as the scheduler kept them: subjects.kept)
    type_subjects: Mapping[type[Message], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Wired:
    """One row of a service's wiring, as the docs list it."""

    kind: str  # request | admin | direct | event | signal | publish
    subject: str
    handler: str  # module:function ("" for what it publishes)
    message: str  # the body's model
