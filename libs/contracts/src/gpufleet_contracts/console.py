"""Signing in to the web console (R-TEN-2): a one-time code for a short-lived credential.

A person asks the provisioner for a console session as themselves (`gpufleet console login`:
an account's user on its own account's subject, an operator on the operators' subject). The
provisioner mints a short-lived credential with that person's own permissions, keeps it sealed
under a random one-time code and answers with the code. The console gateway redeems the code
(the only identity besides operators that may ask) and makes that person's requests on that
credential, so every request it makes acts for the account of its connection.
"""

from __future__ import annotations

from pydantic import Field

from . import subjects
from .base import Command, Message

CODE_TTL_S = 120  # a code not redeemed in two minutes is void
SESSION_TTL_S = 12 * 3600  # the credential's lifetime, unless asked shorter
CODE_PATTERN = r"^[A-Za-z0-9_-]{32,128}$"


class ConsoleCode(Message):
    """The reply to OpenConsoleSession: the one-time code, shown once (only its hash is kept)."""

    code: str = Field(repr=False)
    expires_at: int  # Unix seconds: the code's
    session_expires_at: int  # Unix seconds: the credential's, once redeemed


class OpenConsoleSession(Command):
    """An account's user: a console session acting for the account of the asking connection,
    with a user's permissions of that account, for `ttl_s` at most."""

    TYPE = "gpufleet.console.open_session.v1"
    SUBJECT = subjects.rpc("provisioner", "open_console_session")
    REPLY = ConsoleCode
    ttl_s: int = Field(default=SESSION_TTL_S, ge=60, le=SESSION_TTL_S, strict=True)


class AdminOpenConsoleSession(OpenConsoleSession):
    """An operator: a console session with an operator's permissions (every account)."""

    TYPE = "gpufleet.console.admin_open_session.v1"
    SUBJECT = subjects.admin("provisioner", "open_console_session")


class ConsoleSession(Message):
    """The reply to RedeemConsoleCode: the short-lived credential (a `.creds` text) and whom
    it acts for; it travels only to the redeeming gateway's own inbox."""

    creds: str = Field(repr=False)
    account: str | None = None  # None: an operator's, acting for every account
    operator: bool = False
    expires_at: int  # Unix seconds


class RedeemConsoleCode(Command):
    """The console gateway: exchange a one-time code for the credential it was opened with.
    A code is spent by its first redemption; unknown, spent and expired codes answer alike."""

    TYPE = "gpufleet.console.redeem_code.v1"
    SUBJECT = subjects.service_call("provisioner", "redeem_console_code")
    REPLY = ConsoleSession
    code: str = Field(pattern=CODE_PATTERN, repr=False)


class ConsoleSessionEnded(Message):
    """The reply to EndConsoleSession: the credential's key, now on the revocation list."""

    public_key: str
    revoked: bool = True


class EndConsoleSession(Command):
    """The console gateway at a person's sign-out: revoke that session's credential on the
    servers at once, instead of letting it live until it expires. Only a console credential
    the provisioner minted is ended (any other key answers not found), so the gateway's
    identity can end sessions, never cut off a user's or a node's own credential."""

    TYPE = "gpufleet.console.end_session.v1"
    SUBJECT = subjects.service_call("provisioner", "end_console_session")
    REPLY = ConsoleSessionEnded
    public_key: str = Field(pattern=r"^U[A-Z2-7]{55}$")
