"""Publishes what services wrote to their `outbox` collection, in order, after commit.

An outbox document holds a whole transaction's messages packed into one binary field
(`gpufleet_store.store.outbox_documents`, chunked at 2,000 messages or 4 MB). On the embedded
nx-27017 the outbox costs per document, not per message: about 150 us per inserted document,
against about 56 us per message when many share one document and less still in one binary
field; the relay reads and deletes a document at a time too.

A round takes the oldest unpublished documents (up to 500, or about 5,000 messages) and
publishes every message with core `nc.publish(subject, payload, reply=.., headers=..)`, each
with a reply subject under one wildcard inbox of this relay (`_INBOX.<nuid>.<n>`, one
`nc.subscribe` per connection): JetStream's "async publish". The server answers each on its
reply subject with a PubAck (`{"stream": .., "seq": ..}`) or an error; a subject nobody
listens on is answered with a 503 status. The acks are counted per document, in one
subscription callback, with no future or request per message (`js.publish` makes a request
of each, `js.publish_async` a future). Only nats-py's public API is used (`publish`,
`subscribe`, `new_inbox`, `max_payload`), so nats-py has no upper bound here.

Measured (benchmarks/outbox: 20,000 messages in transactions of 500, 2 cores, medians of
alternating runs): the relay publishes ~7,000-9,000 messages/s when the machine is not
busy, bound by the server's acks more than by its own CPU, ~55 us a message; about 20 us of
that is nats-py encoding, validating and cleaning the nine headers of each message (most of
it a `str.translate` of each value). The HPUB command the relay used to build itself and
hand to nats-py's private writer saved those ~20 us and 7-26 % of the rate, for a tie to
one nats-py version's internals: it is gone. A PubAck is recognised without decoding its
JSON, and a subject's stream is looked up once. When a transaction's messages were first
packed in one document (from a document and a request a message): writing went from
~8,000 to ~38,000 messages/s, the relay from ~1,300 to ~10,000 messages/s, and nx-27017
from ~11 s of CPU to ~0.2 s.

A document whose every message is acknowledged is deleted (`keep=timedelta(0)`) or marked
`published` (kept for `keep`, for inspection). Only the longest acknowledged prefix of a
round's documents is marked; after an error ack, a connection problem or 5 s without every
ack the rest is sent again later, whole, under the same message ids (`Nats-Msg-Id`), which
JetStream drops if it already has them: nothing is lost and nothing is doubled. One
connection keeps the order of its publishes, so messages go out in the order of their
documents (created_at, seq) and, within one, of their emits. A message on a subject no stream
holds is published without a reply and counts as done at once: core NATS, as FastStream's
`publish` does for it.

Messages go out on the broker's own connection, not through FastStream's `publish`: its
per-publish middleware (an OpenTelemetry span each) cost more CPU than the rest of a job's
path. The bytes and headers are those `js.publish` sent (CloudEvents headers, `Nats-Msg-Id`,
`Nats-Expected-Stream`, and the W3C trace context a message was emitted with: tracing.py);
what is not recorded is a producer span per outbox message.

The documents a transaction of this process committed are handed to the relay with the
commit (`Store.outbox_written`) and published from memory, without reading them back: the
store is read at start, after any failed round (memory is then dropped: what was not
acknowledged goes out from the store, oldest first) and every `poll_s` for documents other
processes left. Reading them back cost nx-27017 a query and the decoding of every round's
blobs while the service's next transaction waited behind it.

With `keep`, nx-27017 scans the whole outbox for `{published: false}` at every poll (70 ms at
20,000 kept rows when a row was a message), so a high-rate service keeps none.

A message that can never be published would block every message behind it, across restarts:
one over the server's max_payload (headers and body together: the server would close the
connection; nats-py checks the body alone, so `_send` checks both first), a subject that is
not one (empty, or with whitespace, which would break the protocol line), text that cannot
be encoded. Such a message is dead-lettered instead
(`PERMANENT`): a record on `gpufleet.v1.dlq.<service>` (the format of `deadletter.py`) names
its subject, type, id, size and why, but not its body, which may hold secrets (a job's
environment); its document is then done once the record is acknowledged, like any other
message, and the messages behind it go out. Everything else (no responders, a missing or an
error ack, a lost connection, a stream that refuses the message for now) is retried as before.

A message that carries a secret (the scheduler's StartWorker with a job's environment) is
stored sealed with the service's key (`Transaction.emit(sealed=True)`, gpufleet_store.secrets)
and opened here, just before it is published: the outbox never holds it in clear. A sealed
message the store's key cannot open stops the relay (logged, retried), like a lost server:
it is a configuration error (GPUFLEET_SECRET_KEY changed), not a message to drop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from faststream.nats import NatsBroker
from gpufleet_contracts import Envelope, subjects
from gpufleet_store import Store, now_ms, utcnow
from gpufleet_store.store import OUTBOX, outbox_traced
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from .deadletter import dead_letter_bytes
from .outbox_wire import EXPECTED_STREAM, ack_error, send, stream_of
from .tracing import add_headers

log = logging.getLogger("gpufleet.outbox")

ROUND_DOCS = 500
ROUND_MESSAGES = 5_000
ACK_TIMEOUT_S = 5.0
FRESH_MAX_DOCS = 2 * ROUND_DOCS  # committed documents held for publishing from memory
# A round of 5,000 publishes holds the event loop ~350 ms without this: the service's next
# transaction, waiting on a reply from the database, would wait for the whole round.
YIELD_EVERY = 200
# What publishing a message again cannot change: it is dead-lettered, not retried.
PERMANENT = (
    nats_errors.MaxPayloadError,
    nats_errors.BadSubjectError,
    nats_errors.BadHeaderError,
    UnicodeEncodeError,
)


class OutboxPublishError(RuntimeError):
    """A round's documents were not all acknowledged; the rest is sent again later."""


@dataclass
class _Doc:
    """One outbox document in flight: its acks still awaited, and the first error."""

    id: Any
    count: int
    unacked: int = 0
    error: str | None = None
    dead: int = 0  # messages dead-lettered instead of published


class OutboxRelay:
    def __init__(
        self,
        store: Store,
        broker: NatsBroker,
        source: str,
        poll_s: float = 1.0,
        keep: timedelta = timedelta(hours=1),
    ) -> None:
        self.store = store
        self.broker = broker
        self.source = source
        # Dead letters go to gpufleet.v1.dlq.<service>; the source is "gpufleet/<service>".
        self.service = source.rsplit("/", 1)[-1]
        self.dead_letter_subject = subjects.dead_letter(self.service)
        self.poll_s = poll_s
        self.keep = keep
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.outbox_written = self._committed
        self._lock = asyncio.Lock()  # one round at a time
        # Documents this process committed, in commit order, not yet published. They are
        # published from here once the store has nothing older (`_clean`); the store is read
        # at start, after any failure, and every `poll_s` (for what other processes left).
        self._fresh: collections.deque[dict[str, Any]] = collections.deque()
        self._clean = False
        self._last_read = float("-inf")
        self.store_reads = 0  # how often the outbox was read back (tests, diagnostics)
        self.dead_lettered = 0  # messages that could never be published (tests, diagnostics)
        # The ack inbox: one wildcard subscription per connection; `_waiting` maps the reply
        # subject of each message of the current round to its document.
        self._nc: Client | None = None
        self._sub: Subscription | None = None
        self._inbox = ""
        self._next_token = 0
        self._waiting: dict[str, _Doc] = {}
        self._all_acked = asyncio.Event()

    def _committed(self, docs: list[dict[str, Any]]) -> None:
        self._fresh.extend(docs)
        if len(self._fresh) > FRESH_MAX_DOCS:  # not draining (not started, or stuck): the
            self._fresh.clear()  # store has them all, memory need not
            self._clean = False
        self._wake.set()

    async def drain(self) -> int:
        """Publish every unpublished message, the store's included; returns how many."""
        return await self._drain(read_store=True)

    async def _drain(self, read_store: bool) -> int:
        sent = 0
        async with self._lock:
            if read_store:
                self._clean = False
            try:
                while True:
                    docs = await self._next_round()
                    if not docs:
                        return sent
                    sent += await self._publish(docs)
            except BaseException:
                # What was not acknowledged is in the store: it goes out from there, in order.
                self._clean = False
                self._fresh.clear()
                raise

    async def _next_round(self) -> list[dict[str, Any]]:
        """The next documents to publish: committed ones from memory while the store holds
        nothing older, else the oldest unpublished ones of the store."""
        if self._clean:
            docs: list[dict[str, Any]] = []
            messages = 0
            while self._fresh and len(docs) < ROUND_DOCS and messages < ROUND_MESSAGES:
                doc = self._fresh.popleft()
                docs.append(doc)
                messages += doc.get("count", 1)
            return docs
        docs, full = await self._oldest()
        if docs:  # those of memory among them go out now; memory keeps only later ones
            ids = {d["_id"] for d in docs}
            self._fresh = collections.deque(d for d in self._fresh if d["_id"] not in ids)
        if not full:  # the store held nothing more at the time of the read
            self._clean = True
            if not docs:
                return await self._next_round()
        return docs

    async def _oldest(self) -> tuple[list[dict[str, Any]], bool]:
        """The oldest unpublished documents of the store, and whether the round is full
        (more may be waiting)."""
        self.store_reads += 1
        self._last_read = asyncio.get_running_loop().time()
        docs: list[dict[str, Any]] = []
        messages = 0
        cursor = (
            self.store.db[OUTBOX]
            .find({"published": False})
            .sort([("created_at", 1), ("seq", 1)])
            .limit(ROUND_DOCS)
        )
        async with cursor:
            async for doc in cursor:
                docs.append(doc)
                messages += doc.get("count", 1)
                if messages >= ROUND_MESSAGES:
                    return docs, True
        return docs, len(docs) >= ROUND_DOCS

    async def _publish(self, docs: list[dict[str, Any]]) -> int:
        """Publish one round; mark its acknowledged prefix; raise if it is not all of it."""
        nc = await self._connection()
        flights: list[_Doc] = []
        # (document, subject, payload, reply, headers) of each message, in order
        sends: list[tuple[_Doc, str, bytes, str, dict[str, str]]] = []
        self._all_acked.clear()
        try:
            # Every reply subject is registered before the first publish, so `_all_acked` is set
            # by the round's last ack, not at a moment when the acks have caught up with sends.
            for doc in docs:
                flight = _Doc(doc["_id"], 0)
                flights.append(flight)
                for msg_id, subject, type_, payload, trace in outbox_traced(doc, self.store.box):
                    env = Envelope(type=type_, source=self.source, subject=subject, id=msg_id)
                    headers = env.headers()
                    if trace:  # the job's trace, as it was when emitted (tracing.py)
                        add_headers(headers, trace)
                    flight.count += 1
                    reply = ""
                    if stream := stream_of(subject):
                        headers[EXPECTED_STREAM] = stream  # as js.publish adds
                        reply = f"{self._inbox}{self._next_token}"
                        self._waiting[reply] = flight
                        self._next_token += 1
                        flight.unacked += 1
                    sends.append((flight, subject, payload, reply, headers))
            dead: list[tuple[_Doc, bytes, str]] = []  # document, dead-letter record, its id
            for n, (flight, subject, payload, reply, headers) in enumerate(sends, 1):
                try:
                    await send(nc, subject, payload, reply, headers)
                except PERMANENT as exc:
                    if reply:
                        del self._waiting[reply]
                        flight.unacked -= 1
                    dead.append(
                        self._dead_letter_record(nc, flight, subject, payload, headers, exc)
                    )
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # nc.publish only buffers: let others run
            for flight, record, record_id in dead:
                await self._send_dead_letter(nc, flight, record, record_id)
            if self._waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._all_acked.wait(), ACK_TIMEOUT_S)
        finally:
            self._waiting.clear()  # later acks of this round are ignored
        done: list[_Doc] = []
        for flight in flights:
            if flight.unacked or flight.error:
                break
            done.append(flight)
        await self._mark([f.id for f in done])
        self.dead_lettered += sum(f.dead for f in done)
        if len(done) < len(flights):
            failed = flights[len(done)]
            reason = failed.error or f"{failed.unacked} acks missing after {ACK_TIMEOUT_S} s"
            raise OutboxPublishError(f"outbox document {failed.id}: {reason}")
        return sum(f.count - f.dead for f in done)

    def _dead_letter_record(
        self,
        nc: Client,
        flight: _Doc,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        exc: Exception,
    ) -> tuple[_Doc, bytes, str]:
        """The dead-letter record of a message that can never be published: what it was
        and why, without its body."""
        flight.dead += 1
        msg_id, type_ = headers.get("ce-id", ""), headers.get("ce-type", "")
        reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "outbox message %s (%s on %s, %d bytes) can never be published, dead-lettered: %s",
            msg_id,
            type_,
            subject,
            len(payload),
            reason,
        )
        detail = {
            "error": reason,
            "id": msg_id,
            "type": type_,
            "size": len(payload),
            "max_payload": nc.max_payload,
            "payload": "left out: it may hold secrets",
        }
        record = dead_letter_bytes(self.service, subject, b"", headers, "unpublishable", [detail])
        return flight, record, f"unpublishable:{msg_id}"

    async def _send_dead_letter(
        self, nc: Client, flight: _Doc, record: bytes, record_id: str
    ) -> None:
        """Publish a dead-letter record; its ack counts for the message's document, so the
        document is done only once the record is stored. Its id makes a re-sent one (after a
        crash, or a failed round) a duplicate that JetStream drops."""
        subject = self.dead_letter_subject
        headers = {"Nats-Msg-Id": record_id}
        reply = ""
        if stream := stream_of(subject):
            headers[EXPECTED_STREAM] = stream
            reply = f"{self._inbox}{self._next_token}"
            self._next_token += 1
            self._waiting[reply] = flight
            flight.unacked += 1
            self._all_acked.clear()  # set again by this record's ack, or a later one
        await send(nc, subject, record, reply, headers)

    async def _mark(self, ids: list[Any]) -> None:
        if not ids:
            return
        coll = self.store.db[OUTBOX]
        if self.keep:
            await coll.update_many(
                {"_id": {"$in": ids}}, {"$set": {"published": True, "published_ms": now_ms()}}
            )
        else:
            await coll.delete_many({"_id": {"$in": ids}})

    async def _connection(self) -> Client:
        """The broker's connection, with this relay's ack inbox subscribed on it."""
        nc = await self.broker.connect()
        if nc is not self._nc:
            self._inbox = nc.new_inbox() + "."
            self._sub = await nc.subscribe(self._inbox + "*", cb=self._on_ack)
            self._nc = nc
        return nc

    async def _on_ack(self, msg: Msg) -> None:
        flight = self._waiting.pop(msg.subject, None)
        if flight is None:
            return  # an ack of a round that gave up waiting
        flight.unacked -= 1
        error = ack_error(msg)
        if error and not flight.error:
            flight.error = error
        if not self._waiting:
            self._all_acked.set()

    async def _run(self) -> None:
        last_purge = utcnow()
        while True:
            try:
                stale = asyncio.get_running_loop().time() - self._last_read >= self.poll_s
                await self._drain(read_store=stale)
                if self.keep and utcnow() - last_purge > timedelta(minutes=5):
                    await self.store.db[OUTBOX].delete_many(
                        {
                            "published": True,
                            "published_ms": {
                                "$lt": now_ms() - int(self.keep.total_seconds() * 1000)
                            },
                        }
                    )
                    last_purge = utcnow()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox relay failed; retrying")
                await asyncio.sleep(1.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"outbox-{self.source}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # Python 3.11's asyncio.wait_for loses a cancellation that comes as the event it
            # waits for is set (fixed in 3.12): the relay then ran on and stop() waited for
            # ever (a service stopped just after a commit). Cancel until it has ended.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._sub is not None and self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        self._nc = self._sub = None
