"""Request/reply: the one way a gpufleet service answers a request.

Every request subject (an account's `gpufleet.v1.rpc.<service>.<verb>.<account>`, an
operator's `gpufleet.v1.adm.<service>.<verb>`, a node's `gpufleet.v1.node.<id>.<verb>`) is
served here, on the broker's own nats-py connection, not through FastStream: FastStream cost
about 0.65 ms of CPU per request on the 2-core development machine (its context, dependency
injection, middlewares and an anyio task per message), against about 0.12 ms here with the
same pydantic decoding (benchmarks/scheduler/README.md).

A handler is `async def verb(body: Model, account: str) -> Reply` (an operator's or a node's
request: `async def verb(body: Model) -> Reply`, or `(body: Model, subject: str)` when the
subject is a wildcard whose token says who asks, as a node's enrolment on
`gpufleet.v1.enroll.<minion_id>`); the body's model is read from the handler's annotation,
the reply is the model the body's `REPLY` names (tests/unit/bus/test_replies.py holds every
service's wiring to it). One error mapping:

- a body that is not JSON, not a JSON object, or does not validate: an `invalid` ErrorReply
  naming each field and rule, and a redacted record on the acting account's dead-letter
  subject (the shape of deadletter.py's);
- a subject that names no account (R-TEN-2): `invalid`;
- `Refused` (and `NotFound`, gpufleet_contracts.errors): its ErrorReply;
- any other exception: logged, answered `internal` (its type only).

Up to `concurrency` requests of a subject run at once (nats-py calls a subscription's
callback one message at a time, so each request gets its own task). A requester chooses the
reply subject: one such as `$JS.API.STREAM.DELETE.<stream>` would have this service's
credential make the request for it, and another identity's inbox would deliver it the answer.
So a request is served only if its reply lies in the inboxes its subject proves
(accounts.reply_scope: an account's request, that account's `_INBOX.account.<account>`);
any other is dropped unserved (logged and counted, `gpufleet.replies.refused`: not a dead
letter, nothing in it is wrong but where it asked the answer to go). A request without a
reply subject is served, unanswered.
A request continues the trace its headers carry (tracing.py: a span only if it is sampled),
but for an account's, whose trace a client could choose. The subjects are declared to
FastStream (`schema_broker`, never connected) so the AsyncAPI document lists them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from faststream.nats import NatsBroker
from gpufleet_contracts import ErrorBody, ErrorReply, FieldError, Message, field_errors, subjects
from gpufleet_contracts.errors import Refused
from gpufleet_telemetry.instruments import METRICS
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ValidationError

from . import tracing
from .accounts import NoAccountError, account_of, may_answer
from .broker import dead_letters_of
from .deadletter import INVALID_MESSAGE, dead_letter_bytes, dead_letter_subject
from .notices import Notices

log = logging.getLogger("gpufleet.bus")

Reply = BaseModel | dict[str, Any]
# `(body, account)` for an account's request, `(body)` for an operator's or a node's.
Handler = Callable[..., Awaitable[Reply]]


@dataclass(frozen=True)
class Request:
    """A wiring-table entry with options; a bare handler means the defaults."""

    handler: Handler
    concurrency: int = 1
    description: str | None = None


def model_of(handler: Callable[..., Any]) -> type[BaseModel]:
    """The model of a handler's first parameter (its body), from its annotations."""
    params = list(inspect.signature(handler).parameters)
    hints = get_type_hints(handler)
    model = hints.get(params[0]) if params else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{qualname(handler)}: its first parameter must be a pydantic model")
    return model


def qualname(fn: Callable[..., Any]) -> str:
    """`module:function` (or `module:Class.method`): how the docs name a handler."""
    fn = getattr(fn, "__func__", fn)
    return f"{fn.__module__}:{fn.__qualname__}"


@dataclass(frozen=True)
class _Route:
    subject: str
    queue: str
    model: type[BaseModel]
    handler: Handler
    by_account: bool
    slots: asyncio.Semaphore
    with_subject: bool = False  # an operator's or a node's handler taking `(body, subject)`


class Requests:
    """The request subjects of one service, served on its broker's connection."""

    def __init__(self, service: str, broker: NatsBroker, schema_broker: NatsBroker) -> None:
        self.service = service
        self.broker = broker
        self.schema_broker = schema_broker
        self.routes: list[_Route] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Any] = []
        self._aimed = Notices()  # requests whose answer was aimed elsewhere, by subject

    def add(
        self,
        subject: str,
        entry: Handler | Request,
        *,
        by_account: bool,
        queue: str,
        title: str,
    ) -> type[BaseModel]:
        """Serve `subject` with `entry`; returns the body's model."""
        req = entry if isinstance(entry, Request) else Request(entry)
        model = model_of(req.handler)
        self.routes.append(
            _Route(
                subject,
                queue,
                model,
                req.handler,
                by_account,
                asyncio.Semaphore(req.concurrency),
                not by_account and len(inspect.signature(req.handler).parameters) == 2,
            )
        )
        self.schema_broker.subscriber(
            subject,
            queue=queue,
            title=title,
            description=req.description or req.handler.__doc__,
        )(schema_handler(model))
        return model

    async def start(self) -> None:
        nc = await self.broker.connect()
        for r in self.routes:
            self._subs.append(await nc.subscribe(r.subject, queue=r.queue, cb=self._dispatch(r)))
        # A round trip to the server: once start() returns, the server holds every
        # subscription, so a request sent on another connection finds its responder.
        await nc.flush()

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
        if msg.reply and not may_answer(msg.subject, msg.reply):
            # aimed at an inbox not the requester's (or at no inbox): neither served nor
            # answered; logged at a rate the requester cannot raise (notices.py)
            METRICS.replies_refused.add(1, {"service": self.service})
            notice = self._aimed.note(msg.subject)
            if notice is not None:
                log.warning(
                    "not serving %s: its reply %r is not the requester's (%s)",
                    msg.subject,
                    msg.reply,
                    notice.text(),
                )
            return
        reply = await self.answer(route, msg.subject, msg.data, msg.headers)
        if msg.reply:
            try:
                await msg.respond(json.dumps(reply, default=str).encode())
            except Exception:
                log.warning("could not reply on %s", msg.subject, exc_info=True)

    async def answer(
        self, route: _Route, subject: str, data: bytes, headers: dict[str, str] | None
    ) -> dict[str, Any]:
        """The reply to one request (the error mapping of the module's docstring)."""
        try:
            # after the body: the acting account, or the subject it came on, or nothing
            # (the account first: a request on no account's subject is refused unread)
            after = [account_of(subject)] if route.by_account else [subject] * route.with_subject
            body = route.model.model_validate_json(data or b"{}")
            # An account's request is where a trace may begin, never one it brings along
            # (tracing.py); a service's or a node's continues the trace its headers carry.
            trace = None if route.by_account else tracing.from_headers(headers)
            with tracing.handling(trace, route.subject, kind=SpanKind.SERVER):
                result = await route.handler(body, *after)
        except NoAccountError as exc:
            field = FieldError(field="subject", rule="R-TEN-2", message=str(exc))
            return _error("invalid", str(exc), [field])
        except ValidationError as exc:
            errors = field_errors(exc)
            log.warning(
                "rejected invalid request",
                extra={"subject": subject, "errors": [e.model_dump() for e in errors]},
            )
            await self._dead_letter(subject, data, headers, [e.model_dump() for e in errors])
            return _error("invalid", INVALID_MESSAGE, errors)
        except Refused as exc:
            return exc.reply.model_dump(mode="json")
        except Exception as exc:
            log.exception("request failed on %s", subject)
            return _error("internal", type(exc).__name__)
        if isinstance(result, BaseModel):
            dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True)
            return dumped
        return result

    async def _dead_letter(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str] | None,
        errors: list[dict[str, Any]],
    ) -> None:
        # Under the broker's dead-letter name: a node agent may publish only its own
        # (`node-<minion_id>`, make_broker's `dead_letters_as`).
        name = dead_letters_of(self.broker) or self.service
        record = dead_letter_bytes(name, subject, bytes(data), headers, "invalid", errors)
        try:
            js = (await self.broker.connect()).jetstream()
            await js.publish(
                dead_letter_subject(name, subject),
                record,
                stream=subjects.STREAM_DLQ,
                timeout=5.0,
            )
        except Exception:
            log.exception("could not dead-letter an invalid request on %s", subject)


def _error(code: str, message: str, fields: list[FieldError] | None = None) -> dict[str, Any]:
    reply = ErrorReply(error=ErrorBody(code=code, message=message, fields=fields or []))
    dumped: dict[str, Any] = reply.model_dump(mode="json")
    return dumped


def schema_handler(model: type[BaseModel]) -> Callable[..., Awaitable[None]]:
    """A function with the signature FastStream reads the payload schema from; never called."""

    async def declared(body: Any) -> None:  # pragma: no cover - documentation only
        raise RuntimeError("declared for the AsyncAPI document only; never called")

    declared.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)]
    )
    declared.__annotations__ = {"body": model, "return": None}
    declared.__name__ = model.__name__
    return declared


__all__ = [
    "Handler",
    "Message",
    "Reply",
    "Request",
    "Requests",
    "model_of",
    "qualname",
    "schema_handler",
]
