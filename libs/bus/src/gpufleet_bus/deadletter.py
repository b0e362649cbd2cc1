"""The ack policy of every gpufleet consumer, and the dead-letter path.

FastStream's NATS default (`REJECT_ON_ERROR`) terminates a message on any exception, which
would silently lose an event when, say, the database is briefly down. gpufleet subscribers
run with `AckPolicy.MANUAL` and this middleware decides:

- handled                        -> ack
- the body is not JSON, or does not validate, or its envelope is wrong (below)
                                 -> copy to the DLQ with a structured error, then term
  (redelivery cannot fix it); a request gets an `invalid` ErrorReply naming each field and
  rule, exactly as a body that does not validate
- any other exception            -> nak with a growing delay, so a transient fault retries;
  after MAX_DELIVER attempts the message is dead-lettered as poison and termed.

The envelope (CloudEvents headers, binary mode):

- every JetStream command and event (a `ServiceRuntime.on_event` consumer) must carry
  `ce-specversion` (1.0), `ce-id`, `ce-source` and `ce-type`, and `ce-type` must be the TYPE
  of a message model its consumer takes (`envelope_decoder`): a command or event of another
  type on the subject, or one with no identity, is refused, never executed. Everything
  gpufleet publishes (gpufleet_bus.publish, the outbox) carries them.
- requests (core NATS request/reply, `rpc` and `adm`) need none: the subject names the
  verb and the acting account, the reply goes back to the asker, nothing is stored or
  replayed. The CLI sends them anyway (for tracing); they are not checked.

The body is decoded here, before the handler runs (`msg.decode()`, which FastStream caches
for the handler), so a body that is not JSON (`json.JSONDecodeError`, or
`UnicodeDecodeError` for bytes that are not UTF-8, raised by FastStream's decoder for a
message whose content-type is JSON) is told apart from a handler's own ValueError.

A dead-letter record (`dead_letter_bytes`) is redacted (gpufleet_bus.redact: no secret, no
raw bytes of a body that is not JSON) and carries the account it was acting for, when the
subject names one (`dead_letter_account`); it is published on
`gpufleet.v1.dlq.<service>.<account>` (`_` for none), so a service can give each account
its own dead letters and no other's (ServiceRuntime's `dead_letters` request).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from faststream import BaseMiddleware, StreamMessage
from faststream.response.publish_type import PublishType
from gpufleet_contracts import ErrorBody, ErrorReply, FieldError, field_errors, subjects
from gpufleet_contracts.base import SPEC_VERSION
from gpufleet_contracts.subjects import ACCOUNT_RE
from pydantic import ValidationError

from .accounts import NoAccountError, is_inbox, may_answer
from .redact import body_fields, redact

log = logging.getLogger("gpufleet.bus")

MAX_DELIVER = 20
# The CloudEvents headers every JetStream command and event carries (see above).
REQUIRED_HEADERS = ("ce-specversion", "ce-id", "ce-source", "ce-type")
INVALID_MESSAGE = "the request is not valid"


class EnvelopeError(ValueError):
    """A message whose CloudEvents headers are missing or wrong: refused and dead-lettered
    like a body that does not validate (redelivery cannot fix it)."""

    def __init__(self, message: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self._errors = errors

    def errors(self) -> list[dict[str, Any]]:
        return self._errors


class UnknownMessageType(EnvelopeError):
    """A message whose CloudEvents type is none of those its subject carries."""

    def __init__(self, ce_type: str, expected: list[str]) -> None:
        super().__init__(
            f"ce-type {ce_type!r} is not one of {expected}",
            [
                {
                    "field": "ce-type",
                    "rule": "header:type",
                    "message": f"{ce_type!r} is not one of {', '.join(expected)}",
                }
            ],
        )
        self.ce_type = ce_type
        self.expected = expected


class MissingHeaders(EnvelopeError):
    """A command or event without the CloudEvents headers that identify it."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(
            f"missing CloudEvents header(s): {', '.join(missing)}",
            [{"field": name, "rule": "header:required", "message": "missing"} for name in missing],
        )
        self.missing = missing


def check_envelope(headers: Mapping[str, Any] | None, expected: Sequence[str]) -> None:
    """Raise EnvelopeError unless `headers` identify a message of one of the types
    `expected` (see the module's docstring)."""
    h = headers or {}
    missing = [name for name in REQUIRED_HEADERS if not str(h.get(name) or "").strip()]
    if missing:
        raise MissingHeaders(missing)
    if str(h["ce-specversion"]) != SPEC_VERSION:
        raise EnvelopeError(
            f"ce-specversion {h['ce-specversion']!r} is not {SPEC_VERSION}",
            [
                {
                    "field": "ce-specversion",
                    "rule": "header:specversion",
                    "message": f"{str(h['ce-specversion'])!r} is not {SPEC_VERSION}",
                }
            ],
        )
    ce_type = str(h["ce-type"])
    if ce_type not in expected:
        raise UnknownMessageType(ce_type, sorted(expected))


Decoder = Callable[[StreamMessage[Any]], Awaitable[Any]]


def envelope_decoder(
    types: Sequence[str],
) -> Callable[[StreamMessage[Any], Decoder], Awaitable[Any]]:
    """A FastStream `decoder` that checks the envelope before decoding the body: given to
    a subscriber, its messages of another type never reach its handler."""
    expected = tuple(types)

    async def decode(msg: StreamMessage[Any], original: Decoder) -> Any:
        check_envelope(msg.headers, expected)
        return await original(msg)

    return decode


def not_json(exc: ValueError) -> list[FieldError]:
    """The structured error of a body that is not JSON: field `(message)`, rule
    `schema:json_invalid`, as pydantic reports it for a request served on the raw connection
    (fastpath.py), so both paths answer alike."""
    if isinstance(exc, json.JSONDecodeError):
        why = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    elif isinstance(exc, UnicodeDecodeError):
        why = f"not UTF-8 (byte {exc.start})"
    else:
        why = str(exc)
    return [
        FieldError(field="(message)", rule="schema:json_invalid", message=f"Invalid JSON: {why}")
    ]


def retry_delay(attempt: int) -> float:
    return float(min(0.2 * 2 ** max(attempt - 1, 0), 15.0))


# `gpufleet.v1.cmd.scheduler.<account>.enqueue_job`: another system's submission, which only
# that account may publish (gpufleet_auth.permissions).
_ENQUEUE = subjects.command("scheduler", "enqueue_job", key="*").split(".")


def dead_letter_account(subject: str | None) -> str | None:
    """The account a refused message was acting for, read from the subject the server let
    through (never from the body or a header), or None if the subject names none."""
    if not subject:
        return None
    account = subjects.rpc_account(subject)
    if account is None:
        parts = subject.split(".")
        if len(parts) == len(_ENQUEUE) and all(
            p == q for p, q in zip(parts, _ENQUEUE, strict=True) if q != "*"
        ):
            account = parts[4]
    if account is None or not ACCOUNT_RE.fullmatch(account):
        return None
    return account


def dead_letter_subject(service: str, subject: str | None) -> str:
    """Where `service` keeps a message refused on `subject`: its account's DLQ subject."""
    return subjects.dead_letter(service, dead_letter_account(subject))


def dead_letter_record(
    service: str, msg: StreamMessage[Any], reason: str, errors: list[dict[str, Any]]
) -> bytes:
    raw: bytes = msg.body if isinstance(msg.body, bytes) else bytes(msg.body)
    subject = getattr(msg.raw_message, "subject", None)
    return dead_letter_bytes(service, subject, raw, msg.headers, reason, errors)


def dead_letter_bytes(
    service: str,
    subject: str | None,
    raw: bytes,
    headers: Mapping[str, Any] | None,
    reason: str,
    errors: list[dict[str, Any]],
) -> bytes:
    """The DLQ record: what arrived (redacted; CloudEvents headers only), for whom, why it
    was refused."""
    return json.dumps(
        {
            "service": service,
            "subject": subject,
            "account": dead_letter_account(subject),
            "reason": reason,
            "errors": redact(errors),
            "headers": redact(
                {str(k): v for k, v in (headers or {}).items() if str(k).startswith("ce-")}
            ),
            **body_fields(raw),
            "at": datetime.now(UTC).isoformat(),
        },
        default=str,
    ).encode()


def _is_jetstream(msg: StreamMessage[Any]) -> bool:
    raw = msg.raw_message
    return bool(getattr(raw, "reply", "") and str(raw.reply).startswith("$JS.ACK"))


def _attempt(msg: StreamMessage[Any]) -> int:
    try:
        return int(msg.raw_message.metadata.num_delivered)
    except Exception:  # core NATS message: no metadata
        return 1


def dead_letter_middleware(service: str) -> type[BaseMiddleware]:
    """The ack policy and dead-letter path of a broker; `service` is the token its dead
    letters are published under (`gpufleet.v1.dlq.<service>.<account>`): a service's name,
    or `node-<minion_id>` for a node agent, which may publish only its own."""

    class DeadLetterMiddleware(BaseMiddleware):
        async def _dead_letter(
            self, msg: StreamMessage[Any], reason: str, errors: list[dict[str, Any]]
        ) -> None:
            broker = self.context.get("broker")
            subject = getattr(msg.raw_message, "subject", None)
            await broker.publish(
                dead_letter_record(service, msg, reason, errors),
                dead_letter_subject(service, subject),
                stream=subjects.STREAM_DLQ,
                timeout=5.0,
            )

        async def _refuse(
            self, msg: StreamMessage[Any], jetstream: bool, message: str, errors: list[FieldError]
        ) -> Any:
            """Dead-letter an invalid message; term it, or answer the request `invalid`."""
            dumped = [e.model_dump() for e in errors]
            log.warning(
                "rejected invalid message: %s",
                message,
                extra={"subject": getattr(msg.raw_message, "subject", None), "errors": dumped},
            )
            await self._dead_letter(msg, "invalid", dumped)
            if jetstream:
                await msg.reject()
                return None
            return ErrorReply(
                error=ErrorBody(code="invalid", message=message, fields=errors)
            ).model_dump(mode="json")

        async def publish_scope(self, call_next: Any, cmd: Any) -> Any:
            """A reply goes to an inbox only, of the requester: a requester chooses the reply
            subject, and one such as `$JS.API.STREAM.DELETE.<stream>` would have this
            service's credential make the request for it, another identity's inbox would
            deliver it the answer (accounts.reply_scope of the request's subject)."""
            if getattr(cmd, "publish_type", None) == PublishType.REPLY:
                destination = str(getattr(cmd, "destination", ""))
                asked = getattr(self.msg, "subject", None)  # the request being answered
                if not (may_answer(asked, destination) if asked else is_inbox(destination)):
                    log.warning("not answering %s to %r: not its inbox", asked, destination)
                    return None
            return await call_next(cmd)

        async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
            jetstream = _is_jetstream(msg)
            try:
                try:
                    # FastStream's decoder, after the consumer's envelope check (the result
                    # is cached for the handler): a decoding error here is the message's,
                    # never one the handler raised.
                    await msg.decode()
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    return await self._refuse(msg, jetstream, INVALID_MESSAGE, not_json(exc))
                result = await call_next(msg)
            except ValidationError as exc:
                return await self._refuse(msg, jetstream, INVALID_MESSAGE, field_errors(exc))
            except EnvelopeError as exc:  # the envelope check, or a handler's own dispatch
                return await self._refuse(msg, jetstream, str(exc), _fields(exc))
            except NoAccountError as exc:  # a request on no account's subject (R-TEN-2)
                field = FieldError(field="subject", rule="R-TEN-2", message=str(exc))
                return await self._refuse(msg, jetstream, str(exc), [field])
            except Exception as exc:
                attempt = _attempt(msg)
                if not jetstream:
                    log.exception("request failed")
                    return ErrorReply(
                        error=ErrorBody(code="internal", message=f"{type(exc).__name__}")
                    ).model_dump(mode="json")
                if attempt >= MAX_DELIVER:
                    log.exception("poison message after %d attempts", attempt)
                    await self._dead_letter(
                        msg, "poison", [{"error": f"{type(exc).__name__}: {exc}"}]
                    )
                    await msg.reject()
                    return None
                delay = retry_delay(attempt)
                log.warning(
                    "handler failed (attempt %d), retrying in %.1fs: %s", attempt, delay, exc
                )
                await msg.raw_message.nak(delay=delay)  # JetStream: redeliver after delay
                return None
            if jetstream:
                await msg.ack()
            return result

    return DeadLetterMiddleware


def _fields(exc: EnvelopeError) -> list[FieldError]:
    return [FieldError(**e) for e in exc.errors()]
