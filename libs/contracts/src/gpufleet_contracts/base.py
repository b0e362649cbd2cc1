"""Wire format of every gpufleet message, fixed once here.

A message travels as JSON (the pydantic model, by alias) in the NATS payload, and its
CloudEvents 1.0 attributes travel as NATS headers in binary content mode (`ce-id`,
`ce-source`, `ce-type`, `ce-time`, `ce-subject`, `ce-specversion`). `ce-id` is also sent as
`Nats-Msg-Id`, so JetStream drops a duplicate publish of the same event.

Models accept unknown fields (a newer producer may add some) and are frozen. A field's
default never changes meaning within a version: stored documents may omit defaults (the
scheduler keeps a job's spec that way) and take them back when read.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"


class Message(BaseModel):
    """Base of every command, event and reply."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    # CloudEvents `type`, e.g. "gpufleet.job.queued.v1"; the trailing number is the version.
    TYPE: ClassVar[str] = ""
    # NATS subject; may hold `{field}` placeholders filled from the message's own fields.
    SUBJECT: ClassVar[str] = ""

    def subject(self) -> str:
        return self.SUBJECT.format(**{k: getattr(self, k) for k in self.subject_keys()})

    @classmethod
    def subject_keys(cls) -> list[str]:
        import string

        return [f for _, f, _, _ in string.Formatter().parse(cls.SUBJECT) if f]

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Self:
        return cls.model_validate_json(data)


class Event(Message):
    """Something that happened (past tense). Published on JetStream."""


class Command(Message):
    """Something a service is asked to do (imperative)."""

    # A request's reply: the model its handler returns (or it raises Refused). None for a
    # command that no one answers (a durable command on a stream).
    REPLY: ClassVar[type[BaseModel] | None] = None
    # A request that changes nothing: a client may ask it again while it is unanswered
    # (gpufleet_client). A command is safe to repeat also when it carries a `request_id`.
    READ: ClassVar[bool] = False


@dataclass(frozen=True)
class Envelope:
    """CloudEvents attributes of one message on the bus."""

    type: str
    source: str
    subject: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def headers(self) -> dict[str, str]:
        return {
            "ce-specversion": SPEC_VERSION,
            "ce-id": self.id,
            "ce-source": self.source,
            "ce-type": self.type,
            "ce-time": self.time.isoformat(),
            "ce-subject": self.subject,
            "content-type": CONTENT_TYPE,
            "Nats-Msg-Id": self.id,
        }

    @classmethod
    def from_headers(cls, headers: dict[str, Any] | None) -> Envelope | None:
        if not headers or "ce-id" not in headers:
            return None
        try:
            time = datetime.fromisoformat(str(headers.get("ce-time")))
        except ValueError:
            time = datetime.now(UTC)
        return cls(
            type=str(headers.get("ce-type", "")),
            source=str(headers.get("ce-source", "")),
            subject=str(headers.get("ce-subject", "")),
            id=str(headers["ce-id"]),
            time=time,
        )


def envelope_for(msg: Message, *, source: str, id: str | None = None) -> Envelope:
    """The envelope of `msg` as published by `source` (e.g. "gpufleet/scheduler")."""
    subject = msg.subject()
    return Envelope(
        type=msg.TYPE,
        source=source,
        subject=subject,
        id=id or uuid.uuid4().hex,
    )
