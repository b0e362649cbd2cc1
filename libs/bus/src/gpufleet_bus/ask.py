"""Asking another service (or, for a node agent, the scheduler) a question over core NATS: the
reply as its model, a refusal raised again as the `Refused` it was, no answer as
`unavailable`. The request goes out on the asker's own connection, so its answer comes back
to the asker's own inbox (accounts.reply_scope)."""

from __future__ import annotations

import json
from typing import TypeVar

import nats.errors
from faststream.nats import NatsBroker
from gpufleet_contracts import ErrorBody, Message
from gpufleet_contracts.errors import Refused
from pydantic import BaseModel

from . import tracing

M = TypeVar("M", bound=BaseModel)
ASK_TIMEOUT_S = 10.0


async def ask(
    broker: NatsBroker,
    message: Message,
    reply: type[M],
    *,
    subject: str | None = None,
    timeout_s: float = ASK_TIMEOUT_S,
) -> M:
    """`message` on its subject (or `subject`: one with the asker's token added)."""
    to = subject or message.subject()
    nc = await broker.connect()
    try:
        # the running task's trace, if any (tracing.py): a node's request of a job's step
        headers = tracing.add_headers({}) or None
        answer = await nc.request(to, message.to_bytes(), timeout=timeout_s, headers=headers)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        raise Refused("unavailable", f"no answer on {to}") from None
    data = json.loads(answer.data)
    if isinstance(data, dict) and data.get("ok") is False and "error" in data:
        error = ErrorBody.model_validate(data["error"])
        raise Refused(error.code, error.message, error.fields)
    return reply.model_validate(data)


class Asker:
    """`ask` on one broker, for a part that only asks (e.g. the scheduler's PlatformStaging)."""

    def __init__(self, broker: NatsBroker) -> None:
        self.broker = broker

    async def __call__(self, message: Message, reply: type[M]) -> M:
        return await ask(self.broker, message, reply)
