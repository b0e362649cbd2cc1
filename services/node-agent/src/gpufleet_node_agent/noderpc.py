"""A node agent's request to a service on its own node subject (`nrpc.<service>.<verb>.
<minion_id>`, which only its credential may publish): the reply as its model, or why not."""

from __future__ import annotations

import json
from typing import TypeVar

import nats.errors
from gpufleet_contracts import Message, subjects
from pydantic import BaseModel, ValidationError

from .staging.platform import Requester

M = TypeVar("M", bound=BaseModel)


class NotAnswered(Exception):
    """No answer, an unreadable one, or a refusal other than "not found"."""


class NotThere(Exception):
    """The service answered "not found" (not this node's region and owner's, or none)."""


async def ask_service(request: Requester, minion_id: str, message: Message, reply: type[M]) -> M:
    subject = subjects.as_node(message.SUBJECT, minion_id)
    try:
        raw = await request(subject, message.to_bytes())
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError):
        raise NotAnswered("the control plane did not answer") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise NotAnswered("the control plane's answer is unreadable") from None
    if isinstance(data, dict) and data.get("ok") is False:
        said = data.get("error")
        error: dict[str, object] = said if isinstance(said, dict) else {}
        if error.get("code") == "not_found":
            raise NotThere(str(error.get("message", "not found"))[:200])
        raise NotAnswered(f"{error.get('code')}: {str(error.get('message', ''))[:200]}")
    try:
        return reply.model_validate(data)
    except ValidationError:
        raise NotAnswered("the control plane's answer is unreadable") from None
