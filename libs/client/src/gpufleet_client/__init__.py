"""gpufleet's public Python client: `await client.ask(GetJob(job_id=...))` answers a JobView.

async with await Client.connect(Creds.read("me.creds"), "nats://127.0.0.1:4333") as client:
    view = await client.ask(GetJob(job_id="j-1"))
"""

from .addressing import addressed, base_subject, headers_of, repeatable, reply_model, subject_of
from .client import Client, Refusals, decode, parse
from .errors import (
    BadReply,
    ClientError,
    Disconnected,
    Forbidden,
    ServiceError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "BadReply",
    "Client",
    "ClientError",
    "Disconnected",
    "Forbidden",
    "Refusals",
    "ServiceError",
    "Unauthenticated",
    "Unavailable",
    "addressed",
    "base_subject",
    "decode",
    "headers_of",
    "parse",
    "repeatable",
    "reply_model",
    "subject_of",
]
