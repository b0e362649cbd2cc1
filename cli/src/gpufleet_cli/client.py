"""The CLI's only door to the bus: NATS request/reply and JetStream reads.

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
from gpufleet_auth import connect_options
from gpufleet_contracts import Envelope, subjects
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from . import settings as settings_mod

T = TypeVar("T")

SOURCE = "gpufleet/cli"
CONNECT_TIMEOUT_S = 3.0
FETCH_BATCH = 256


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
    account = settings_mod.load().acting_account()
    if account is None:
        raise CliError(
            "no identity: run `gpufleet login --creds FILE` (`just up` prints the file), or set "
            "GPUFLEET_NATS_CREDS; an operator also sets GPUFLEET_ACCOUNT",
            "unauthenticated",
        )
    return subjects.as_account(subject, account)


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

    async def _consumer(self, stream: str, subject: str, start_seq: int | None) -> Any:
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start_seq else DeliverPolicy.ALL,
            opt_start_seq=start_seq,
        )
        js = self.nc.jetstream(timeout=self.timeout_s)
        try:
            return await js.pull_subscribe(subject, stream=stream, config=config)
        except nats.js.errors.NotFoundError as exc:
            raise CliError(f"stream {stream} does not exist yet", "not_found") from exc
        except nats.js.errors.ServiceUnavailableError as exc:
            raise CliError(f"JetStream is not available on {self.nc.connected_url}") from exc

    async def _drain(self, sub: Any, on_msg: Callable[[StreamRecord], None]) -> None:
        """Deliver every message the consumer has now, until `num_pending` is 0."""
        info = await sub.consumer_info()
        pending = int(info.num_pending)
        while pending > 0:
            try:
                msgs: list[Msg] = await sub.fetch(min(pending, FETCH_BATCH), timeout=5.0)
            except TimeoutError:
                return
            for m in msgs:
                on_msg(_record(m))
                pending = int(m.metadata.num_pending)

    async def read(
        self, stream: str, subject: str, *, last: int | None = None
    ) -> list[StreamRecord]:
        """Every message of `stream` on `subject` (or the stream's `last` ones) in order."""
        start = None
        if last is not None:
            start = await self._start_seq(stream, last)
        sub = await self._consumer(stream, subject, start)
        out: list[StreamRecord] = []
        try:
            await self._drain(sub, out.append)
        finally:
            await _close_sub(sub)
        return out

    async def _start_seq(self, stream: str, last: int) -> int:
        js = self.nc.jetstream(timeout=self.timeout_s)
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError as exc:
            raise CliError(f"stream {stream} does not exist yet", "not_found") from exc
        state = info.state
        return max(int(state.first_seq or 1), int(state.last_seq or 0) - last + 1, 1)

    async def follow(
        self,
        stream: str,
        subject: str,
        on_msg: Callable[[StreamRecord], None],
        done: Callable[[Session], Awaitable[bool]],
        interval_s: float = 1.0,
    ) -> None:
        """Deliver what is there, then new messages, until `done` (checked every interval)."""
        sub = await self._consumer(stream, subject, None)
        try:
            await self._drain(sub, on_msg)
            while True:
                try:
                    for m in await sub.fetch(FETCH_BATCH, timeout=interval_s):
                        on_msg(_record(m))
                except TimeoutError:
                    pass
                if await done(self):
                    await asyncio.sleep(interval_s)  # late chunks of the last moments
                    await self._drain(sub, on_msg)
                    return
        finally:
            await _close_sub(sub)


LOGS_SUBJECT = subjects.rpc("scheduler", "job_logs")


async def _log_page(s: Session, job_id: str, after: int) -> tuple[list[StreamRecord], int, bool]:
    """One page of a job's logs from the scheduler (users cannot read the stream itself)."""
    body = json.dumps({"job_id": job_id, "after": after}).encode()
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
    return records, int(reply.get("last_seq") or after), bool(reply.get("more"))


async def _drain_logs(
    s: Session, job_id: str, after: int, on_msg: Callable[[StreamRecord], None]
) -> int:
    while True:
        records, after, more = await _log_page(s, job_id, after)
        for r in records:
            on_msg(r)
        if not more:
            return after


def read_logs(job_id: str) -> list[StreamRecord]:
    """Every log chunk of a job, oldest first."""
    out: list[StreamRecord] = []
    run(lambda s: _drain_logs(s, job_id, 0, out.append))
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
        after = await _drain_logs(s, job_id, 0, on_msg)
        while True:
            await asyncio.sleep(interval_s)
            after = await _drain_logs(s, job_id, after, on_msg)
            if done(await s.request(subject_, payload, ce_type=ce_type)):
                await asyncio.sleep(interval_s)  # late chunks of the last moments
                await _drain_logs(s, job_id, after, on_msg)
                return

    run(follow)


def _record(m: Msg) -> StreamRecord:
    meta = m.metadata
    return StreamRecord(
        subject=m.subject, data=m.data, seq=int(meta.sequence.stream), time=meta.timestamp
    )


async def _close_sub(sub: Any) -> None:
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


async def _noop_cb(*_: Any) -> None:
    """nats-py logs every connection error by default; the CLI reports them itself."""


async def _connect(servers: list[str], refusals: Refusals | None = None) -> Client:
    cfg = settings_mod.load()
    try:
        nc: Client = await asyncio.wait_for(
            nats.connect(
                servers=servers,
                **connect_options(cfg.creds, cfg.nats_ca),
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


def send(subject: str, payload: bytes, headers: dict[str, str], timeout: float) -> bytes:
    """Raw request/reply (tests replace this to capture what would be sent)."""
    return run(lambda s: s.send(subject, payload, headers, timeout))


def request(
    subject: str, payload: bytes, *, ce_type: str | None = None, timeout: float | None = None
) -> dict[str, Any]:
    """Ask the service on `subject`; its JSON reply, or ServiceError / CliError."""
    headers = request_headers(subject, ce_type)
    timeout = timeout or settings_mod.load().request_timeout_s
    data = send(addressed(subject), payload, headers, timeout)
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


def read_stream(stream: str, subject: str, *, last: int | None = None) -> list[StreamRecord]:
    """The messages of `stream` on `subject` (ordered by sequence), then stop."""
    return run(lambda s: s.read(stream, subject, last=last))


def follow_stream(
    stream: str,
    subject: str,
    on_msg: Callable[[StreamRecord], None],
    poll: tuple[str, bytes, str],
    done: Callable[[dict[str, Any]], bool],
) -> None:
    """Deliver messages as they arrive until `done(reply)` for the request `poll`.

    `poll` is (subject, payload, CloudEvents type), asked every second.
    """
    subject_, payload, ce_type = poll

    async def is_done(s: Session) -> bool:
        return done(await s.request(subject_, payload, ce_type=ce_type))

    run(lambda s: s.follow(stream, subject, on_msg, is_done))
