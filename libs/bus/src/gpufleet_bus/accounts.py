"""The acting account of a request (R-TEN-2), read from the subject the server let through."""

from __future__ import annotations

from typing import Any

from gpufleet_contracts import subjects
from gpufleet_contracts.subjects import ACCOUNT_RE


class NoAccountError(ValueError):
    """A request that arrived on no account's subject: refused, never served as anyone."""


def account_subject(service: str, verb: str) -> str:
    """What a service subscribes to for `verb`: every account's subject of it."""
    return subjects.as_account(subjects.rpc(service, verb), "*")


def account_of(msg: Any) -> str:
    """The acting account of a request (R-TEN-2): the last token of the subject it arrived
    on, which the NATS server lets only that account's credentials publish to
    (gpufleet_auth.permissions). Never a payload field or a header: a client-set header
    such as `gpufleet-account` is ignored. `msg` is a FastStream message or a subject."""
    subject = msg if isinstance(msg, str) else getattr(msg.raw_message, "subject", "")
    account = subjects.rpc_account(str(subject))
    if account is None or not ACCOUNT_RE.fullmatch(account):
        raise NoAccountError(f"{subject!r} names no account")
    return account
