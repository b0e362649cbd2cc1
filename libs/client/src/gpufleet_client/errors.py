"""What an ask can fail with: a service's refusal as it sent it, or the bus's reason."""

from __future__ import annotations

from typing import Any

from gpufleet_contracts import ErrorReply, FieldError
from pydantic import ValidationError


class ClientError(Exception):
    """Any failure of a request; `code` as an ErrorReply's (`unavailable`, `forbidden`...)."""

    code = "internal"

    def __init__(self, message: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.subject = subject


class ServiceError(ClientError):
    """A service refused the request: its ErrorReply, with each field and rule it named."""

    def __init__(self, reply: ErrorReply, raw: dict[str, Any], subject: str | None = None) -> None:
        super().__init__(reply.error.message or "request refused", subject)
        self.reply = reply
        self.raw = raw  # the reply object exactly as it came

    @property
    def code(self) -> str:  # type: ignore[override]
        return self.reply.error.code

    @property
    def fields(self) -> list[FieldError]:
        return list(self.reply.error.fields)


class Unavailable(ClientError):
    """No service answered in time (none running, or none reachable), or no server."""

    code = "unavailable"


class Disconnected(Unavailable):
    """The connection to NATS closed under a request (asking again needs a new Client)."""


class Forbidden(ClientError):
    """The NATS server refused this identity the subject (its permissions)."""

    code = "forbidden"


class Unauthenticated(ClientError):
    """The server refused the credential, or a request needs an account and there is none."""

    code = "unauthenticated"


class BadReply(ClientError):
    """The answer is not the request's reply model (nor an ErrorReply)."""

    code = "internal"


def refusal(raw: dict[str, Any], subject: str) -> ServiceError:
    """The ServiceError of a reply saying `"ok": false`."""
    try:
        reply = ErrorReply.model_validate(raw)
    except ValidationError:
        body = raw.get("error")
        message = body.get("message") if isinstance(body, dict) else None
        code = body.get("code") if isinstance(body, dict) else None
        reply = ErrorReply.model_validate(
            {"error": {"code": str(code or "internal"), "message": str(message or "")}}
        )
    return ServiceError(reply, raw, subject)
