"""The scheduler's refusals: "not found" and a structured ErrorReply (app.py answers both)."""

from __future__ import annotations

from gpufleet_contracts import ErrorBody, ErrorReply, FieldError


class NotFound(Exception):
    pass


class Refused(Exception):
    """A request that is valid in form but refused by a rule that needs the fleet."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.error.message)
        self.reply = reply


def refused(code: str, message: str, *fields: FieldError) -> Refused:
    return Refused(ErrorReply(error=ErrorBody(code=code, message=message, fields=list(fields))))
