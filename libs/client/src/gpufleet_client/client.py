"""One NATS connection that asks gpufleet's services: a request model in, its reply model out.

The subject comes from the request model (its SUBJECT, completed by the acting account's
token for an account's request), the answer is validated into the model's REPLY, a refusal
is raised as `ServiceError`, no answer as `Unavailable`. A request that is safe to repeat (a
read, or a command with its request id) is asked again while unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, overload

import nats
import nats.errors
from gpufleet_auth import Creds, connect_options
from gpufleet_contracts.base import Command
from nats.aio.client import Client as Connection
from pydantic import BaseModel, ValidationError

from .addressing import SOURCE, addressed, base_subject, headers_of, repeatable, reply_model
from .errors import (
    BadReply,
    ClientError,
    Disconnected,
    Forbidden,
    Unauthenticated,
    Unavailable,
    refusal,
)

R = TypeVar("R", bound=BaseModel)

TIMEOUT_S = 10.0  # an ask unanswered this long is Unavailable
CONNECT_TIMEOUT_S = 3.0
RETRY_AFTER_S = 3.0  # a repeatable request still unanswered is asked again after this
RETRY_PAUSE_S = 0.25  # after "no responders" (a service restarting)


class Refusals:
    """The server's permission violations on a connection (its -ERR, delivered to the error
    callback): a request the server refused fails at once, saying so."""

    def __init__(self) -> None:
        self.subjects: list[str] = []
        self.changed = asyncio.Event()

    async def on_error(self, exc: Exception) -> None:
        text = str(exc)
        if "permissions violation" in text.lower():
            self.subjects.append(text.rsplit(" ", 1)[-1].strip("'\""))
            self.changed.set()

    def refused(self, subject: str) -> bool:
        return subject in self.subjects


def forbidden(subject: str) -> Forbidden:
    return Forbidden(
        f"this identity may not publish to {subject} (the NATS server refused it)", subject
    )


def no_answer(subject: str) -> Unavailable:
    return Unavailable(f"no service answered on {subject}", subject)


def parse(subject: str, data: bytes) -> dict[str, Any]:
    """A reply's JSON object; `"ok": false` raised as the ServiceError it says."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise BadReply(f"{subject} answered something that is not JSON", subject) from exc
    if not isinstance(raw, dict):
        raise BadReply(f"{subject} answered a JSON {type(raw).__name__}, not an object", subject)
    if raw.get("ok") is False:
        raise refusal(raw, subject)
    return raw


def decode(model: type[R], subject: str, data: bytes) -> R:
    """A reply validated into `model` (or the ServiceError / BadReply it is)."""
    return validated(model, subject, parse(subject, data))


def validated(model: type[R], subject: str, raw: dict[str, Any]) -> R:
    """A reply object (not a refusal) as `model`, or BadReply."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadReply(
            f"{subject} answered something that is not a {model.__name__}: "
            f"{exc.error_count()} field(s) wrong",
            subject,
        ) from exc


def options_of(
    creds: Creds | Path | str | None, ca: Path | str | None, acting_for: str | None
) -> dict[str, Any]:
    """`nats.connect` keyword arguments of a credential, in memory or in a file."""
    if isinstance(creds, Creds):
        return {**creds.connect_options(acting_for), **connect_options(None, ca)}
    return connect_options(creds, ca, acting_for=acting_for)


def identity_of(
    creds: Creds | Path | str | None, acting_for: str | None
) -> tuple[str | None, str | None]:
    """The account requests are made for (the credential's own, or for an operator's, which
    has none, the one it acts for) and the node a node agent's credential is."""
    if creds is None:
        return acting_for, None
    parsed = creds if isinstance(creds, Creds) else Creds.read(creds)
    node = parsed.tag("minion") if parsed.kind == "node" else None
    return parsed.tag("account") or acting_for, node


async def _quiet(*_: Any) -> None:
    """nats-py logs every connection error by default; the asker reports them itself."""


class Client:
    """One connection asking gpufleet's services as one identity (see the module)."""

    def __init__(
        self,
        nc: Connection,
        *,
        account: str | None = None,
        node: str | None = None,
        timeout_s: float = TIMEOUT_S,
        retry_after_s: float = RETRY_AFTER_S,
        refusals: Refusals | None = None,
        source: str = SOURCE,
    ) -> None:
        self.nc = nc
        self.account = account
        self.node = node
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.refusals = refusals or Refusals()
        self.source = source

    @classmethod
    async def connect(
        cls,
        creds: Creds | Path | str | None,
        servers: str | list[str],
        *,
        name: str = "gpufleet-client",
        acting_for: str | None = None,
        ca: Path | str | None = None,
        timeout_s: float = TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        retry_after_s: float = RETRY_AFTER_S,
        reconnect: bool = True,
        source: str = SOURCE,
    ) -> Self:
        """Connect as `creds` (a Creds, or a .creds file's path). `servers`: one URL, a
        comma-separated list or a list. `acting_for`: the account an operator's credential
        asks for (a user's credential acts for its own). `reconnect=False` for a short-lived
        client (a command line) that should fail rather than wait for a server."""
        urls = [s.strip() for s in servers.split(",")] if isinstance(servers, str) else servers
        urls = [u for u in urls if u]
        where = ", ".join(urls)
        refusals = Refusals()
        try:
            nc = await asyncio.wait_for(
                nats.connect(
                    servers=urls,
                    **options_of(creds, ca, acting_for),
                    name=name,
                    allow_reconnect=reconnect,
                    max_reconnect_attempts=-1 if reconnect else 1,
                    reconnect_time_wait=1.0 if reconnect else 0.1,
                    connect_timeout=connect_timeout_s,
                    error_cb=refusals.on_error,
                    disconnected_cb=_quiet,
                ),
                timeout=connect_timeout_s * 2 * max(len(urls), 1),
            )
        except nats.errors.Error as exc:
            if "authorization" in str(exc).lower():
                raise Unauthenticated(f"NATS at {where} refused this identity ({exc})") from exc
            raise Unavailable(f"cannot connect to NATS at {where} ({exc})") from exc
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot connect to NATS at {where}") from exc
        account, node = identity_of(creds, acting_for)
        return cls(
            nc,
            account=account,
            node=node,
            timeout_s=timeout_s,
            retry_after_s=retry_after_s,
            refusals=refusals,
            source=source,
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- typed requests --------------------------------------------------------------

    @overload
    async def ask(
        self,
        request: Command,
        reply: type[R],
        *,
        subject: str | None = None,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> R: ...

    @overload
    async def ask(
        self,
        request: Command,
        reply: None = None,
        *,
        subject: str | None = None,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> BaseModel: ...

    async def ask(
        self,
        request: Command,
        reply: type[BaseModel] | None = None,
        *,
        subject: str | None = None,
        timeout_s: float | None = None,
        retry: bool | None = None,
    ) -> BaseModel:
        """Ask the service that answers `request`; its reply as the model's REPLY.

        `reply`: that model or a subclass of it (typing the result for a type checker).
        `subject`: the base subject of a model several services answer (HealthCheck).
        `retry`: ask again while unanswered; by default when the request is repeatable."""
        model = reply_model(request)
        if reply is not None and not issubclass(reply, model):
            raise TypeError(f"{type(request).__name__} is answered by {model.__name__}")
        base = base_subject(request, subject)
        data = await self.send(
            addressed(base, self.account, self.node),
            request.to_bytes(),
            headers_of(base, request.TYPE, self.source),
            timeout_s=timeout_s,
            retry=repeatable(request) if retry is None else retry,
        )
        return decode(reply or model, base, data)

    async def request(
        self,
        subject: str,
        payload: bytes,
        *,
        ce_type: str | None = None,
        timeout_s: float | None = None,
        retry: bool = False,
    ) -> dict[str, Any]:
        """A request on a base subject with a JSON body of its own: the reply's object (a
        refusal raised as ServiceError). `ask` is the typed way."""
        data = await self.send(
            addressed(subject, self.account, self.node),
            payload,
            headers_of(subject, ce_type, self.source),
            timeout_s=timeout_s,
            retry=retry,
        )
        return parse(subject, data)

    # --- the wire ---------------------------------------------------------------------

    async def send(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        *,
        timeout_s: float | None = None,
        retry: bool = False,
    ) -> bytes:
        """Raw request/reply on the subject as sent; `retry`: asked again while unanswered."""
        timeout = timeout_s or self.timeout_s
        if retry:
            return await self.send_retrying(subject, payload, headers, timeout)
        return await self.send_once(subject, payload, headers, timeout)

    async def send_once(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """One ask; a subject this identity may not publish to fails at once."""
        request = asyncio.ensure_future(
            self.nc.request(subject, payload, timeout=timeout_s, headers=headers)
        )
        try:
            while not request.done():
                self.refusals.changed.clear()
                refused = asyncio.ensure_future(self.refusals.changed.wait())
                await asyncio.wait({request, refused}, return_when=asyncio.FIRST_COMPLETED)
                refused.cancel()
                if self.refusals.refused(subject):
                    request.cancel()
                    raise forbidden(subject)
            msg = request.result()
        except (nats.errors.NoRespondersError, TimeoutError) as exc:
            if self.refusals.refused(subject):
                raise forbidden(subject) from exc
            raise no_answer(subject) from exc
        except nats.errors.ConnectionClosedError as exc:
            raise Disconnected(f"the connection to NATS closed asking {subject}", subject) from exc
        data: bytes = msg.data
        return data

    async def send_retrying(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """`send_once` for a request that is safe to repeat: asked again every
        `retry_after_s`, earlier asks still waiting, until one is answered or `timeout_s`
        has passed. A service instance that holds a request without answering (paused,
        overloaded) then costs seconds, not the whole timeout: another instance of its queue
        group hears the next ask."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        asks: set[asyncio.Future[bytes]] = set()
        failure: ClientError | None = None
        try:
            while (left := deadline - loop.time()) > 0:
                asks.add(asyncio.ensure_future(self.send_once(subject, payload, headers, left)))
                done, asks = await asyncio.wait(
                    asks,
                    timeout=min(self.retry_after_s, left),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for ask in done:
                    exc = ask.exception()
                    if exc is None:
                        return ask.result()
                    if not isinstance(exc, Unavailable) or isinstance(exc, Disconnected):
                        raise exc
                    failure = exc  # nobody answered it (no responders: asked again soon)
                if done and not asks:
                    await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - loop.time())))
        finally:
            for ask in asks:
                ask.cancel()
        raise failure or no_answer(subject)
