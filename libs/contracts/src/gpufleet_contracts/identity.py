"""Accounts, users, plans and node enrolment (R-TEN-1..3, R-NODE-2).

Who is who on the bus is decided by NATS credentials (gpufleet_auth); these messages are how
they are issued. Operators create accounts and their users (`gpufleet admin ...`); an account
owner (or an operator) issues a one-time join token for one node; the node exchanges it once
for its own credential, bound to that account, minion id and region.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from . import subjects
from .base import Command, Event, Message
from .errors import rule
from .nodes import NodeView

NAME = subjects.ACCOUNT_RE.pattern  # a name is one subject token

# R-TEN-1: names no tenant account may take, because the platform uses them itself. The
# platform's revenue ledger account is PLATFORM_ACCOUNT (billing.fees.PLATFORM); billing's
# sub-accounts ("earnings:<account>") and any "_"-prefixed name cannot be taken either, as NAME
# allows neither ":" nor a leading "_". Compared case-insensitively.
PLATFORM_ACCOUNT = "platform"
RESERVED_ACCOUNTS: frozenset[str] = frozenset({PLATFORM_ACCOUNT})
ACCOUNT_VALID = (
    "1-64 letters, digits, _ and -, starting with a letter or digit; "
    f"not {', '.join(sorted(RESERVED_ACCOUNTS))}"
)


def _not_reserved(name: str) -> str:
    if name.lower() in RESERVED_ACCOUNTS:
        raise PydanticCustomError(
            "reserved_account",
            "account name {name!r} is reserved for the platform",
            {"name": name, "rule": "R-TEN-1", "valid": ACCOUNT_VALID},
        )
    return name


# An account name as a tenant gives it (R-TEN-1): one subject token, not a reserved name.
AccountName = Annotated[
    str,
    Field(pattern=NAME, json_schema_extra=rule("R-TEN-1", **{"x-valid": ACCOUNT_VALID})),
    AfterValidator(_not_reserved),
]


class Plan(StrEnum):
    """R-TEN-3: regional resources (datastores, ports) need `team` or higher."""

    free = "free"
    team = "team"
    enterprise = "enterprise"


def plan_allows_regional(plan: Plan | str) -> bool:
    """R-TEN-3."""
    return Plan(plan) in {Plan.team, Plan.enterprise}


class AccountView(Message):
    """An account as operators see it (the reply to CreateAccount and SetPlan)."""

    account: str
    plan: Plan
    users: list[str] = Field(default_factory=list)


class CreateAccount(Command):
    """Operator request: a tenant account with its plan."""

    TYPE = "gpufleet.account.create.v1"
    SUBJECT = subjects.admin("provisioner", "create_account")
    REPLY = AccountView
    account: AccountName
    plan: Plan = Plan.free


class SetPlan(Command):
    TYPE = "gpufleet.account.set_plan.v1"
    SUBJECT = subjects.admin("provisioner", "set_plan")
    REPLY = AccountView
    account: AccountName
    plan: Plan


class UserAdded(Message):
    """The reply to AddUser: the user's credential, shown once (only its public key is kept)."""

    account: str
    user: str
    creds: str = Field(repr=False)


class AddUser(Command):
    """Operator request: a user of an account; the reply holds the user's credential once."""

    TYPE = "gpufleet.account.add_user.v1"
    SUBJECT = subjects.admin("provisioner", "add_user")
    REPLY = UserAdded
    account: AccountName
    user: str = Field(pattern=NAME)


class UserRevoked(Message):
    """The reply to RevokeUser."""

    account: str
    user: str
    revoked: bool = True


class RevokeUser(Command):
    """Operator request: revoke a user's credential at once (its connections are closed)."""

    TYPE = "gpufleet.account.revoke_user.v1"
    SUBJECT = subjects.admin("provisioner", "revoke_user")
    REPLY = UserRevoked
    account: AccountName
    user: str = Field(pattern=NAME)


class Accounts(Message):
    """The reply to ListAccounts."""

    accounts: list[AccountView]


class ListAccounts(Command):
    """Operator request: every account, its plan and its users."""

    TYPE = "gpufleet.account.list.v1"
    SUBJECT = subjects.admin("provisioner", "list_accounts")
    REPLY = Accounts
    READ = True


class AccountChanged(Event):
    """An account was created or its plan changed (services that gate on plans listen)."""

    TYPE = "gpufleet.account.changed.v1"
    SUBJECT = subjects.event("account", "changed")
    account: str
    plan: Plan
    at: datetime


class RemovedAccount(Message):
    """The reply to RemoveAccount: what was cut off with the account."""

    account: str
    removed_at: datetime
    users: list[str] = Field(default_factory=list)  # whose credentials were revoked
    console_sessions: int = 0  # console credentials revoked
    join_tokens: int = 0  # unspent join tokens voided


class RemoveAccount(Command):
    """Operator request: remove a tenant account. Refused (`conflict`, naming the field)
    while it still holds nodes or enrolled nodes or devices; its users' and console
    credentials are revoked at once and its unspent join tokens voided. The name is kept
    as a tombstone: it cannot be created again (its jobs and ledger stay under it). An
    unknown or already removed account is not found."""

    TYPE = "gpufleet.account.remove.v1"
    SUBJECT = subjects.admin("provisioner", "remove_account")
    REPLY = RemovedAccount
    account: AccountName


class AccountRemoved(Event):
    """An account was removed (its credentials are revoked; its name is never reused)."""

    TYPE = "gpufleet.account.removed.v1"
    SUBJECT = subjects.event("account", "removed")
    account: str
    at: datetime


class JoinTokenIssued(Message):
    """The reply to IssueJoinToken: the token, shown once (only its secret's hash is kept)."""

    minion_id: str
    region: str
    expires_at: int  # Unix seconds
    token: str = Field(repr=False)


class IssueJoinToken(Command):
    """An account's request (or an operator's for any account): a one-time join token for
    one node. The token is shown once; only its hash is stored."""

    TYPE = "gpufleet.node.issue_join_token.v1"
    SUBJECT = subjects.rpc("provisioner", "issue_join_token")
    REPLY = JoinTokenIssued
    minion_id: str = Field(pattern=NAME)
    region: str = Field(pattern=NAME)
    ttl_s: int = Field(default=24 * 3600, ge=60, le=30 * 24 * 3600, strict=True)


class AdminIssueJoinToken(IssueJoinToken):
    TYPE = "gpufleet.node.admin_issue_join_token.v1"
    SUBJECT = subjects.admin("provisioner", "issue_join_token")
    account: AccountName


class NodeEnrolled(Message):
    """The reply to EnrollNode: the node's credential JWT, bound to its key."""

    jwt: str
    account: str
    region: str
    minion_id: str


class EnrollNode(Command):
    """A node exchanging its join token (sent with the token's enrolment-only credential, on
    `gpufleet.v1.enroll.<minion_id>`). Only the node's public key travels: its seed never
    leaves the node."""

    TYPE = "gpufleet.node.enroll.v1"
    SUBJECT = subjects.ENROLL + ".{minion_id}"
    REPLY = NodeEnrolled
    minion_id: str = Field(pattern=NAME)
    secret: str = Field(min_length=16, max_length=256, repr=False)
    public_key: str = Field(pattern=r"^U[A-Z2-7]{55}$")


class RevokeNode(Command):
    """Cut a node off at once: its credential is revoked on the server, its command consumer
    deleted, and it is removed (its workers are lost: R-NODE-5)."""

    TYPE = "gpufleet.node.revoke.v1"
    SUBJECT = subjects.rpc("provisioner", "revoke_node")
    REPLY = NodeView
    node: str = Field(min_length=1, max_length=128)
