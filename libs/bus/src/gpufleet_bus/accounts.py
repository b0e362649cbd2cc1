"""Who is speaking, read from the subject the server let through: the acting account of a
request (R-TEN-2), the node a worker fact came from."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from gpufleet_contracts import subjects
from gpufleet_contracts.subjects import ACCOUNT_RE

from .notices import Notices

log = logging.getLogger("gpufleet.bus")


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


def node_of(msg: Any) -> str | None:
    """The node a worker fact came from: the last token of the subject it arrived on
    (`gpufleet.v1.evt.worker.finished.<minion_id>`), which only that node's credential (or
    a service) may publish. `msg` is a FastStream message or a subject."""
    subject = msg if isinstance(msg, str) else getattr(msg.raw_message, "subject", "")
    return subjects.token_at(str(subject), -1)


# A node sends as many such facts as it likes (its heartbeats are not even stored): the
# warning is logged once for a node, then once a minute with the count (notices.py).
_MISNAMED = Notices()


def on_its_own_subject(msg: Any, minion_id: str) -> bool:
    """Whether a fact naming node `minion_id` in its body arrived on that node's subject.
    The body is the sender's word: a node may publish its own subject only, so a body naming
    another node (to pass a check against the placement's node) is refused here."""
    sender = node_of(msg)
    if sender == minion_id:
        return True
    notice = _MISNAMED.note(str(sender))
    if notice is not None:
        log.warning(
            "a fact naming node %s arrived on the subject of %s: ignored (%s)",
            minion_id,
            sender,
            notice.text(),
        )
    return False


INBOX_PREFIX = "_INBOX."


def is_inbox(subject: str | None, scope: str = subjects.INBOX) -> bool:
    """Whether a reply subject is an inbox (under `scope`): the only kind gpufleet answers to."""
    return bool(subject) and str(subject).startswith(f"{scope}.")


def reply_scope(subject: str) -> str | None:
    """The inboxes the answer to a request on `subject` may go to: what the subject proves of
    who asked (a requester chooses the reply subject, and could aim the answer at another
    identity's inbox). An account's request: that account's (`_INBOX.account.<account>`,
    its users' and the operators acting for it). An enrolment (`enroll.<minion_id>`): that
    minion's join tokens'. A node's request (`nrpc.<service>.<verb>.<minion_id>`): that
    node's (`_INBOX.node.<minion_id>`). What only services and operators may publish (an operator's
    `adm` request, a request to a node, to a service's instances, one on no account's
    subject): any inbox. Anything else (a node's own subjects, events): none."""
    account = subjects.rpc_account(subject)
    if account is not None and ACCOUNT_RE.fullmatch(account):
        return subjects.account_inbox(account)
    asking_node = subjects.node_rpc_node(subject)
    if asking_node is not None and ACCOUNT_RE.fullmatch(asking_node):
        return subjects.node_inbox(asking_node)
    if subject.startswith(f"{subjects.ENROLL}."):
        minion_id = subjects.token_at(subject, -1)
        return subjects.enroll_inbox(minion_id) if subject.count(".") == 3 and minion_id else None
    trusted = (
        subjects.RPC,
        subjects.ADMIN,
        subjects.NODES,
        subjects.INTERNAL,
        subjects.SERVICE_CALLS,
    )
    if subject.startswith(tuple(f"{prefix}." for prefix in trusted)):
        return subjects.INBOX
    return None


def may_answer(subject: str, reply: str | None) -> bool:
    """Whether a request on `subject` may be answered on `reply` (reply_scope)."""
    scope = reply_scope(subject)
    return scope is not None and is_inbox(reply, scope)


def received_at(msg: Any) -> datetime | None:
    """When the stream stored a JetStream message (its server timestamp): the latest a
    sender's claimed times may be, and the same on every redelivery and replay. None for a
    message that did not come through JetStream."""
    try:
        stamp = msg.raw_message.metadata.timestamp
    except Exception:  # not a JetStream message
        return None
    return stamp if isinstance(stamp, datetime) else None
