"""Console sign-in (R-TEN-2): a short-lived credential of the asking person, kept sealed under a
one-time code until the console gateway redeems it.

A user asks on its own account's subject, so the credential minted is a user's of that account
(the same permissions as every user of it); an operator asks on the operators' subject and gets
an operator's. The credential expires (`ttl_s`, at most 12 h) whether or not the console drops
it. The code is stored as its hash beside a box only the code opens (gpufleet_auth.codes), is
void after two minutes, and is spent by its first redemption; a code unknown, spent or expired
answers `not found` alike. Only the gateway's identity (and operators) may publish the
redemption subject (the permission table), so a code read off a screen is worth nothing to
anyone else on the bus, and the gateway hands it back only to the browser that brought it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from gpufleet_auth import Creds, Issuer
from gpufleet_auth.codes import code_id, new_code, open_under, seal_under
from gpufleet_auth.sealing import SealError
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.console import (
    CODE_TTL_S,
    AdminOpenConsoleSession,
    ConsoleCode,
    ConsoleSession,
    ConsoleSessionEnded,
    EndConsoleSession,
    OpenConsoleSession,
    RedeemConsoleCode,
)
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_store import Store, now_ms
from pymongo import IndexModel

log = logging.getLogger("gpufleet.provisioner.console")

# `console_credentials`: each credential's public key, its account and expiry, so that a
# removed account's sessions are revoked with it (identity.py).
INDEXES: dict[str, list[IndexModel]] = {"console_codes": [], "console_credentials": []}
UNKNOWN = "no such console code (unknown, spent or expired)"


# Put a public key on the revocation list and push it (identity.Identity.revoke_key).
Revoker = Callable[[str, str], Awaitable[None]]


class ConsoleSignIn:
    def __init__(self, store: Store, issuer: Issuer | None, clock: Clock, revoke: Revoker) -> None:
        self.db = store.db
        self.issuer = issuer
        self.clock = clock
        self.revoke = revoke

    def _issuer(self) -> Issuer:
        if self.issuer is None:
            raise Refused("unavailable", "this provisioner holds no signing keys: no console")
        return self.issuer

    async def open(self, body: OpenConsoleSession, account: str) -> ConsoleCode:
        """A user's: a console session acting for the account of the asking connection."""
        expires = int(time.time()) + body.ttl_s
        creds = self._issuer().user(account, "console", expires=expires)
        return await self._keep(creds, account, expires)

    async def admin_open(self, body: AdminOpenConsoleSession) -> ConsoleCode:
        """An operator's: a console session that sees every account."""
        expires = int(time.time()) + body.ttl_s
        creds = self._issuer().operator("console", expires=expires)
        return await self._keep(creds, None, expires)

    async def _keep(self, creds: Creds, account: str | None, expires: int) -> ConsoleCode:
        code = new_code()
        code_expires = int(time.time()) + CODE_TTL_S
        await self.db.console_credentials.insert_one(
            {"_id": creds.public_key, "account": account, "expires_at": expires}
        )
        await self.db.console_codes.insert_one(
            {
                "_id": code_id(code),
                "box": seal_under(code, creds.text()),
                "account": account,
                "expires_at": code_expires,
                "session_expires_at": expires,
                "issued_at_ms": now_ms(self.clock()),
            }
        )
        log.info("console session opened for %s", account or "an operator")
        return ConsoleCode(code=code, expires_at=code_expires, session_expires_at=expires)

    async def redeem(self, body: RedeemConsoleCode) -> ConsoleSession:
        """The gateway's: the code's credential, once; the code is deleted as it is read."""
        doc = await self.db.console_codes.find_one_and_delete({"_id": code_id(body.code)})
        if doc is None or int(doc["expires_at"]) <= int(time.time()):
            raise NotFound(UNKNOWN)
        try:
            creds = open_under(body.code, str(doc["box"]))
        except SealError:
            raise NotFound(UNKNOWN) from None
        account = doc.get("account")
        return ConsoleSession(
            creds=creds,
            account=account,
            operator=account is None,
            expires_at=int(doc["session_expires_at"]),
        )

    async def end(self, body: EndConsoleSession) -> ConsoleSessionEnded:
        """The gateway's, at sign-out: the session's credential revoked on the servers now.
        Only a console credential of this provisioner's is ended (not found otherwise)."""
        doc = await self.db.console_credentials.find_one_and_delete({"_id": body.public_key})
        if doc is None:
            raise NotFound("no such console session (unknown, ended or expired)")
        whose = f"console:{doc.get('account') or 'operator'}"
        await self.revoke(body.public_key, whose)
        log.info("console session of %s ended", doc.get("account") or "an operator")
        return ConsoleSessionEnded(public_key=body.public_key)

    async def expire(self) -> None:
        """Forget codes never redeemed, and credentials expired."""
        now = int(time.time())
        await self.db.console_codes.delete_many({"expires_at": {"$lte": now}})
        await self.db.console_credentials.delete_many({"expires_at": {"$lte": now}})
