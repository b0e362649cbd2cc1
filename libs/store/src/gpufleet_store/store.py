from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from gpufleet_contracts.clock import utcnow
from pydantic_settings import BaseSettings, SettingsConfigDict
from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase

from . import txlock
from .secrets import SecretBox, SecretError

T = TypeVar("T")
Doc = dict[str, Any]  # a MongoDB document, as every service handles one
IndexSpec = Mapping[str, Sequence[IndexModel]]

OUTBOX = "outbox"

# An outbox document holds one transaction's messages (or a chunk of them, when there are
# many): nx-27017 spends ~150 us per inserted document but far less per message packed into
# one binary field, and the relay then reads, publishes and deletes a document at a time.
#
#   {_id: uuid hex, created_at: datetime, seq: int, published: False, count: N, messages: bytes}
#
# `messages` is FORMAT (one byte, 1) then one frame per message, in emit order:
#
#   frame = >HHHI (byte lengths of id, subject, type, payload) + id + subject + type + payload
#
# id, subject and type are UTF-8; the payload is the message body as given to `emit`.
# A document with a sealed message (one that carries a secret: `emit(..., sealed=True)`) is
# FORMAT_SEALED (2) instead, whose frames add one flags byte after the lengths:
#
#   frame = >HHHIB (lengths as above, flags) + id + subject + type + payload
#
# flags bit 0: the payload is sealed (a Fernet token of the body, gpufleet_store.secrets), and
# only a reader with the service's key gets the body (`outbox_messages(doc, box)`).
# A document with a message that continues a trace (`emit(..., trace=...)`: the W3C
# `traceparent`, and `tracestate` after a line break, gpufleet_bus.tracing) is FORMAT_TRACED
# (3), whose frames add the trace's length after the flags and the trace before the payload:
#
#   frame = >HHHIBH (lengths, flags, trace length) + id + subject + type + trace + payload
# Documents sort by (created_at, seq): one transaction's chunks share created_at, and seq
# grows across the process, so transactions within one millisecond (BSON dates' precision)
# still sort in commit order.
FORMAT = 1
FORMAT_SEALED = 2
FORMAT_TRACED = 3
_FRAME = struct.Struct(">HHHI")
_FRAME_SEALED = struct.Struct(">HHHIB")
_FRAME_TRACED = struct.Struct(">HHHIBH")
SEALED = 1
CHUNK_MESSAGES = 2_000
CHUNK_BYTES = 4 * 1024 * 1024
_SEQ = itertools.count()


def now_ms(at: datetime | None = None) -> int:
    """Epoch milliseconds. Times written with `$set` and compared in queries are stored this
    way: the embedded nx-27017 stores a datetime given to `$set` as a string
    (docs/nx-27017-gaps.md), and an integer means the same on both servers."""
    return int((at or utcnow()).timestamp() * 1000)


def from_ms(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


class StoreSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")
    mongo_url: str = "mongodb://127.0.0.1:27027/?directConnection=true"
    db_prefix: str = "gpufleet"
    # Only for a database that cannot isolate concurrent transactions (nx-27017; txlock.py)
    mongo_tx_lock_dir: Path | None = None


@dataclass
class Transaction:
    """What a transaction body sees: the session for its writes and `emit` for its events.

    `outbox` lists what was emitted so far, one dict per message (`_id`, `subject`, `type`,
    `payload`, and `sealed` when the payload is); at commit they are packed into outbox
    documents (`outbox_documents`). `box` seals the messages emitted with `sealed=True`.
    """

    session: AsyncClientSession
    outbox: list[Doc] = field(default_factory=list)
    box: SecretBox | None = None

    def emit(
        self,
        subject: str,
        type_: str,
        payload: bytes,
        msg_id: str | None = None,
        *,
        sealed: bool = False,
        trace: str | None = None,
    ) -> str:
        """Queue a message for the outbox; it is written with the transaction's other writes.
        A `sealed` message (it carries a secret) is stored encrypted with the store's key;
        `trace`: the trace context its headers carry when it is published (FORMAT_TRACED)."""
        msg_id = msg_id or uuid.uuid4().hex
        msg: Doc = {"_id": msg_id, "subject": subject, "type": type_, "payload": payload}
        if trace:
            msg["trace"] = trace
        if sealed:
            if self.box is None:
                raise RuntimeError("this store has no secret key: a secret cannot be written")
            msg.update(payload=self.box.seal(payload), sealed=True)
        self.outbox.append(msg)
        return msg_id


def _frame(msg: Doc, with_flags: bool, traced: bool = False) -> bytes:
    id_, subject, type_ = (str(msg[k]).encode() for k in ("_id", "subject", "type"))
    payload = bytes(msg["payload"])
    if traced:
        flags = SEALED if msg.get("sealed") else 0
        trace = str(msg.get("trace") or "").encode()
        head = _FRAME_TRACED.pack(
            len(id_), len(subject), len(type_), len(payload), flags, len(trace)
        )
        return b"".join((head, id_, subject, type_, trace, payload))
    if with_flags:
        flags = SEALED if msg.get("sealed") else 0
        head = _FRAME_SEALED.pack(len(id_), len(subject), len(type_), len(payload), flags)
    else:
        head = _FRAME.pack(len(id_), len(subject), len(type_), len(payload))
    return b"".join((head, id_, subject, type_, payload))


def outbox_documents(messages: Sequence[Doc]) -> list[Doc]:
    """Pack a transaction's messages into outbox documents, in order (see FORMAT)."""
    docs: list[Doc] = []
    created_at = utcnow()
    frames: list[bytes] = []
    size = 0
    # Documents of a transaction with a sealed message are all FORMAT_SEALED (rare: the
    # frames of the others stay as they were).
    with_flags = any(m.get("sealed") for m in messages)
    traced = any("trace" in m for m in messages)
    fmt = FORMAT_TRACED if traced else FORMAT_SEALED if with_flags else FORMAT

    def close() -> None:
        docs.append(
            {
                "_id": uuid.uuid4().hex,
                "created_at": created_at,
                "seq": next(_SEQ),
                "published": False,
                "count": len(frames),
                "messages": bytes([fmt]) + b"".join(frames),
            }
        )

    for msg in messages:
        frame = _frame(msg, with_flags, traced)
        if frames and (len(frames) >= CHUNK_MESSAGES or size + len(frame) > CHUNK_BYTES):
            close()
            frames, size = [], 0
        frames.append(frame)
        size += len(frame)
    if frames:
        close()
    return docs


def outbox_frames(doc: Doc) -> Iterator[tuple[str, str, str, bytes, bool]]:
    """(id, subject, type, payload, sealed) of each message of an outbox document, in
    order; a sealed payload as stored (encrypted)."""
    for msg_id, subject, type_, payload, sealed, _ in _frames(doc):
        yield msg_id, subject, type_, payload, sealed


def _frames(doc: Doc) -> Iterator[tuple[str, str, str, bytes, bool, str | None]]:
    """(id, subject, type, payload, sealed, trace) of each message of an outbox document."""
    if "messages" not in doc:  # a row of the earlier one-message-per-document outbox
        yield str(doc["_id"]), doc["subject"], doc["type"], bytes(doc["payload"]), False, None
        return
    blob = memoryview(doc["messages"])
    if not blob or blob[0] not in (FORMAT, FORMAT_SEALED, FORMAT_TRACED):
        raise ValueError(f"outbox document {doc['_id']}: unknown format")
    frame = {FORMAT: _FRAME, FORMAT_SEALED: _FRAME_SEALED, FORMAT_TRACED: _FRAME_TRACED}[blob[0]]
    pos = 1
    flags = n_trace = 0
    while pos < len(blob):
        if frame is _FRAME:
            n_id, n_subject, n_type, n_payload = _FRAME.unpack_from(blob, pos)
        elif frame is _FRAME_SEALED:
            n_id, n_subject, n_type, n_payload, flags = _FRAME_SEALED.unpack_from(blob, pos)
        else:
            n_id, n_subject, n_type, n_payload, flags, n_trace = _FRAME_TRACED.unpack_from(
                blob, pos
            )
        a = pos + frame.size
        b = a + n_id
        c = b + n_subject
        d = c + n_type
        e = d + n_trace
        pos = e + n_payload
        yield (
            str(blob[a:b], "utf-8"),
            str(blob[b:c], "utf-8"),
            str(blob[c:d], "utf-8"),
            bytes(blob[e:pos]),
            bool(flags & SEALED),
            str(blob[d:e], "ascii") if n_trace else None,
        )


def outbox_messages(
    doc: Doc, box: SecretBox | None = None
) -> Iterator[tuple[str, str, str, bytes]]:
    """(id, subject, type, payload) of each message of an outbox document, in order; a
    sealed payload opened with `box` (without one, a sealed message raises SecretError)."""
    for msg_id, subject, type_, payload, _ in outbox_traced(doc, box):
        yield msg_id, subject, type_, payload


def outbox_traced(
    doc: Doc, box: SecretBox | None = None
) -> Iterator[tuple[str, str, str, bytes, str | None]]:
    """`outbox_messages` with each message's trace context (None: it continues none)."""
    for msg_id, subject, type_, payload, sealed, trace in _frames(doc):
        if sealed:
            if box is None:
                raise SecretError(f"outbox message {msg_id} is sealed and there is no key")
            payload = box.open(payload)
        yield msg_id, subject, type_, payload, trace


_TX_LOCKS: dict[tuple[int, str], asyncio.Lock] = {}


def _tx_lock(db_name: str) -> asyncio.Lock:
    """One lock per database and event loop, shared by every Store of the process."""
    key = (id(asyncio.get_running_loop()), db_name)
    lock = _TX_LOCKS.get(key)
    if lock is None:
        lock = _TX_LOCKS[key] = asyncio.Lock()
    return lock


class Store:
    """One service's database, its indexes and its transactions."""

    def __init__(
        self,
        client: AsyncMongoClient[Doc],
        db: AsyncDatabase[Doc],
        tx_lock_dir: Path | None = None,
    ) -> None:
        self.client = client
        self.db = db
        # Set: transactions also take turns with other processes' (txlock.py, nx-27017 only)
        self.tx_lock_dir = tx_lock_dir
        # Called after each commit with the outbox documents it wrote (the relay publishes
        # them from memory instead of reading them back; `gpufleet_bus.outbox`).
        self.outbox_written: Callable[[list[Doc]], None] = lambda docs: None
        # Seals the outbox messages that carry secrets (`Transaction.emit(sealed=True)`) and
        # opens them for the relay; set by a service that has secrets (the scheduler).
        self.box: SecretBox | None = None

    @classmethod
    def connect(cls, service: str, settings: StoreSettings | None = None) -> Store:
        settings = settings or StoreSettings()
        client: AsyncMongoClient[Doc] = AsyncMongoClient(
            settings.mongo_url,
            tz_aware=True,
            uuidRepresentation="standard",
            serverSelectionTimeoutMS=10_000,
        )
        db = client[f"{settings.db_prefix}_{service.replace('-', '_')}"]
        return cls(client, db, settings.mongo_tx_lock_dir)

    async def ensure_indexes(self, specs: IndexSpec) -> None:
        """Create the collections and indexes a service owns (idempotent, at start-up)."""
        # Serves the relay's `{published: false}` sorted by (created_at, seq).
        outbox = IndexModel(
            [("published", ASCENDING), ("created_at", ASCENDING), ("seq", ASCENDING)]
        )
        wanted = {OUTBOX: [outbox]}
        wanted.update({k: list(v) for k, v in specs.items()})
        existing = set(await self.db.list_collection_names())
        for name, indexes in wanted.items():
            if name not in existing:
                await self.db.create_collection(name)
            if indexes:
                await self.db[name].create_indexes(list(indexes))

    async def collections(self) -> list[str]:
        return sorted(await self.db.list_collection_names())

    async def transaction(self, body: Callable[[Transaction], Awaitable[T]]) -> T:
        """Run `body` in a multi-document transaction, then write its outbox in the same one.

        Transactions on one database run one at a time in a process: the embedded nx-27017
        cannot run two at once (docs/nx-27017-gaps.md), and a service's own transactions
        serialising costs little against MongoDB, where they would otherwise conflict and retry.
        With `tx_lock_dir` they also take turns with other processes' (txlock.py).
        """
        async with _tx_lock(self.db.name), self._across_processes():
            # A caller cancelled mid-way (a service stopping) must not abandon the transaction
            # half-way: nx-27017 can leave an interrupted one half-applied. It runs to its
            # commit or abort, then the cancellation goes on.
            task = asyncio.ensure_future(self._transaction(body))
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await task
                raise

    def _across_processes(self) -> contextlib.AbstractAsyncContextManager[None]:
        if self.tx_lock_dir is None:
            return contextlib.nullcontext()
        return txlock.held(self.tx_lock_dir, self.db.name)

    async def _transaction(self, body: Callable[[Transaction], Awaitable[T]]) -> T:
        written: list[Doc] = []

        async with self.client.start_session() as session:

            async def run(s: AsyncClientSession) -> T:
                tx = Transaction(session=s, box=self.box)
                written.clear()  # with_transaction may run the body again
                result = await body(tx)
                if tx.outbox:
                    written.extend(outbox_documents(tx.outbox))
                    await self.db[OUTBOX].insert_many(written, session=s)
                return result

            result = await session.with_transaction(run)
        if written:
            self.outbox_written(written)
        return result

    async def close(self) -> None:
        await self.client.close()
