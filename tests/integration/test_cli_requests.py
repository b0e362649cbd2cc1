"""The CLI's requests against a real nats-server: a request that is safe to repeat is asked
again while unanswered (gpufleet_cli.client.Session.send_retrying), so one service instance
that holds requests without answering (paused) or a service not yet back costs seconds."""

from __future__ import annotations

import asyncio

import pytest
from gpufleet_cli import client
from gpufleet_cli.client import CliError, Session
from gpufleet_devstack import NatsServer
from nats.aio.msg import Msg

from .conftest import admin_connect

SUBJECT = "gpufleet.test.ask"


async def test_an_ask_held_by_one_instance_is_answered_by_another(
    fresh_nats: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "RETRY_AFTER_S", 0.3)
    held: list[Msg] = []
    services, user = await admin_connect(fresh_nats), await admin_connect(fresh_nats)

    async def hold(msg: Msg) -> None:
        held.append(msg)  # a paused instance: heard, never answered

    async def answer(msg: Msg) -> None:
        await msg.respond(b"answered:" + msg.data)

    await services.subscribe(SUBJECT, "q", cb=hold)
    await services.flush()
    session = Session(user, timeout_s=30)
    asking = asyncio.ensure_future(session.send_retrying(SUBJECT, b"1", {}, 30))
    await asyncio.sleep(0.2)
    assert len(held) == 1 and not asking.done()  # the only member holds it
    await services.subscribe(SUBJECT, "q", cb=answer)  # another instance joins

    assert await asyncio.wait_for(asking, 25) == b"answered:1"
    assert len(held) >= 1
    await services.close()
    await user.close()


async def test_an_ask_nobody_hears_yet_is_asked_again_until_someone_answers(
    fresh_nats: NatsServer,
) -> None:
    services, user = await admin_connect(fresh_nats), await admin_connect(fresh_nats)
    session = Session(user, timeout_s=10)
    with pytest.raises(CliError) as once:  # no responders: a single ask fails at once
        await session.send(SUBJECT, b"x", {}, 10)
    assert "no service answered" in once.value.message

    async def answer(msg: Msg) -> None:
        await msg.respond(b"back")

    async def service_comes_back() -> None:
        await asyncio.sleep(1)
        await services.subscribe(SUBJECT, "q", cb=answer)

    back = asyncio.ensure_future(service_comes_back())
    assert await session.send_retrying(SUBJECT, b"x", {}, 10) == b"back"
    await back
    with pytest.raises(CliError):  # nobody at all: given up at the deadline, not before
        await session.send_retrying("gpufleet.test.nobody", b"x", {}, 1)
    await services.close()
    await user.close()
