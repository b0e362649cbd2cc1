"""Accounts, users, plans and node enrolment (R-TEN-1..3, R-NODE-2).

Who is who on the bus is decided by NATS credentials (gpufleet_auth); these messages are how
they are issued. Operators create accounts and their users (`gpufleet admin ...`); an account
owner (or an operator) issues a one-time join token for one node; the node exchanges it once
for its own credential, bound to that account, minion id and region.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from . import subjects
from .base import Command, Event, Message

NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # one subject token (subjects.ACCOUNT_RE)


class Plan(StrEnum):
    """R-TEN-3: regional resources (datastores, ports) need `team` or higher."""

    free = "free"
    team = "team"
    enterprise = "enterprise"


def plan_allows_regional(plan: Plan | str) -> bool:
    """R-TEN-3."""
    return Plan(plan) in {Plan.team, Plan.enterprise}


class CreateAccount(Command):
    """Operator request: a tenant account with its plan."""

    TYPE = "gpufleet.account.create.v1"
    SUBJECT = subjects.admin("provisioner", "create_account")
    account: str = Field(pattern=NAME)
    plan: Plan = Plan.free


class SetPlan(Command):
    TYPE = "gpufleet.account.set_plan.v1"
    SUBJECT = subjects.admin("provisioner", "set_plan")
    account: str = Field(pattern=NAME)
    plan: Plan


class AddUser(Command):
    """Operator request: a user of an account; the reply holds the user's credential once."""

    TYPE = "gpufleet.account.add_user.v1"
    SUBJECT = subjects.admin("provisioner", "add_user")
    account: str = Field(pattern=NAME)
    user: str = Field(pattern=NAME)


class AccountChanged(Event):
    """An account was created or its plan changed (services that gate on plans listen)."""

    TYPE = "gpufleet.account.changed.v1"
    SUBJECT = subjects.event("account", "changed")
    account: str
    plan: Plan
    at: datetime


class IssueJoinToken(Command):
    """An account's request (or an operator's for any account): a one-time join token for
    one node. The token is shown once; only its hash is stored."""

    TYPE = "gpufleet.node.issue_join_token.v1"
    SUBJECT = subjects.rpc("provisioner", "issue_join_token")
    minion_id: str = Field(pattern=NAME)
    region: str = Field(pattern=NAME)
    ttl_s: int = Field(default=24 * 3600, ge=60, le=30 * 24 * 3600, strict=True)


class AdminIssueJoinToken(IssueJoinToken):
    TYPE = "gpufleet.node.admin_issue_join_token.v1"
    SUBJECT = subjects.admin("provisioner", "issue_join_token")
    account: str = Field(pattern=NAME)


class EnrollNode(Command):
    """A node exchanging its join token (sent with the token's enrolment-only credential, on
    `gpufleet.v1.enroll.<minion_id>`). Only the node's public key travels: its seed never
    leaves the node."""

    TYPE = "gpufleet.node.enroll.v1"
    SUBJECT = subjects.ENROLL + ".{minion_id}"
    minion_id: str = Field(pattern=NAME)
    secret: str = Field(min_length=16, max_length=256, repr=False)
    public_key: str = Field(pattern=r"^U[A-Z2-7]{55}$")


class NodeEnrolled(Message):
    """The reply to EnrollNode: the node's credential JWT, bound to its key."""

    jwt: str
    account: str
    region: str
    minion_id: str


class RevokeNode(Command):
    """Cut a node off at once: its credential is revoked on the server, its command consumer
    deleted, and it is removed (its workers are lost: R-NODE-5)."""

    TYPE = "gpufleet.node.revoke.v1"
    SUBJECT = subjects.rpc("provisioner", "revoke_node")
    node: str = Field(min_length=1, max_length=128)
