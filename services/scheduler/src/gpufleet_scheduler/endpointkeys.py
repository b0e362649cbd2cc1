"""The API keys of accounts' endpoints (R-JOB-6, gpufleet_contracts.serving), and a node's
question whether a presented key opens an endpoint it serves.

Collection `endpoint_keys`, one document per key: `{_id: <key_id>, job_id, account (the
job's owner), name, digest, live, created_ms, revoked_ms}`. `digest` is the SHA-256 of the key's
secret (`serving.key_digest`): the secret is made here, answered once (EndpointKeyCreated)
and kept nowhere, neither stored, nor logged, nor in an event. 256 random bits need no
slow hash nor a seal: the digest opens nothing.

An account reaches the keys of the endpoint jobs it may see (its own, or created by it in
another's project: tenancy.py); another account's job, or a key of another job, answers
"not found" as a job that does not exist. A node asks on its own subject (only that node may
publish it) and is answered only for a job one of whose workers it holds now; else "not
found", as for a job that does not exist.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from datetime import UTC, datetime

from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import JobState, JobType
from gpufleet_contracts.serving import (
    KEY_ID_CHARS,
    KEY_PREFIX,
    KEYS_PER_ENDPOINT,
    CreateEndpointKey,
    EndpointKeyCreated,
    EndpointKeyList,
    EndpointKeyVerdict,
    EndpointKeyView,
    ListEndpointKeys,
    RevokeEndpointKey,
    VerifyEndpointKey,
    key_digest,
)
from gpufleet_store import Doc, from_ms, now_ms
from pymongo import ASCENDING, IndexModel

from .serving import SERVES
from .state import State

log = logging.getLogger("gpufleet.scheduler.endpointkeys")

INDEXES = {"endpoint_keys": [IndexModel([("job_id", ASCENDING), ("created_ms", ASCENDING)])]}
# Compared against when a key id is unknown, so that an unknown id costs what a known one does.
NO_DIGEST = "0" * 64


def new_key() -> tuple[str, str, str]:
    """(key_id, secret, the key as a caller sends it: `gfk_<key_id>_<secret>`)."""
    key_id = secrets.token_hex(KEY_ID_CHARS // 2)
    secret = secrets.token_urlsafe(32)  # 43 characters of url-safe base64
    return key_id, secret, f"{KEY_PREFIX}{key_id}_{secret}"


def view(doc: Doc) -> EndpointKeyView:
    """A key as its account sees it: never its digest."""
    return EndpointKeyView(
        key_id=doc["_id"],
        job_id=doc["job_id"],
        name=doc.get("name"),
        created_at=datetime.fromtimestamp(int(doc["created_ms"]) / 1000, UTC),
        revoked_at=from_ms(doc.get("revoked_ms")),
    )


def verdict(doc: Doc | None, job_id: str, digest: str) -> EndpointKeyVerdict:
    """`open`: a live key of `job_id` with this digest; `elsewhere`: a live key of another
    job; `unknown`: no such key, another secret, or revoked. Compared in constant time."""
    matches = hmac.compare_digest(str((doc or {}).get("digest") or NO_DIGEST), digest)
    if doc is None or not matches or not doc.get("live"):
        return EndpointKeyVerdict(verdict="unknown")
    return EndpointKeyVerdict(verdict="open" if doc["job_id"] == job_id else "elsewhere")


def _not_endpoint(job_id: str) -> Refused:
    return Refused.of_field(
        "invalid",
        f"job {job_id} is not an endpoint: it has no keys",
        field="job_id",
        rule="R-JOB-6",
        says=f"job {job_id} is not an endpoint",
        valid="the id of one of your endpoint jobs (type: endpoint)",
    )


def _too_many(job_id: str) -> Refused:
    return Refused.of_field(
        "conflict",
        f"endpoint {job_id} has {KEYS_PER_ENDPOINT} live keys, the most it may have",
        field="job_id",
        rule="R-JOB-6",
        says=f"at most {KEYS_PER_ENDPOINT} live keys per endpoint",
        valid="revoke one first (gpufleet endpoint key revoke)",
    )


class EndpointKeys:
    def __init__(self, state: State) -> None:
        self.state = state
        self.keys = state.db.endpoint_keys

    async def _endpoint(self, job_id: str, account: str) -> Doc:
        """The endpoint job `account` may see (NotFound: none; Refused: not an endpoint)."""
        job = await self.state.find_job(job_id, account)
        if self.state.request(job).type is not JobType.endpoint:
            raise _not_endpoint(job_id)
        return job

    async def create(self, body: CreateEndpointKey, account: str) -> EndpointKeyCreated:
        """A new key of one of `account`'s endpoints that have not ended. The limit holds
        under concurrent creations: a key that finds itself past it after its insert goes."""
        job = await self._endpoint(body.job_id, account)
        if JobState(job["state"]).terminal:
            raise Refused("conflict", f"endpoint {body.job_id} has ended: its URL is closed")
        live = {"job_id": body.job_id, "live": True}
        if await self.keys.count_documents(live) >= KEYS_PER_ENDPOINT:
            raise _too_many(body.job_id)
        key_id, secret, key = new_key()
        doc: Doc = {
            "_id": key_id,
            "job_id": body.job_id,
            "account": job["owner"],
            "name": body.name,
            "digest": key_digest(secret),
            "live": True,
            "created_ms": now_ms(self.state.clock()),
            "revoked_ms": None,
        }
        await self.keys.insert_one(doc)
        if await self.keys.count_documents(live) > KEYS_PER_ENDPOINT:
            await self.keys.delete_one({"_id": key_id})
            raise _too_many(body.job_id)
        log.info("account %s created key %s of endpoint %s", account, key_id, body.job_id)
        return EndpointKeyCreated(view=view(doc), key=key)

    async def list(self, body: ListEndpointKeys, account: str) -> EndpointKeyList:
        """The endpoint's keys, oldest first, revoked ones too (never a secret nor digest)."""
        await self._endpoint(body.job_id, account)
        docs = self.keys.find({"job_id": body.job_id}, {"digest": 0}).sort("created_ms", 1)
        return EndpointKeyList(keys=[view(d) async for d in docs])

    async def revoke(self, body: RevokeEndpointKey, account: str) -> EndpointKeyView:
        """Revoke a key of the endpoint; a revoked key answers as it is (idempotent)."""
        await self._endpoint(body.job_id, account)
        mine = {"_id": body.key_id, "job_id": body.job_id}
        done = await self.keys.update_one(
            {**mine, "live": True},
            {"$set": {"live": False, "revoked_ms": now_ms(self.state.clock())}},
        )
        if done.modified_count:
            log.info("account %s revoked key %s of endpoint %s", account, body.key_id, body.job_id)
        doc = await self.keys.find_one(mine)
        if doc is None:
            raise NotFound(f"endpoint {body.job_id} has no key {body.key_id}")
        return view(doc)

    async def verify(self, body: VerifyEndpointKey, node: str) -> EndpointKeyVerdict:
        """Whether the key opens endpoint `body.job_id`, asked by `node`, which must hold
        one of its workers now."""
        job = await self.state.db.jobs.find_one({"_id": body.job_id}, {"workers": 1})
        workers = (job or {}).get("workers") or []
        if not any(w.get("minion_id") == node and w.get("state") in SERVES for w in workers):
            raise NotFound(f"no worker of job {body.job_id} on this node")
        doc = await self.keys.find_one({"_id": body.key_id})
        return verdict(doc, body.job_id, body.digest)
