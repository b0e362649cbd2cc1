"""Request/reply on the raw nats-py connection, for the few subjects that carry a fleet's load.

FastStream costs about 0.65 ms of CPU per request on the 2-core development machine (its
context, dependency injection, middlewares and an anyio task per message; a handler that
asks for `msg: NatsMessage` adds a thread hop on top), against about 0.12 ms for nats-py
with the same pydantic decoding (benchmarks/scheduler/README.md). At 1,000 submissions a
second that is most of a core, so `SubmitJob` is served here instead:

- the body is decoded with the same contract model, so validation is the same;
- a body that is not JSON, not a JSON object, or does not validate gets the same
  structured `invalid` ErrorReply as every other request (pydantic's `json_invalid` and
  `model_type` errors, in the shape of deadletter.not_json's), and the same redacted
  record goes to the acting account's dead-letter subject, as the dead-letter middleware
  does;
- any other exception is logged and answered `internal`;
- up to `concurrency` requests of a subject run at once (nats-py calls a subscription's callback one
  message at a time, so each request gets its own task).

What is not recorded is an OpenTelemetry span per request. The subjects are still declared
to FastStream (`schema_broker`, never connected) so the AsyncAPI document lists them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from faststream.nats import NatsBroker
from gpufleet_contracts import ErrorBody, ErrorReply, Message, field_errors, subjects
from pydantic import ValidationError

from .accounts import NoAccountError, account_of, account_subject, is_inbox
from .deadletter import INVALID_MESSAGE, dead_letter_bytes, dead_letter_subject

log = logging.getLogger("gpufleet.bus")

# The decoded body and the acting account (the subject's account token, see account_of).
Handler = Callable[[Any, str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class _Route:
    subject: str
    model: type[Message]
    handler: Handler
    slots: asyncio.Semaphore


class FastRequests:
    def __init__(self, service: str, broker: NatsBroker, schema_broker: NatsBroker) -> None:
        self.service = service
        self.broker = broker
        self.schema_broker = schema_broker
        self.routes: list[_Route] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Any] = []

    def route(
        self,
        verb: str,
        model: type[Message],
        description: str | None = None,
        concurrency: int = 256,
    ) -> Callable[[Handler], Handler]:
        subject = account_subject(self.service, verb)

        def register(fn: Handler) -> Handler:
            self.routes.append(_Route(subject, model, fn, asyncio.Semaphore(concurrency)))
            self.schema_broker.subscriber(
                subject,
                queue=f"{self.service}-rpc",
                title=f"{self.service}:{verb}",
                description=description or fn.__doc__,
            )(_schema_handler(model))
            return fn

        return register

    async def start(self) -> None:
        nc = await self.broker.connect()
        for r in self.routes:
            self._subs.append(
                await nc.subscribe(r.subject, queue=f"{self.service}-rpc", cb=self._dispatch(r))
            )

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may already be closed
                log.debug("unsubscribe failed", exc_info=True)
        self._subs.clear()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)

    def _dispatch(self, route: _Route) -> Callable[[Any], Awaitable[None]]:
        async def cb(msg: Any) -> None:
            await route.slots.acquire()  # back-pressure: nats-py buffers the rest
            task = asyncio.create_task(self._serve(route, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda _: route.slots.release())

        return cb

    async def _serve(self, route: _Route, msg: Any) -> None:
        try:
            account = account_of(msg.subject)
            body = route.model.from_bytes(msg.data)
            reply = await route.handler(body, account)
        except NoAccountError as exc:
            reply = ErrorReply(error=ErrorBody(code="invalid", message=str(exc))).model_dump(
                mode="json"
            )
        except ValidationError as exc:
            errors = field_errors(exc)
            log.warning(
                "rejected invalid request",
                extra={"subject": msg.subject, "errors": [e.model_dump() for e in errors]},
            )
            reply = ErrorReply(
                error=ErrorBody(code="invalid", message=INVALID_MESSAGE, fields=errors)
            ).model_dump(mode="json")
            await self._dead_letter(msg, [e.model_dump() for e in errors])
        except Exception as exc:
            log.exception("request failed")
            reply = ErrorReply(
                error=ErrorBody(code="internal", message=type(exc).__name__)
            ).model_dump(mode="json")
        if is_inbox(msg.reply):  # never a subject the requester chose to aim us at
            try:
                await msg.respond(json.dumps(reply, default=str).encode())
            except Exception:
                log.warning("could not reply on %s", msg.subject, exc_info=True)

    async def _dead_letter(self, msg: Any, errors: list[dict[str, Any]]) -> None:
        record = dead_letter_bytes(
            self.service, msg.subject, bytes(msg.data), msg.headers, "invalid", errors
        )
        try:
            js = (await self.broker.connect()).jetstream()
            await js.publish(
                dead_letter_subject(self.service, msg.subject),
                record,
                stream=subjects.STREAM_DLQ,
                timeout=5.0,
            )
        except Exception:
            log.exception("could not dead-letter an invalid request on %s", msg.subject)


def _schema_handler(model: type[Message]) -> Callable[..., Awaitable[None]]:
    """A function with the signature FastStream reads the payload schema from; never called."""

    async def declared(body: Any) -> None:  # pragma: no cover - documentation only
        raise RuntimeError("served by gpufleet_bus.fastpath, not FastStream")

    declared.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)]
    )
    declared.__annotations__ = {"body": model, "return": None}
    declared.__name__ = model.__name__
    return declared
