"""Accounts' attached third-party keys (R-JOB-7), sealed at rest with the scheduler's key.

Collection `keys`, one document per account and type:
`{_id: "<account>/<type>", account, type, fields: [names], sealed, fingerprint, created_ms,
updated_ms}`. `sealed` is a Fernet token (GPUFLEET_SECRET_KEY, the key that seals jobs' env
values) of `{account, type, values}`: no value is ever stored in clear, and a token copied
into another account's document does not open there (`open_keys` checks both).

Why the scheduler: it already holds the key that seals job secrets, and it is where the
values are used, at placement, into the worker's sealed StartWorker; so the values never
travel between services. Every request acts for the account of its subject (R-TEN-2): an
account reaches only its own documents, and a type it has not attached is `not_found`,
whether or not another account has one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection

from gpufleet_contracts.errors import Refused
from gpufleet_contracts.keys import AttachKey
from gpufleet_store import Doc, SecretBox, SecretError, Store, Transaction, from_ms, now_ms
from pymongo import ASCENDING, IndexModel

log = logging.getLogger("gpufleet.scheduler")

INDEXES = {"keys": [IndexModel([("account", ASCENDING), ("type", ASCENDING)])]}
Opened = dict[str, dict[str, dict[str, str]]]  # account -> type -> field -> value


def key_id(account: str, key_type: str) -> str:
    return f"{account}/{key_type}"


def view(doc: Doc) -> Doc:
    """A key as its account sees it: never a value."""
    created, updated = from_ms(doc.get("created_ms")), from_ms(doc.get("updated_ms"))
    return {
        "type": doc["type"],
        "fields": list(doc.get("fields") or []),
        "fingerprint": doc.get("fingerprint") or "",
        "created_at": None if created is None else created.isoformat(),
        "updated_at": None if updated is None else updated.isoformat(),
    }


def _not_found(key_type: str) -> Refused:
    return Refused.of_field(
        "not_found",
        f"no {key_type} key attached",
        field="type",
        rule="R-TEN-2",
        says=f"your account has no {key_type} key attached",
        valid="a type `gpufleet key list` shows",
    )


def open_key(doc: Doc, box: SecretBox) -> dict[str, str]:
    """A stored key's values (SecretError: this key cannot open it, or it is not this
    document's: sealed for another account or type)."""
    data = box.open_json(str(doc.get("sealed") or ""))
    if not isinstance(data, dict) or (data.get("account"), data.get("type")) != (
        doc.get("account"),
        doc.get("type"),
    ):
        raise SecretError("a stored key does not belong to its document")
    values = data.get("values")
    if not isinstance(values, dict):
        raise SecretError("a stored key has no values")
    return {str(k): str(v) for k, v in values.items()}


async def open_keys(store: Store, box: SecretBox, accounts: Collection[str]) -> Opened:
    """The opened keys of these accounts; a key that does not open is left out (logged by
    type, never by value): a job that needs it fails at placement, saying so."""
    out: Opened = {a: {} for a in accounts}
    if not accounts:
        return out
    async for doc in store.db.keys.find({"account": {"$in": sorted(set(accounts))}}):
        try:
            out[doc["account"]][doc["type"]] = open_key(doc, box)
        except SecretError as exc:
            log.error("key %s of account %s: %s", doc["type"], doc["account"], exc)
    return out


class KeyStore:
    def __init__(self, store: Store, box: SecretBox) -> None:
        self.store = store
        self.db = store.db
        self.box = box

    async def attach(self, account: str, body: AttachKey) -> Doc:
        """Attach or replace `account`'s key of `body.type`."""
        values = dict(sorted(body.secret.items()))
        payload = {"account": account, "type": body.type, "values": values}
        canonical = json.dumps({"type": body.type, "values": values}, sort_keys=True)
        now = now_ms()
        kid = key_id(account, body.type)
        fields = {
            "account": account,
            "type": body.type,
            "fields": list(values),
            "sealed": self.box.seal_json(payload),
            "fingerprint": self.box.fingerprint(canonical.encode()),
            "updated_ms": now,
        }

        async def write(tx: Transaction) -> Doc:
            s = tx.session
            old = await self.db.keys.find_one({"_id": kid}, {"created_ms": 1}, session=s)
            doc = {"_id": kid, **fields, "created_ms": (old or {}).get("created_ms") or now}
            await self.db.keys.replace_one({"_id": kid}, doc, upsert=True, session=s)
            return doc

        doc = await self.store.transaction(write)
        log.info("account %s attached a %s key (fields %s)", account, body.type, list(values))
        return view(doc)

    async def list(self, account: str) -> list[Doc]:
        docs = await self.db.keys.find({"account": account}).sort("type", ASCENDING).to_list(None)
        return [view(d) for d in docs]

    async def remove(self, account: str, key_type: str) -> Doc:
        kid = key_id(account, key_type)

        async def delete(tx: Transaction) -> Doc | None:
            doc: Doc | None = await self.db.keys.find_one({"_id": kid}, session=tx.session)
            if doc is not None:
                await self.db.keys.delete_one({"_id": kid}, session=tx.session)
            return doc

        doc = await self.store.transaction(delete)
        if doc is None:
            raise _not_found(key_type)
        log.info("account %s removed its %s key", account, key_type)
        return view(doc)

    async def types_of(self, account: str) -> set[str]:
        """The key types `account` has attached."""
        return {d["type"] async for d in self.db.keys.find({"account": account}, {"type": 1})}
