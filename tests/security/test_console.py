"""Attack class: the web console's sign-in (R-TEN-2; gateway/README.md, threat model).

A console session is a short-lived credential of the person who asked for it, kept under a
one-time code that only the gateway's identity may redeem; the gateway's identity can do
nothing else."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet_auth import Creds
from gpufleet_contracts import subjects
from gpufleet_contracts.console import (
    SESSION_TTL_S,
    AdminOpenConsoleSession,
    EndConsoleSession,
    RedeemConsoleCode,
)

from .attack import Client, connect_refused
from .conftest import ATTACKER_ACCOUNT, VICTIM_ACCOUNT, System, attacker_subject

REDEEM = RedeemConsoleCode.SUBJECT
END = EndConsoleSession.SUBJECT


def victims(service: str, verb: str) -> str:
    return subjects.as_account(subjects.rpc(service, verb), VICTIM_ACCOUNT)


async def test_a_code_is_redeemed_once_by_the_gateway_alone_for_its_own_account(
    system: System, eve: Path
) -> None:
    async with Client(system.nats.url, eve) as attacker:
        opened = await attacker.request(attacker_subject("provisioner", "open_console_session"), {})
        code = opened["code"]
        # the attacker cannot redeem a code (its own or a stolen one), nor open an operator's
        await attacker.request_refused(REDEEM, {"code": code})
        await attacker.request_refused(AdminOpenConsoleSession.SUBJECT, {})
    async with Client(system.nats.url, system.nats.creds("gateway"), name="gateway") as gateway:
        session = await gateway.request(REDEEM, {"code": code})
        again = await gateway.request(REDEEM, {"code": code})
        unknown = await gateway.request(REDEEM, {"code": "A" * 43})
    assert again["error"]["code"] == unknown["error"]["code"] == "not_found"
    assert session["account"] == ATTACKER_ACCOUNT and session["operator"] is False
    creds = Creds.parse(session["creds"])
    assert creds.tag("account") == ATTACKER_ACCOUNT and creds.kind == "user"
    expires = creds.claims["exp"]
    assert isinstance(expires, int) and expires <= time.time() + SESSION_TTL_S + 5
    # the console credential acts for the attacker's own account only
    async with Client(system.nats.url, creds, name="console") as console:
        own = await console.request(attacker_subject("scheduler", "list_jobs"), {})
        assert "jobs" in own
        await console.request_refused(victims("scheduler", "list_jobs"))
        await console.request_refused(REDEEM, {"code": code})
    # only the gateway ends a session (at its sign-out), and only a console credential: the
    # attacker's own user key is not one; the ended credential is refused from then on
    async with Client(system.nats.url, eve) as attacker:
        await attacker.request_refused(END, {"public_key": creds.public_key})
    async with Client(system.nats.url, system.nats.creds("gateway"), name="gateway") as gateway:
        users = await gateway.request(END, {"public_key": Creds.read(eve).public_key})
        assert users["error"]["code"] == "not_found"
        assert (await gateway.request(END, {"public_key": creds.public_key}))["revoked"] is True
    await connect_refused(system.nats.url, creds)


async def test_the_gateways_identity_may_do_nothing_but_redeem(system: System) -> None:
    async with Client(system.nats.url, system.nats.creds("gateway"), name="gateway") as gateway:
        await gateway.request_refused(victims("scheduler", "list_jobs"))
        await gateway.request_refused(victims("provisioner", "open_console_session"))
        await gateway.request_refused(subjects.admin("provisioner", "list_accounts"))
        await gateway.request_refused(AdminOpenConsoleSession.SUBJECT, {})
        await gateway.subscribe_refused(subjects.event("job", "queued"))
