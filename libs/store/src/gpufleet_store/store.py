from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic_settings import BaseSettings, SettingsConfigDict
from pymongo import ASCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase

T = TypeVar("T")
Doc = dict[str, Any]
IndexSpec = Mapping[str, Sequence[IndexModel]]

OUTBOX = "outbox"


def utcnow() -> datetime:
    return datetime.now(UTC)


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


@dataclass
class Transaction:
    """What a transaction body sees: the session for its writes and `emit` for its events."""

    session: AsyncClientSession
    outbox: list[Doc] = field(default_factory=list)

    def emit(self, subject: str, type_: str, payload: bytes, msg_id: str | None = None) -> str:
        """Queue a message for the outbox; it is written with the transaction's other writes."""
        msg_id = msg_id or uuid.uuid4().hex
        self.outbox.append(
            {
                "_id": msg_id,
                "subject": subject,
                "type": type_,
                "payload": payload,
                "created_at": utcnow(),
                "published": False,
            }
        )
        return msg_id


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

    def __init__(self, client: AsyncMongoClient[Doc], db: AsyncDatabase[Doc]) -> None:
        self.client = client
        self.db = db
        self.outbox_written: Callable[[], None] = lambda: None

    @classmethod
    def connect(cls, service: str, settings: StoreSettings | None = None) -> Store:
        settings = settings or StoreSettings()
        client: AsyncMongoClient[Doc] = AsyncMongoClient(
            settings.mongo_url,
            tz_aware=True,
            uuidRepresentation="standard",
            serverSelectionTimeoutMS=10_000,
        )
        return cls(client, client[f"{settings.db_prefix}_{service.replace('-', '_')}"])

    async def ensure_indexes(self, specs: IndexSpec) -> None:
        """Create the collections and indexes a service owns (idempotent, at start-up)."""
        wanted = {OUTBOX: [IndexModel([("published", ASCENDING), ("created_at", ASCENDING)])]}
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
        """
        async with _tx_lock(self.db.name):
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

    async def _transaction(self, body: Callable[[Transaction], Awaitable[T]]) -> T:
        async with self.client.start_session() as session:

            async def run(s: AsyncClientSession) -> T:
                tx = Transaction(session=s)
                result = await body(tx)
                if tx.outbox:
                    await self.db[OUTBOX].insert_many(tx.outbox, session=s)
                return result

            result = await session.with_transaction(run)
        self.outbox_written()
        return result

    async def close(self) -> None:
        await self.client.close()
