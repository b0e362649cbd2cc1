"""Where a request goes and whether it may be asked again, read from its model alone."""

from __future__ import annotations

from gpufleet_contracts import Envelope, subjects
from gpufleet_contracts.base import Command
from pydantic import BaseModel

from .errors import Unauthenticated

SOURCE = "gpufleet/client"


def is_account_request(subject: str) -> bool:
    """`gpufleet.v1.rpc.<service>.<verb>`: a base the acting account's token completes."""
    return subject.startswith(subjects.RPC + ".") and subject.count(".") == 4


def is_node_request(subject: str) -> bool:
    """`gpufleet.v1.nrpc.<service>.<verb>`: a base the asking node's token completes."""
    return subject.startswith(subjects.NODE_RPC + ".") and subject.count(".") == 4


def addressed(subject: str, account: str | None, node: str | None = None) -> str:
    """The subject as sent: an account's request under the acting account's token
    (`....billing.balance` -> `....billing.balance.acme`), a node's under its minion id,
    any other as it is."""
    if is_node_request(subject):
        if not node:
            raise Unauthenticated(f"{subject} is a node's request: ask it as a node", subject)
        return subjects.as_node(subject, node)
    if not is_account_request(subject):
        return subject
    if not account:
        raise Unauthenticated(
            f"{subject} is an account's request and this connection acts for no account "
            "(an operator's credential names one with acting_for)",
            subject,
        )
    return subjects.as_account(subject, account)


def base_subject(request: Command, subject: str | None = None) -> str:
    """The request's subject before the account token: `subject` when given (a model that
    several services answer, as HealthCheck or ListDeadLetters), else its model's."""
    if subject is not None:
        return subject
    if not request.SUBJECT:
        raise TypeError(
            f"{type(request).__name__} names no subject (several services answer it): "
            "pass subject=, e.g. subjects.rpc('billing', 'health')"
        )
    return request.subject()


def subject_of(
    request: Command, account: str | None, subject: str | None = None, node: str | None = None
) -> str:
    """The subject `request` is sent on by a connection acting for `account` (or `node`)."""
    return addressed(base_subject(request, subject), account, node)


def reply_model(request: Command) -> type[BaseModel]:
    """The model that answers `request` (its REPLY)."""
    if request.REPLY is None:
        raise TypeError(f"{type(request).__name__} is not a request: no reply answers it")
    return request.REPLY


def repeatable(request: Command) -> bool:
    """Safe to ask again while unanswered: a read, or a command carrying its request id (the
    service answers a repeat with what the first did)."""
    return request.READ or getattr(request, "request_id", None) is not None


def headers_of(subject: str, ce_type: str | None = None, source: str = SOURCE) -> dict[str, str]:
    """CloudEvents headers of a request on `subject` (its base, before any account token).
    No identity: the server knows who is asking."""
    return Envelope(type=ce_type or rpc_type(subject), source=source, subject=subject).headers()


def rpc_type(subject: str) -> str:
    """The CloudEvents type of a request whose model names none:
    `gpufleet.v1.rpc.billing.balance` -> `gpufleet.billing.balance.v1`."""
    return f"gpufleet.{subject.removeprefix(subjects.RPC + '.')}.v1"
