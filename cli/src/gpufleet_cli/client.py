"""The CLI's only door to the bus: NATS request/reply (a user has no JetStream rights: logs and
dead letters are read through the services' requests).

All asyncio lives here: every public function runs one `asyncio.run` with one connection.
Replies are JSON objects; `{"ok": false, ...}` becomes a `ServiceError`, a missing service or
server a `CliError` with a message that says what to check.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from gpufleet_auth import Creds, connect_options
from gpufleet_contracts import Envelope, subjects
from nats.aio.client import Client

from . import settings as settings_mod

T = TypeVar("T")

SOURCE = "gpufleet/cli"
CONNECT_TIMEOUT_S = 3.0
RETRY_AFTER_S = 3.0  # a repeatable request still unanswered is asked again after this
RETRY_PAUSE_S = 0.25  # after "no responders" (a service restarting)


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


# --- helpers shared by the sync API and the session ---------------------------------


def rpc_type(subject: str) -> str:
    """Default CloudEvents type of a request: rpc.billing.balance -> gpufleet.billing.balance.v1."""
    return f"gpufleet.{subject.removeprefix(subjects.RPC + '.')}.v1"


def request_headers(subject: str, ce_type: str | None = None) -> dict[str, str]:
    """CloudEvents headers. No identity: the server knows who is asking."""
    env = Envelope(type=ce_type or rpc_type(subject), source=SOURCE, subject=subject)
    return env.headers()


def addressed(subject: str) -> str:
    """An account request goes to the acting account's subject
    (`gpufleet.v1.rpc.billing.balance` -> `....balance.<account>`); others as they are."""
    if not subject.startswith(subjects.RPC + ".") or subject.count(".") != 4:
        return subject
    cfg = settings_mod.load()
    account = cfg.acting_account()
    if account is None:
        raise CliError(_no_account(cfg), "unauthenticated")
    return subjects.as_account(subject, account)


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
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise CliError(f"{subject} answered something that is not JSON", "internal") from exc
    if not isinstance(reply, dict):
        raise CliError(
            f"{subject} answered a JSON {type(reply).__name__}, not an object", "internal"
        )
    if reply.get("ok") is False:
        raise ServiceError(reply)
    return reply


def _forbidden(subject: str) -> CliError:
    return CliError(
        f"this identity may not publish to {subject} (the NATS server refused it)", "forbidden"
    )


def _no_answer(subject: str) -> CliError:
    url = settings_mod.load().url
    return CliError(
        f"no service answered on {subject} (is `just up` running? GPUFLEET_NATS_URL={url})"
    )


# --- the async session --------------------------------------------------------------


class Refusals:
    """The server's permission violations on a connection (its -ERR, delivered to the
    error callback): a request the server refused fails at once, saying so."""

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


class Session:
    """One NATS connection, used by exactly one `asyncio.run`."""

    def __init__(self, nc: Client, timeout_s: float, refusals: Refusals | None = None) -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.refusals = refusals or Refusals()

    async def send(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """Raw request/reply; a subject this identity may not publish to fails at once."""
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
                    raise _forbidden(subject)
            msg = request.result()
        except (nats.errors.NoRespondersError, TimeoutError) as exc:
            if self.refusals.refused(subject):
                raise _forbidden(subject) from exc
            raise _no_answer(subject) from exc
        data: bytes = msg.data
        return data

    async def send_retrying(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> bytes:
        """`send` for a request that is safe to repeat (a read, or one with a request id):
        asked again every RETRY_AFTER_S, earlier asks still waiting, until one is answered or
        `timeout_s` has passed. A service instance that holds a request without answering
        (paused, overloaded) then costs the user seconds, not the whole timeout: another
        instance of its queue group hears the next ask."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        asks: set[asyncio.Future[bytes]] = set()
        failure: CliError | None = None
        try:
            while (left := deadline - loop.time()) > 0:
                asks.add(asyncio.ensure_future(self.send(subject, payload, headers, left)))
                done, asks = await asyncio.wait(
                    asks, timeout=min(RETRY_AFTER_S, left), return_when=asyncio.FIRST_COMPLETED
                )
                for ask in done:
                    exc = ask.exception()
                    if exc is None:
                        return ask.result()
                    if not isinstance(exc, CliError) or exc.code == "forbidden":
                        raise exc
                    failure = exc  # nobody answered it (no responders: asked again soon)
                if done and not asks:
                    await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, deadline - loop.time())))
        finally:
            for ask in asks:
                ask.cancel()
        raise failure or _no_answer(subject)

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


LOGS_SUBJECT = subjects.rpc("scheduler", "job_logs")


Cursor = dict[str, int]  # per node, the last sequence read of its log stream


async def _log_page(
    s: Session, job_id: str, cursor: Cursor
) -> tuple[list[StreamRecord], Cursor, bool]:
    """One page of a job's logs from the scheduler (users cannot read the streams)."""
    body = json.dumps({"job_id": job_id, "cursor": cursor}).encode()
    reply = await s.request(LOGS_SUBJECT, body, ce_type="gpufleet.job.logs.v1")
    records = [
        StreamRecord(
            subject=str(c["subject"]),
            data=base64.b64decode(str(c["data"])),
            seq=int(c["seq"]),
            time=datetime.fromisoformat(str(c["time"])) if c.get("time") else None,
        )
        for c in reply.get("chunks") or []
        if isinstance(c, dict)
    ]
    got = reply.get("cursor")
    after = {str(k): int(v) for k, v in got.items()} if isinstance(got, dict) else cursor
    return records, after, bool(reply.get("more"))


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


async def _noop_cb(*_: Any) -> None:
    """nats-py logs every connection error by default; the CLI reports them itself."""


def _options(cfg: settings_mod.CliSettings) -> dict[str, Any]:
    """This identity's connect options: its replies come to the inbox the services answer the
    acting account in (an operator's acting for an account: under that account's)."""
    account = cfg.acting_account()
    path = cfg.creds
    if path is not None and path.exists() and account:
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
    return connect_options(path, cfg.nats_ca, acting_for=account)


async def _connect(servers: list[str], refusals: Refusals | None = None) -> Client:
    cfg = settings_mod.load()
    options = _options(cfg)
    try:
        nc: Client = await asyncio.wait_for(
            nats.connect(
                servers=servers,
                **options,
                name="gpufleet-cli",
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                connect_timeout=CONNECT_TIMEOUT_S,
                error_cb=refusals.on_error if refusals is not None else _noop_cb,
            ),
            timeout=CONNECT_TIMEOUT_S * 2 * max(len(servers), 1),
        )
    except nats.errors.Error as exc:
        if "authorization" in str(exc).lower():
            raise CliError(
                f"NATS at {', '.join(servers)} refused this identity ({exc}): run "
                "`gpufleet login --creds FILE` with a valid credential",
                "unauthenticated",
            ) from exc
        raise CliError(
            f"cannot connect to NATS at {', '.join(servers)} "
            "(is `just up` running? set GPUFLEET_NATS_URL)"
        ) from exc
    except (OSError, TimeoutError) as exc:
        raise CliError(
            f"cannot connect to NATS at {', '.join(servers)} "
            "(is `just up` running? set GPUFLEET_NATS_URL)"
        ) from exc
    return nc


def run(fn: Callable[[Session], Awaitable[T]]) -> T:
    """Connect, run `fn` with a session, close: the one `asyncio.run` of a command."""
    cfg = settings_mod.load()

    async def main() -> T:
        refusals = Refusals()
        nc = await _connect(cfg.servers, refusals)
        try:
            return await fn(Session(nc, cfg.request_timeout_s, refusals))
        except nats.errors.ConnectionClosedError as exc:
            raise CliError(f"the connection to NATS at {cfg.url} was lost") from exc
        except nats.errors.Error as exc:  # anything else the bus refused (JetStream API, ...)
            raise CliError(f"NATS: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

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
