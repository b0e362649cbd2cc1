"""Signed-in people: a session lasts as long as its credential, and ends with its connections."""

from __future__ import annotations

import tempfile
from typing import Any

from gpufleet_auth import Authority, Creds
from gpufleet_contracts.console import ConsoleSession
from gpufleet_gateway.sessions import Sessions


class Connection:
    """What a session holds of a connection: whether it is closed."""

    def __init__(self, acting_for: str | None) -> None:
        self.acting_for = acting_for
        self.nc = self
        self.is_closed = False

    async def close(self) -> None:
        self.is_closed = True


def sessions(
    account: str | None, expires_at: int, now: list[float], ended: list[str] | None = None
) -> tuple[Sessions, list[Any]]:
    """Sessions over a fake redeemer and connector; `ended`: the public keys revoked."""
    issuer = Authority.load_or_create(tempfile.mkdtemp()).issuer
    creds = issuer.operator("console") if account is None else issuer.user(account, "console")
    opened: list[Any] = []

    async def redeem(code: str) -> ConsoleSession:
        return ConsoleSession(
            creds=creds.text(), account=account, operator=account is None, expires_at=expires_at
        )

    async def connect(c: Creds, acting_for: str | None) -> Any:
        opened.append(Connection(acting_for))
        return opened[-1]

    async def end(c: Creds) -> None:
        if ended is None:
            raise ConnectionError("the provisioner cannot be reached")
        ended.append(c.public_key)

    return Sessions(redeem, connect, end, clock=lambda: now[0]), opened


async def test_a_users_connection_acts_for_its_own_account_whatever_is_asked() -> None:
    now = [1000.0]
    people, opened = sessions("acme", 2000, now)
    person = await people.sign_in("code")
    assert await person.client("other") is await person.client() is opened[0]
    assert opened[0].acting_for is None and len(opened) == 1  # the credential's own account
    assert people.find(person.session_id) is person
    now[0] = 2000.0
    assert people.find(person.session_id) is None  # expired with its credential
    await people.expire()
    assert opened[0].is_closed and not people.people


async def test_an_operator_gets_one_connection_per_account_and_sign_out_closes_them() -> None:
    ended: list[str] = []
    people, opened = sessions(None, 5000, [0.0], ended)
    person = await people.sign_in("code")
    await person.client("acme")
    await person.client("acme")
    await person.client("beta")
    assert [c.acting_for for c in opened] == [None, "acme", "beta"]
    await people.sign_out(person.session_id)
    assert all(c.is_closed for c in opened) and people.find(person.session_id) is None
    assert ended == [person.creds.public_key]  # revoked on the servers too
    await people.sign_out(person.session_id)  # again: nothing more to end
    assert ended == [person.creds.public_key]


async def test_a_revocation_that_fails_still_signs_the_person_out() -> None:
    people, opened = sessions("acme", 5000, [0.0])  # its `end` cannot reach the provisioner
    person = await people.sign_in("code")
    await people.sign_out(person.session_id)
    assert opened[0].is_closed and people.find(person.session_id) is None
