"""The leader's memory: taken with the lease, rebuilt from a checkpoint and what changed
after it, kept current with what other instances wrote, written as checkpoints.

A leader that starts must know every open job and node; reading them all is slow on
nx-27017, so it loads the latest checkpoint and the documents changed after its revision
(checkpoint.py). Memory stays valid while the lease's epoch is ours.
"""

from __future__ import annotations

import asyncio
import logging

from gpufleet_store import Doc

from . import checkpoint
from .fleet import node_doc, node_view
from .heap import collector_paused
from .state import OPEN_STATES, State

log = logging.getLogger("gpufleet.scheduler")

CHECKPOINT_AFTER = 10_000  # documents changed at once that call for a checkpoint now


class Memory:
    def __init__(self, state: State) -> None:
        self.state = state
        self.first_pass = False  # the next pass is the first since loading (logged)
        self._loaded_epoch: int | None = None
        self._checkpointing: asyncio.Task[None] | None = None

    async def lead(self) -> bool:
        """Take or renew the lease; (re)build memory when newly leading."""
        st = self.state
        if st.loaded and st.lease.fresh():
            return True  # renewed recently; every placement is fenced anyway
        held = await st.lease.acquire()
        # Memory stays valid while the epoch is ours: a lease that lapsed during a long
        # pass and was renewed by us (same epoch) means no other leader came between.
        if held and not (st.loaded and st.lease.epoch == self._loaded_epoch):
            await self.load()
            self._loaded_epoch = st.lease.epoch
        if not held and st.loaded:
            st.forget()
        return held

    async def load(self) -> None:
        """Rebuild the fleet and the open jobs (start, new leader, lost race): from the
        latest checkpoint and what changed after it, or from every document if none.

        The cyclic garbage collector is paused meanwhile and what was loaded is frozen
        after (heap.py): building ~10^6 containers otherwise triggers a collection every
        700 allocations, full ones walking everything loaded so far (the checkpoint's decode
        alone took 3.8 s instead of 1.6 s at 100,000 jobs)."""
        with collector_paused():
            await self._load()
            # Frozen before the collector runs again: else its next young collection walks
            # everything built meanwhile (never collected, all of it "young").
            self.state.heap.settle()

    async def _load(self) -> None:
        st, db = self.state, self.state.db
        t0 = asyncio.get_running_loop().time()
        cp = await checkpoint.read(db)
        rev = await checkpoint.current_rev(db)  # before the reads (checkpoint.py)
        st.requests = {}
        if cp is None:
            nodes = await db.nodes.find({}).to_list(None)
            jobs = await db.jobs.find({"state": {"$in": OPEN_STATES}}).to_list(None)
            st.jobs = {j["_id"]: j for j in jobs}
            read, source = len(nodes) + len(jobs), "documents"
        else:
            st.checkpointed_rev = cp.rev
            st.jobs = {j["_id"]: j for j in cp.jobs}
            later = {"rev": {"$gt": cp.rev}}
            nodes = cp.nodes + await db.nodes.find(later).to_list(None)
            changed = await db.jobs.find(later).to_list(None)
            for j in changed:
                st.cache(j)
            read, source = len(changed), f"checkpoint at rev {cp.rev}"
        st.unplaced = {}
        for job in st.jobs.values():
            st.track(job)
        st.explained = {}  # reasons loaded are explained again, a budget per pass
        nodes_by_id: dict[str, Doc] = {n["_id"]: n for n in nodes}  # a later one replaces
        st.fleet.load(list(nodes_by_id.values()), st.claims())
        st.rev = rev
        st.loaded = True
        self.first_pass = True
        st.loaded_from = source
        st.loaded_at = asyncio.get_running_loop().time()
        log.info(
            "loaded %d nodes, %d open jobs from %s and %d documents in %.2f s (rev %d)",
            len(nodes_by_id),
            len(st.jobs),
            source,
            read,
            st.loaded_at - t0,
            rev,
        )
        if read > CHECKPOINT_AFTER:  # the next start should not read them again
            self.checkpoint_soon()

    async def catch_up(self) -> int:
        """Read what changed after `rev` (other instances' writes; a lost note)."""
        st, db = self.state, self.state.db
        rev = await checkpoint.current_rev(db)
        nodes = await db.nodes.find({"rev": {"$gt": st.rev}}).to_list(None)
        jobs = await db.jobs.find({"rev": {"$gt": st.rev}}).to_list(None)
        for n in nodes:
            st.fleet.upsert(node_view(n))
        for j in jobs:
            mine = st.jobs.get(j["_id"])
            if mine is None or int(mine.get("version", 0)) <= int(j.get("version", 0)):
                st.cache(j)
        if jobs:  # claims follow the jobs
            st.fleet.set_claims(st.claims())
        st.rev = max(st.rev, rev)
        st.loaded_at = asyncio.get_running_loop().time()
        return len(nodes) + len(jobs)

    def stale(self) -> bool:
        """Time to read what others changed (settings.resync_s bounds the staleness)."""
        st = self.state
        return asyncio.get_running_loop().time() - st.loaded_at > st.settings.resync_s

    async def sync(self, job_ids: list[str], node_ids: list[str]) -> None:
        """Another instance changed these: read them again (leader only)."""
        st, db = self.state, self.state.db
        if not st.loaded:
            return
        async with st.lock:
            for j in await db.jobs.find({"_id": {"$in": job_ids}}).to_list(None):
                st.cache(j)
            if node_ids:
                claims = await db.claims.find({"node_id": {"$in": node_ids}}).to_list(None)
                st.fleet.reset_claims(node_ids, claims)
                for n in await db.nodes.find({"_id": {"$in": node_ids}}).to_list(None):
                    st.fleet.upsert(node_view(n))

    # --- checkpoints ------------------------------------------------------------------

    def checkpoint_soon(self) -> None:
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.create_task(self.write_checkpoint())

    async def write_checkpoint(self) -> None:
        """Write memory as a checkpoint (leader only; skipped when nothing changed)."""
        st = self.state
        if not st.loaded or st.rev == st.checkpointed_rev:
            return
        rev, loaded_at = st.rev, st.loaded_at
        t0 = asyncio.get_running_loop().time()
        nodes = [node_doc(v) for v in st.fleet.nodes()]
        jobs = list(st.jobs.values())  # as of `rev`; what changes later has a later rev
        pages = await checkpoint.encode(rev, nodes, jobs)
        if not st.loaded or st.loaded_at != loaded_at:
            return  # memory was found stale and rebuilt meanwhile: what was taken may be too
        await checkpoint.write(st.db, rev, pages)
        st.checkpointed_rev = rev
        log.info(
            "checkpoint at rev %d: %d jobs, %d nodes, %d bytes in %.2f s",
            rev,
            len(st.jobs),
            len(nodes),
            sum(map(len, pages)),
            asyncio.get_running_loop().time() - t0,
        )
