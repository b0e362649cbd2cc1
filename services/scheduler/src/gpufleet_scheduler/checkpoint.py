"""The leader's memory on disk: a compressed snapshot of the open jobs and the fleet.

Why: a leader that starts must know every open job and node. Reading 100,000 job documents
from nx-27017 took ~35 s (about 3,000 full documents a second; benchmarks/scheduler), far
from the 5 s a restart may take. So the leader writes its memory now and then as a few
large compressed pages, and a new leader reads those plus what changed after them.

What changed after: every scheduler transaction that writes a job or a node takes the next
*revision* from a counter in the same transaction (`next_rev`) and stamps it on what it
writes (`rev`). A transaction that aborts rolls its increment back, and two transactions
that both increment conflict (MongoDB) or run one after the other (nx-27017), so revisions
follow commit order. Hence, after reading the counter `C` and then the documents with
`rev > R`, memory holds every change up to `C` (it may hold later ones too: applying a
document again is harmless, newer versions win). A checkpoint taken at `rev = R` holds
everything up to R; loading it and then `rev > R` rebuilds memory exactly.

Pages are a sequence of BSON documents (`bson.encode`, C speed; datetimes survive): one with
the revision and the nodes, then one per 2,000 jobs; zlib-compressed as one stream and cut
into 8 MB binary pages: far under the 16 MB document limit, and a handful of reads. The
leader encodes a part at a time and lets its event loop run between parts (`encode`):
encoding 100,000 jobs at once held the loop for seconds, every `checkpoint_s`. (A checkpoint
of the earlier format, one document with `jobs` in it, decodes the same way.)
A new checkpoint is written under a new generation, then the head document is switched to
it in one update, then the old pages are deleted: a reader never sees half of one.
"""

from __future__ import annotations

import asyncio
import uuid
import zlib
from dataclasses import dataclass

import bson
from bson.codec_options import CodecOptions
from gpufleet_store import Doc
from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase

COLLECTION = "checkpoints"
COUNTER = "meta"
PAGE_BYTES = 8 * 1024 * 1024
HEAD = "head"
_CODEC: CodecOptions[Doc] = CodecOptions(tz_aware=True)

# What a checkpoint keeps of a job: enough to place it, explain it and rebuild claims. The
# rest (spec, history, notes) is read from the job's document when it is placed or shown.
JOB_FIELDS = (
    "_id",
    "name",
    "project",
    "owner",
    "creator",
    "state",
    "version",
    "rev",
    "queued_at",
    "queued_ms",
    "cancel_requested",
    "request_id",
    "queue_reason",
    "req",
    "workers",
    "trace",  # its W3C trace context (gpufleet_bus.tracing)
)


@dataclass(frozen=True)
class Checkpoint:
    rev: int
    nodes: list[Doc]
    jobs: list[Doc]


async def next_rev(db: AsyncDatabase[Doc], session: AsyncClientSession) -> int:
    """Inside a transaction: the revision its writes are stamped with."""
    doc = await db[COUNTER].find_one_and_update(
        {"_id": "rev"},
        {"$inc": {"n": 1}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
        session=session,
    )
    assert doc is not None
    return int(doc["n"])


async def current_rev(db: AsyncDatabase[Doc]) -> int:
    doc = await db[COUNTER].find_one({"_id": "rev"})
    return int(doc["n"]) if doc else 0


def compact(job: Doc) -> Doc:
    out = {k: job[k] for k in JOB_FIELDS if k in job}
    out["workers"] = [
        {k: v for k, v in w.items() if k != "log_tail"} for w in job.get("workers") or []
    ]
    out["partial"] = True
    return out


PART_JOBS = 2_000


async def encode(rev: int, nodes: list[Doc], jobs: list[Doc]) -> list[bytes]:
    """The pages of a checkpoint, PART_JOBS jobs at a time with the event loop running
    between parts. Each part's jobs are compacted when it is encoded: a job replaced in memory
    later does not change what was taken."""
    z = zlib.compressobj(1)
    out = [z.compress(bson.encode({"rev": rev, "nodes": nodes}))]
    for i in range(0, len(jobs), PART_JOBS):
        await asyncio.sleep(0)  # requests and passes go on meanwhile
        part = [compact(j) for j in jobs[i : i + PART_JOBS]]
        out.append(z.compress(bson.encode({"jobs": part})))
    out.append(z.flush())
    packed = b"".join(out)
    return [packed[i : i + PAGE_BYTES] for i in range(0, len(packed), PAGE_BYTES)] or [b""]


def decode(pages: list[bytes]) -> Checkpoint:
    parts = bson.decode_all(zlib.decompress(b"".join(pages)), codec_options=_CODEC)
    jobs: list[Doc] = []
    for part in parts:
        jobs += part.get("jobs", [])
    head = parts[0]
    return Checkpoint(rev=int(head["rev"]), nodes=head["nodes"], jobs=jobs)


async def write(db: AsyncDatabase[Doc], rev: int, pages: list[bytes]) -> None:
    coll = db[COLLECTION]
    gen = uuid.uuid4().hex
    await coll.insert_many(
        [{"_id": f"{gen}:{i}", "gen": gen, "n": i, "data": p} for i, p in enumerate(pages)]
    )
    old = await coll.find_one_and_update(
        {"_id": HEAD},
        {"$set": {"gen": gen, "pages": len(pages), "rev": rev}},
        upsert=True,
    )
    if old is not None and old.get("gen"):
        await coll.delete_many({"gen": old["gen"]})


async def read(db: AsyncDatabase[Doc]) -> Checkpoint | None:
    coll = db[COLLECTION]
    head = await coll.find_one({"_id": HEAD})
    if head is None:
        return None
    ids = [f"{head['gen']}:{i}" for i in range(int(head["pages"]))]
    found = {d["_id"]: bytes(d["data"]) for d in await coll.find({"_id": {"$in": ids}}).to_list()}
    if set(found) != set(ids):
        return None  # pages of a generation being replaced: load the long way
    return decode([found[i] for i in ids])
