"""The CLI's only door to the bus: gpufleet_client's requests, one connection per command (a
user has no JetStream rights: logs and dead letters are read through the services' requests).

All asyncio lives here: every public function runs one `asyncio.run` with one connection.
`ask` sends a request model and answers its reply model; `request` is the same for a subject
and a JSON body of its own. A refusal becomes a `ServiceError`, a missing service or server a
`CliError` with a message that says what to check.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, overload

import gpufleet_client as gc
import nats
import nats.errors
from gpufleet_auth import Creds
from gpufleet_client import Refusals
from gpufleet_contracts import subjects
from gpufleet_contracts.base import Command
from gpufleet_contracts.jobs import GetJobLogs, JobLogs
from nats.aio.client import Client
from pydantic import BaseModel

from . import settings as settings_mod

T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)

SOURCE = "gpufleet/cli"
CONNECT_TIMEOUT_S = gc.client.CONNECT_TIMEOUT_S
RETRY_AFTER_S = gc.client.RETRY_AFTER_S  # a repeatable request still unanswered: asked again
# A request model the command line built from bad values is refused as a service would
# refuse it (gpufleet_bus.deadletter.INVALID_MESSAGE), before anything is sent.
INVALID_REQUEST = "the request is not valid"


class CliError(Exception):
    """A failure to report to the user: `code` as in ErrorReply, exit status 1."""

    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def exit_code(self) -> int:
        return 2 if self.code == "invalid" else 1

    def reply(self) -> dict[str, Any]:
        """The ErrorReply-shaped object printed with --json."""
        return {"ok": False, "error": {"code": self.code, "message": self.message, "fields": []}}


class ServiceError(CliError):
    """A service refused the request; `reply` is its ErrorReply object, unchanged."""

    def __init__(self, reply: dict[str, Any]) -> None:
        body = reply.get("error")
        if not isinstance(body, dict):
            body = {}
        super().__init__(str(body.get("message") or "request refused"), str(body.get("code")))
        self.body = body
        self.raw = reply

    @property
    def fields(self) -> list[dict[str, Any]]:
        fields = self.body.get("fields") or []
        return [f for f in fields if isinstance(f, dict)]

    def reply(self) -> dict[str, Any]:
        return self.raw


@dataclass(frozen=True)
class StreamRecord:
    """One JetStream message: its subject, raw bytes, stream sequence and time."""

    subject: str
    data: bytes
    seq: int
    time: datetime | None = None


# --- what the library says, in the command line's words -----------------------------


def cli_error(exc: gc.ClientError) -> CliError:
    """The CliError of a gpufleet_client failure, saying what to check."""
    if isinstance(exc, gc.ServiceError):
        return ServiceError(exc.raw)
    if isinstance(exc, gc.Disconnected):
        return CliError(f"the connection to NATS at {settings_mod.load().url} was lost")
    if isinstance(exc, gc.Unauthenticated) and exc.subject is not None:
        return CliError(_no_account(settings_mod.load()), "unauthenticated")
    if isinstance(exc, gc.Unavailable) and exc.subject is not None:
        return _no_answer(exc.subject)
    return CliError(exc.message, exc.code)


@contextmanager
def _said() -> Iterator[None]:
    try:
        yield
    except gc.ClientError as exc:
        raise cli_error(exc) from exc


def request_headers(subject: str, ce_type: str | None = None) -> dict[str, str]:
    """CloudEvents headers. No identity: the server knows who is asking."""
    return gc.headers_of(subject, ce_type, SOURCE)


def addressed(subject: str) -> str:
    """An account request goes to the acting account's subject
    (`gpufleet.v1.rpc.billing.balance` -> `....balance.<account>`); others as they are."""
    if not gc.addressing.is_account_request(subject):
        return subject
    with _said():
        return gc.addressed(subject, settings_mod.load().acting_account())


def _no_account(cfg: settings_mod.CliSettings) -> str:
    """What to do when a request has no account to act for."""
    path = cfg.creds
    if path is not None and path.exists() and Creds.read(path).kind == "operator":
        return (
            "an operator's credential acts for no account of its own: set "
            "GPUFLEET_ACCOUNT=<account> to act for one (`gpufleet admin account list`), "
            "or see every account's jobs with `gpufleet job list --all-accounts`"
        )
    return (
        "no identity: run `gpufleet login --creds FILE` (`just up` prints the file), or set "
        "GPUFLEET_NATS_CREDS; an operator also sets GPUFLEET_ACCOUNT"
    )


def parse_reply(subject: str, data: bytes) -> dict[str, Any]:
    """Decode a reply; raise ServiceError on `"ok": false`."""
    with _said():
        return gc.parse(subject, data)


def typed(model: type[R], subject: str, raw: dict[str, Any]) -> R:
    """A reply object as its model (a service answering something else: `internal`)."""
    with _said():
        return gc.client.validated(model, subject, raw)


def _no_answer(subject: str) -> CliError:
    url = settings_mod.load().url
    return CliError(
        f"no service answered on {subject} (is `just up` running? GPUFLEET_NATS_URL={url})"
    )


# --- the async session --------------------------------------------------------------


class Session:
    """One NATS connection, used by exactly one `asyncio.run`: a gpufleet_client.Client whose
    failures are CliErrors."""

    def __init__(
        self,
        nc: Client,
        timeout_s: float,
        refusals: Refusals | None = None,
        account: str | None = None,
    ) -> None:
        self.client = gc.Client(
            nc,
            account=account,
            timeout_s=timeout_s,
            retry_after_s=RETRY_AFTER_S,
            refusals=refusals,
            source=SOURCE,
        )
        self.timeout_s = timeout_s

    @property
    def nc(self) -> Client:
        return self.client.nc

    async def send(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """Raw request/reply; a subject this identity may not publish to fails at once."""
        with _said():
            return await self.client.send_once(subject, payload, headers, timeout_s)

    async def send_retrying(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """`send` for a request that is safe to repeat, asked again while unanswered
        (gpufleet_client.Client.send_retrying)."""
        with _said():
            return await self.client.send_retrying(subject, payload, headers, timeout_s)

    async def request(
        self,
        subject: str,
        payload: bytes,
        *,
        ce_type: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        headers = request_headers(subject, ce_type)
        data = await self.send(addressed(subject), payload, headers, timeout_s or self.timeout_s)
        return parse_reply(subject, data)

    async def ask(self, request: Command, reply: type[R]) -> R:
        """`request` on this session; its reply as `reply` (the request's REPLY)."""
        base = gc.base_subject(request)
        headers = request_headers(base, request.TYPE)
        data = await self.send(addressed(base), request.to_bytes(), headers, self.timeout_s)
        return typed(reply, base, parse_reply(base, data))


Cursor = dict[str, int]  # per node, the last sequence read of its log stream


async def _log_page(
    s: Session, job_id: str, cursor: Cursor
) -> tuple[list[StreamRecord], Cursor, bool]:
    """One page of a job's logs from the scheduler (users cannot read the streams)."""
    page = await s.ask(GetJobLogs(job_id=job_id, cursor=cursor), JobLogs)
    records = [
        StreamRecord(
            subject=c.subject,
            data=base64.b64decode(c.data),
            seq=c.seq,
            time=datetime.fromisoformat(c.time) if c.time else None,
        )
        for c in page.chunks
    ]
    return records, page.cursor if "cursor" in page.model_fields_set else cursor, page.more


async def _drain_logs(
    s: Session, job_id: str, cursor: Cursor, on_msg: Callable[[StreamRecord], None]
) -> Cursor:
    while True:
        records, cursor, more = await _log_page(s, job_id, cursor)
        for r in records:
            on_msg(r)
        if not more:
            return cursor


def read_logs(job_id: str) -> list[StreamRecord]:
    """Every log chunk of a job, oldest first."""
    out: list[StreamRecord] = []
    run(lambda s: _drain_logs(s, job_id, {}, out.append))
    return out


def follow_logs(
    job_id: str,
    on_msg: Callable[[StreamRecord], None],
    poll: tuple[str, bytes, str],
    done: Callable[[dict[str, Any]], bool],
    interval_s: float = 1.0,
) -> None:
    """Deliver a job's log chunks as they arrive until `done(reply)` for the request `poll`."""
    subject_, payload, ce_type = poll

    async def follow(s: Session) -> None:
        after = await _drain_logs(s, job_id, {}, on_msg)
        while True:
            await asyncio.sleep(interval_s)
            after = await _drain_logs(s, job_id, after, on_msg)
            if done(await s.request(subject_, payload, ce_type=ce_type)):
                await asyncio.sleep(interval_s)  # late chunks of the last moments
                await _drain_logs(s, job_id, after, on_msg)
                return

    run(follow)


def _check_inbox(cfg: settings_mod.CliSettings) -> None:
    """A user's credential must take its replies in the acting account's inboxes, where the
    services answer it: one issued before they did is refused here, saying what to do."""
    account = cfg.acting_account()
    path = cfg.creds
    if path is None or not path.exists() or not account:
        return
    creds = Creds.read(path)
    if creds.kind == "user" and not creds.inbox_prefix.startswith(
        f"{subjects.account_inbox(account)}."
    ):
        raise CliError(
            "this credential was issued before replies went to an account's own inboxes, "
            "so no service would answer it: ask an operator for a new one (`gpufleet "
            f"admin user add {account} {creds.tag('user') or 'USER'}` issues it again; "
            "`just up` renews the local one)",
            "unauthenticated",
        )


async def _connect(cfg: settings_mod.CliSettings) -> gc.Client:
    """This identity's connection (its replies come to the inbox the services answer the
    acting account in; an operator's acting for an account: under that account's)."""
    _check_inbox(cfg)
    where = ", ".join(cfg.servers)
    try:
        return await gc.Client.connect(
            cfg.creds,
            cfg.servers,
            name="gpufleet-cli",
            acting_for=cfg.acting_account(),
            ca=cfg.nats_ca,
            timeout_s=cfg.request_timeout_s,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            retry_after_s=RETRY_AFTER_S,
            reconnect=False,
            source=SOURCE,
        )
    except gc.Unauthenticated as exc:
        raise CliError(
            f"NATS at {where} refused this identity ({exc.__cause__}): run "
            "`gpufleet login --creds FILE` with a valid credential",
            "unauthenticated",
        ) from exc
    except gc.Unavailable as exc:
        raise CliError(
            f"cannot connect to NATS at {where} (is `just up` running? set GPUFLEET_NATS_URL)"
        ) from exc


def run(fn: Callable[[Session], Awaitable[T]]) -> T:
    """Connect, run `fn` with a session, close: the one `asyncio.run` of a command."""
    cfg = settings_mod.load()

    async def main() -> T:
        connection = await _connect(cfg)
        try:
            session = Session(
                connection.nc, cfg.request_timeout_s, connection.refusals, connection.account
            )
            return await fn(session)
        except nats.errors.ConnectionClosedError as exc:
            raise CliError(f"the connection to NATS at {cfg.url} was lost") from exc
        except nats.errors.Error as exc:  # anything else the bus refused (JetStream API, ...)
            raise CliError(f"NATS: {type(exc).__name__}: {exc}") from exc
        finally:
            await connection.close()

    return asyncio.run(main())


# --- the synchronous API the commands use -------------------------------------------


def send(
    subject: str, payload: bytes, headers: dict[str, str], timeout: float, retry: bool = False
) -> bytes:
    """Raw request/reply (tests replace this to capture what would be sent); with `retry`
    (a request safe to repeat) asked again while unanswered (Session.send_retrying)."""
    if retry:
        return run(lambda s: s.send_retrying(subject, payload, headers, timeout))
    return run(lambda s: s.send(subject, payload, headers, timeout))


def request(
    subject: str,
    payload: bytes,
    *,
    ce_type: str | None = None,
    timeout: float | None = None,
    retry: bool = False,
) -> dict[str, Any]:
    """Ask the service on `subject`; its JSON reply, or ServiceError / CliError. `retry`
    only for a request that is safe to repeat: a read, or one that carries a request id."""
    headers = request_headers(subject, ce_type)
    timeout = timeout or settings_mod.load().request_timeout_s
    data = send(addressed(subject), payload, headers, timeout, retry)
    return parse_reply(subject, data)


def asked(
    request_: Command,
    *,
    subject: str | None = None,
    timeout: float | None = None,
    retry: bool | None = None,
) -> dict[str, Any]:
    """The reply object to a request model, as the service sent it (what --json prints);
    asked again while unanswered when the request is repeatable (a read, or one with its
    request id) unless `retry` says otherwise."""
    base = gc.base_subject(request_, subject)
    again = gc.repeatable(request_) if retry is None else retry
    return request(base, request_.to_bytes(), ce_type=request_.TYPE, timeout=timeout, retry=again)


@overload
def ask(
    request_: Command,
    reply: type[R],
    *,
    subject: str | None = None,
    timeout: float | None = None,
    retry: bool | None = None,
) -> R: ...


@overload
def ask(
    request_: Command,
    reply: None = None,
    *,
    subject: str | None = None,
    timeout: float | None = None,
    retry: bool | None = None,
) -> BaseModel: ...


def ask(
    request_: Command,
    reply: type[BaseModel] | None = None,
    *,
    subject: str | None = None,
    timeout: float | None = None,
    retry: bool | None = None,
) -> BaseModel:
    """gpufleet_client's `ask` for one command: the reply as the request's REPLY model (or
    `reply`, a subclass of it), a refusal as ServiceError, no answer as CliError."""
    model = gc.reply_model(request_)
    if reply is not None and not issubclass(reply, model):
        raise TypeError(f"{type(request_).__name__} is answered by {model.__name__}")
    raw = asked(request_, subject=subject, timeout=timeout, retry=retry)
    return typed(reply or model, gc.base_subject(request_, subject), raw)


def checked(
    request_: Command, *, timeout: float | None = None, retry: bool | None = None
) -> dict[str, Any]:
    """The reply object to a request model as the service sent it, once it validated as the
    request's REPLY (for the tables that read the object itself)."""
    raw = asked(request_, timeout=timeout, retry=retry)
    typed(gc.reply_model(request_), gc.base_subject(request_), raw)
    return raw


def request_many(
    calls: Sequence[tuple[str, bytes]], timeout: float, *, ce_type: str | None = None
) -> list[dict[str, Any] | CliError]:
    """Several requests at once on one connection; each result is a reply or its error."""

    async def one(s: Session, subject: str, payload: bytes) -> dict[str, Any] | CliError:
        try:
            return await s.request(subject, payload, ce_type=ce_type, timeout_s=timeout)
        except CliError as exc:
            return exc

    async def all_(s: Session) -> list[dict[str, Any] | CliError]:
        return list(await asyncio.gather(*(one(s, subj, p) for subj, p in calls)))

    return run(all_)
