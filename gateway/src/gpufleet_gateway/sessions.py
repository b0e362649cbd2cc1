"""Signed-in people: a random session id (the browser's cookie), the short-lived credential
redeemed for that person, and the person's own connections to the bus.

Nothing here is written to disk: a restarted gateway has forgotten every session (people sign
in again). A session ends at sign-out, at its credential's expiry or when the gateway stops,
and its connections are closed then. At sign-out its credential is also revoked on the servers
(`end`); otherwise it expires by itself there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpufleet_auth import Creds
from gpufleet_client import Client
from gpufleet_contracts.console import ConsoleSession

# A connection as `creds`, acting for an account (an operator's, for its own subjects: None).
Connector = Callable[[Creds, str | None], Awaitable[Client]]
Redeemer = Callable[[str], Awaitable[ConsoleSession]]
# Revoke a signed-out person's credential on the servers (the provisioner's EndConsoleSession).
Ender = Callable[[Creds], Awaitable[None]]

log = logging.getLogger("gpufleet.gateway.sessions")


@dataclass
class Person:
    """One signed-in person: whom their credential acts for, and their connections."""

    session_id: str
    creds: Creds = field(repr=False)
    account: str | None  # None: an operator
    expires_at: float  # Unix seconds: the credential's
    connect: Connector = field(repr=False)
    clients: dict[str | None, Client] = field(default_factory=dict, repr=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def operator(self) -> bool:
        return self.account is None

    async def client(self, acting_for: str | None = None) -> Client:
        """The connection a request goes on. A user's acts for its own account, whatever is
        asked; an operator's acts for `acting_for` (its own subjects: None), one connection
        per account, since the services answer an account's request only in its inboxes."""
        key = acting_for if self.operator else self.account
        async with self.lock:
            client = self.clients.get(key)
            if client is None or client.nc.is_closed:
                client = await self.connect(self.creds, key if self.operator else None)
                self.clients[key] = client
            return client

    async def close(self) -> None:
        async with self.lock:
            clients, self.clients = list(self.clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()


class Sessions:
    """Every signed-in person by session id."""

    def __init__(
        self,
        redeem: Redeemer,
        connect: Connector,
        end: Ender,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redeem = redeem
        self.connect = connect
        self.end = end
        self.clock = clock
        self.people: dict[str, Person] = {}

    async def sign_in(self, code: str) -> Person:
        """Redeem a one-time code (refused as the provisioner refuses it) and connect as the
        person it was opened for: a credential the server refuses signs nobody in."""
        session = await self.redeem(code)
        person = Person(
            session_id=secrets.token_urlsafe(32),
            creds=Creds.parse(session.creds),
            account=None if session.operator else session.account,
            expires_at=float(session.expires_at),
            connect=self.connect,
        )
        await person.client()
        self.people[person.session_id] = person
        return person

    def find(self, session_id: str | None) -> Person | None:
        """The person of a session id; None for none, an unknown one or an expired one."""
        person = self.people.get(session_id or "")
        if person is None or person.expires_at <= self.clock():
            return None
        return person

    async def sign_out(self, session_id: str) -> None:
        """The person's connections closed and their credential revoked; a revocation that
        fails (the provisioner unreachable) is logged, and the credential then expires."""
        person = await self._drop(session_id)
        if person is None:
            return
        try:
            await self.end(person.creds)
        except Exception as exc:
            log.warning("a signed-out console credential was not revoked: %s", exc)

    async def _drop(self, session_id: str) -> Person | None:
        person = self.people.pop(session_id, None)
        if person is not None:
            await person.close()
        return person

    async def expire(self) -> None:
        """Drop every session whose credential has expired, closing its connections."""
        now = self.clock()
        for session_id in [s for s, p in self.people.items() if p.expires_at <= now]:
            await self._drop(session_id)

    async def close(self) -> None:
        for session_id in list(self.people):
            await self._drop(session_id)
