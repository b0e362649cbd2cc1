"""The ack policy of every gpufleet consumer, and the dead-letter path.

FastStream's NATS default (`REJECT_ON_ERROR`) terminates a message on any exception, which
would silently lose an event when, say, the database is briefly down. gpufleet subscribers
run with `AckPolicy.MANUAL` and this middleware decides:

- handled                        -> ack
- the body does not validate     -> copy to the DLQ with a structured error, then term
  (redelivery cannot fix it); a request gets an `ErrorReply` naming each field and rule
- any other exception            -> nak with a growing delay, so a transient fault retries;
  after MAX_DELIVER attempts the message is dead-lettered as poison and termed.

A dead-letter record keeps what arrived, less its secrets: a JSON body's `env` values and
secret fields (gpufleet_contracts.secrets) are replaced by "<secret>"; a body that is not
JSON is kept byte for byte (nothing in it is known to be a secret).
"""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime
from typing import Any

from faststream import BaseMiddleware, StreamMessage
from gpufleet_contracts import ErrorBody, ErrorReply, field_errors, subjects
from gpufleet_contracts.secrets import redact_json
from pydantic import ValidationError

log = logging.getLogger("gpufleet.bus")

MAX_DELIVER = 20


class UnknownMessageType(ValueError):
    """A message whose CloudEvents type is none of those its subject carries: refused and
    dead-lettered like a body that does not validate (redelivery cannot fix it)."""

    def __init__(self, ce_type: str, expected: list[str]) -> None:
        super().__init__(f"ce-type {ce_type!r} is not one of {expected}")
        self.ce_type = ce_type
        self.expected = expected

    def errors(self) -> list[dict[str, Any]]:
        return [
            {
                "field": "ce-type",
                "rule": "header:type",
                "message": f"{self.ce_type!r} is not one of {', '.join(self.expected)}",
            }
        ]


def _retry_delay(attempt: int) -> float:
    return float(min(0.2 * 2 ** max(attempt - 1, 0), 15.0))


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
    headers: dict[str, Any] | None,
    reason: str,
    errors: list[dict[str, Any]],
) -> bytes:
    """The DLQ record: what arrived (bytes, CloudEvents headers; secrets left out), why it
    was refused."""
    raw = redact_json(raw)
    try:
        payload: Any = raw.decode()
        encoding = "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(raw).decode(), "base64"
    return json.dumps(
        {
            "service": service,
            "subject": subject,
            "reason": reason,
            "errors": errors,
            "headers": {k: v for k, v in (headers or {}).items() if k.startswith("ce-")},
            "payload": payload,
            "payload_encoding": encoding,
            "at": datetime.now(UTC).isoformat(),
        }
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
    dlq_subject = subjects.dead_letter(service)

    class DeadLetterMiddleware(BaseMiddleware):
        async def _dead_letter(
            self, msg: StreamMessage[Any], reason: str, errors: list[dict[str, Any]]
        ) -> None:
            broker = self.context.get("broker")
            await broker.publish(
                dead_letter_record(service, msg, reason, errors),
                dlq_subject,
                stream=subjects.STREAM_DLQ,
                timeout=5.0,
            )

        async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
            jetstream = _is_jetstream(msg)
            try:
                result = await call_next(msg)
            except ValidationError as exc:
                errors = [e.model_dump() for e in field_errors(exc)]
                log.warning(
                    "rejected invalid message",
                    extra={"subject": getattr(msg.raw_message, "subject", None), "errors": errors},
                )
                await self._dead_letter(msg, "invalid", errors)
                if jetstream:
                    await msg.reject()
                    return None
                return ErrorReply(
                    error=ErrorBody(
                        code="invalid",
                        message="the request is not valid",
                        fields=field_errors(exc),
                    )
                ).model_dump(mode="json")
            except UnknownMessageType as exc:
                log.warning("rejected message of unknown type: %s", exc)
                await self._dead_letter(msg, "invalid", exc.errors())
                if jetstream:
                    await msg.reject()
                    return None
                return ErrorReply(error=ErrorBody(code="invalid", message=str(exc))).model_dump(
                    mode="json"
                )
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
                delay = _retry_delay(attempt)
                log.warning(
                    "handler failed (attempt %d), retrying in %.1fs: %s", attempt, delay, exc
                )
                await msg.raw_message.nak(delay=delay)  # JetStream: redeliver after delay
                return None
            if jetstream:
                await msg.ack()
            return result

    return DeadLetterMiddleware
