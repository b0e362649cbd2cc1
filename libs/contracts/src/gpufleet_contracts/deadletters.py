"""Asking a service for the dead letters it kept (the messages it refused).

Every service answers `dead_letters` twice:

- `gpufleet.v1.rpc.<service>.dead_letters.<account>`: the acting account's records only
  (those whose subject named that account), for any user of the account;
- `gpufleet.v1.adm.<service>.dead_letters`: every account's, and those of no account, for
  operators only.

The reply is `{"service": ..., "dead_letters": [record, ...]}`, newest first; a record is a
JSON object with its stream sequence `seq`, `service`, `subject`, `account` (or null),
`reason` (`invalid` or `poison`), `errors`, `headers` (CloudEvents only), `payload` (the
body, redacted, when it was JSON) or `payload_size`/`payload_sha256`/`payload_excerpt`, and
`at` (gpufleet_bus.deadletter).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from .base import Command

VERB = "dead_letters"


class DeadLetters(BaseModel):
    """The reply to ListDeadLetters: one service's records, newest first."""

    service: str
    dead_letters: list[dict[str, Any]]


class ListDeadLetters(Command):
    """The newest `limit` dead letters of one service (see the module's docstring)."""

    TYPE = "gpufleet.dead_letters.list.v1"
    REPLY = DeadLetters
    READ = True
    limit: int = Field(default=50, ge=1, le=1000)
