"""An attacker's NATS client: connect as some identity, try one thing, see it refused.

The server refuses a publish or a subscription its credential does not allow with a
`-ERR 'Permissions Violation for ...'`, which nats-py hands to `error_cb` (the connection
stays up); a refused connection is an `Authorization Violation`. `Client` keeps every
error the server sent, so a test can say which attempt was refused, and how.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import nats.errors
from gpufleet_auth import Creds
from gpufleet_contracts import Envelope, Message
from nats.aio.client import Client as NatsClient
from nats.js.api import PubAck

SOURCE = "gpufleet/attacker"
REFUSAL_WAIT_S = 3.0  # the server's -ERR comes at once; this is only an upper bound
NO_ANSWER_S = 0.7  # a refused publish is never answered: how long to wait for nothing


class Client:
    """One connection as `creds` (a .creds file, parsed credentials, or None: anonymous):
    an attacker's, or the victim's own (its requests are those its CLI makes)."""

    def __init__(self, url: str, creds: Path | Creds | None, name: str = "attacker") -> None:
        self.url = url
        self.creds = Creds.read(creds) if isinstance(creds, Path) else creds
        self.name = name
        self.errors: list[str] = []
        self.disconnected = asyncio.Event()
        self._nc: NatsClient | None = None

    @property
    def nc(self) -> NatsClient:
        assert self._nc is not None, "not connected"
        return self._nc

    async def connect(self) -> Client:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        async def on_disconnect() -> None:
            self.disconnected.set()

        self._nc = await nats.connect(
            self.url,
            name=self.name,
            allow_reconnect=False,
            connect_timeout=3,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            closed_cb=on_disconnect,
            **(self.creds.connect_options() if self.creds else {}),
        )
        return self

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- attempts -----------------------------------------------------------------------

    async def publish(
        self, subject: str, payload: bytes = b"{}", headers: dict[str, str] | None = None
    ) -> None:
        await self.nc.publish(subject, payload, headers=headers)
        await self.nc.flush()

    async def send(self, subject: str, msg: Message) -> None:
        """`msg` as a producer would send it (CloudEvents headers), on `subject`."""
        payload, headers = wire(msg, subject)
        await self.publish(subject, payload, headers)

    async def js_send(self, subject: str, msg: Message, wait_s: float = 5.0) -> PubAck:
        """`msg` published on JetStream; the ack says it was stored (and where)."""
        payload, headers = wire(msg, subject)
        ack: PubAck = await self.nc.jetstream(timeout=wait_s).publish(
            subject, payload, headers=headers
        )
        return ack

    async def request(
        self,
        subject: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        wait_s: float = 10.0,
    ) -> dict[str, Any]:
        envelope = Envelope(type="gpufleet.attack.v1", source=SOURCE, subject=subject)
        reply = await self.nc.request(
            subject,
            json.dumps(body).encode(),
            timeout=wait_s,
            headers={**envelope.headers(), **(headers or {})},
        )
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def aim(self, subject: str, body: dict[str, Any], reply: str) -> None:
        """A request whose answer is aimed at `reply` (someone else's inbox), not at this
        connection's own: published with that reply subject, answered (if at all) there."""
        envelope = Envelope(type="gpufleet.attack.v1", source=SOURCE, subject=subject)
        await self.nc.publish(
            subject, json.dumps(body).encode(), reply=reply, headers=envelope.headers()
        )
        await self.nc.flush()

    # --- refusals -----------------------------------------------------------------------

    async def refusal(self, action: str, subject: str) -> str:
        """The server's `permissions violation for <action> to "<subject>"` (waited for)."""
        wanted = f'permissions violation for {action} to "{subject.lower()}"'
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REFUSAL_WAIT_S
        while loop.time() < deadline:
            found = [e for e in self.errors if wanted in e]
            if found:
                return found[0]
            await asyncio.sleep(0.05)
        raise AssertionError(f"the server did not refuse: {wanted} (errors: {self.errors})")

    async def publish_refused(
        self, subject: str, payload: bytes = b"{}", headers: dict[str, str] | None = None
    ) -> None:
        await self.publish(subject, payload, headers)
        await self.refusal("publish", subject)
        assert self.nc.is_connected  # refused, not disconnected: the refusal is the answer

    async def send_refused(self, subject: str, msg: Message) -> None:
        payload, headers = wire(msg, subject)
        await self.publish_refused(subject, payload, headers)

    async def js_send_refused(self, subject: str, msg: Message) -> None:
        """A JetStream publish the server refuses: no ack ever comes (nothing stored)."""
        try:
            ack = await self.js_send(subject, msg, wait_s=NO_ANSWER_S)
        except nats.errors.TimeoutError:
            pass
        else:
            raise AssertionError(f"JetStream stored the attacker's {subject}: {ack}")
        await self.refusal("publish", subject)

    async def request_refused(self, subject: str, body: dict[str, Any] | None = None) -> None:
        """A request whose publish the server refuses: nobody answers it."""
        try:
            reply = await self.request(subject, body or {}, wait_s=NO_ANSWER_S)
        except nats.errors.TimeoutError:
            pass
        else:
            raise AssertionError(f"{subject} was answered: {reply}")
        await self.refusal("publish", subject)

    async def subscribe_refused(self, subject: str) -> None:
        """A subscription the server refuses: it delivers nothing, even what is published."""
        got: list[bytes] = []

        async def on_msg(msg: Any) -> None:
            got.append(msg.data)

        sub = await self.nc.subscribe(subject, cb=on_msg)
        await self.nc.flush()
        await self.refusal("subscription", subject)
        await asyncio.sleep(0.3)
        assert got == [], f"{subject} delivered {len(got)} messages to the attacker"
        await sub.unsubscribe()


def wire(msg: Message, subject: str) -> tuple[bytes, dict[str, str]]:
    """A message's bytes and CloudEvents headers, as if a producer sent it on `subject`."""
    env = Envelope(type=msg.TYPE, source=SOURCE, subject=subject)
    return msg.to_bytes(), env.headers()


async def connect_refused(url: str, creds: Creds | None, **options: Any) -> str:
    """Connecting is refused (`Authorization Violation`); returns what the server said."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    try:
        nc = await nats.connect(
            url,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
            error_cb=on_error,
            **(creds.connect_options() if creds else {}),
            **options,
        )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        errors.append(str(exc).lower())
    else:
        await nc.close()
        raise AssertionError("the server accepted the connection")
    assert any("authorization violation" in e for e in errors), errors
    return errors[0]
