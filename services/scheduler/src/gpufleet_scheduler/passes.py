"""Placement passes: asked for by anyone, run one at a time, each taking the submissions that
came meanwhile (up to ADMIT_MAX) into the pass that stores them (commit.py).

The decisions are queue.py's (oldest first, backfill, holds for starving workers; pure);
here they are applied to memory, committed, and their reasons to wait stored; what may
burst is told by demand.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from gpufleet_store import Doc, Transaction, now_ms
from gpufleet_telemetry.instruments import METRICS
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from .commit import Placed, Slots, commit
from .demand import DemandTeller
from .leadership import Deposed
from .memory import CHECKPOINT_AFTER, Memory
from .placement import NoPlacement, Placement
from .queue import PassResult, plan
from .state import StaleJob, State
from .submissions import Submission, store_unplaced

log = logging.getLogger("gpufleet.scheduler")

ADMIT_MAX = 4096  # submissions taken into one placement pass
COMMIT_CHUNK = 500  # jobs per placement transaction


class Passes:
    def __init__(self, state: State, memory: Memory) -> None:
        self.state = state
        self.memory = memory
        self.holds: dict[str, str] = {}
        self.last_pass: PassResult | None = None
        self.submits: list[Submission] = []  # waiting for the next pass (admission.py)
        self.demand = DemandTeller(state)  # what the provisioner may burst for
        self._waiters: list[asyncio.Future[int]] = []
        self._passer: asyncio.Task[None] | None = None
        self._passes = 0
        self.placed_by_region: Counter[str] = Counter()  # workers placed, by node's region
        self._explain_more = False  # shapes wait for a first explanation: pass again soon
        self.closed = False  # stopping: no pass runs any more (close())
        self._late: set[asyncio.Task[None]] = set()  # submissions stored while closing

    # --- asking for passes ------------------------------------------------------------

    def request_pass(self) -> asyncio.Future[int]:
        """Ask for a placement pass; passes asked for meanwhile are run as one."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_result(0)
            return fut
        self._waiters.append(fut)
        self.kick()
        return fut

    def add(self, sub: Submission) -> None:
        """A submission for the next pass (stored unplaced once stopping)."""
        if self.closed:
            task = asyncio.create_task(store_unplaced(self.state, [sub]))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return
        self.submits.append(sub)
        self.kick()

    def kick(self) -> None:
        if self.closed:
            return
        if self._passer is None or self._passer.done():
            self._passer = asyncio.create_task(self._run_passes())

    async def close(self) -> None:
        """Stopping: the pass under way ends, no other starts (nor renews the lease), the
        submissions it did not take are stored unplaced; after this the final checkpoint
        is the last word of this leader (scheduler.stop). Before, events still consumed
        while stopping asked for passes, and one took the released lease back and placed
        a job after the checkpoint (issue 15)."""
        self.closed = True
        if self._passer is not None and not self._passer.done():
            with contextlib.suppress(Exception):
                await self._passer
        left, self.submits = self.submits, []
        if left:
            await store_unplaced(self.state, left)
        for f in self._waiters:
            if not f.done():
                f.set_result(0)
        self._waiters = []
        if self._late:
            await asyncio.gather(*self._late, return_exceptions=True)
        await self.demand.stop()

    async def _run_passes(self) -> None:
        """Run passes while some are asked for or submissions wait; each pass takes every
        request and up to ADMIT_MAX submissions that came meanwhile."""
        while not self.closed and (self._waiters or self.submits or self._explain_more):
            self._explain_more = False
            waiters, self._waiters = self._waiters, []
            batch, self.submits = self.submits[:ADMIT_MAX], self.submits[ADMIT_MAX:]
            try:
                placed = await self.schedule(batch)
            except Exception as exc:  # the next event or resync tries again
                log.exception("placement pass failed")
                self._explain_more = False
                for f in waiters:
                    if not f.done():
                        f.set_exception(exc)
                continue
            finally:
                self.state.heap.settle()  # the jobs it stored live on: out of the collector's way
            for f in waiters:
                if not f.done():
                    f.set_result(placed)

    async def schedule(self, new: Sequence[Submission] = ()) -> int:
        """One pass, with `new` submissions stored in the pass's transactions. Only the
        leader places; another instance just stores `new`. Returns the workers placed."""
        st = self.state
        async with st.lock:
            try:
                if not await self.memory.lead():
                    await store_unplaced(st, list(new))
                    return 0
                if self.memory.stale():
                    await self.memory.catch_up()
                return await self._pass(new)
            except (StaleJob, DuplicateKeyError, BulkWriteError, OperationFailure) as exc:
                log.warning("placement pass lost a race (%s); reloading from the store", _race(exc))
                await store_unplaced(st, self._unstored(new))
                await self.memory.load()
                return 0
            except Deposed as exc:
                log.warning("%s; placing nothing", exc)
                st.loaded = False
                await store_unplaced(st, self._unstored(new))
                return 0
            except Exception:
                st.loaded = False  # memory may be ahead of the store: rebuild next time
                await store_unplaced(st, self._unstored(new))
                raise
            except BaseException:  # cancelled (stopping): nothing more is written
                st.loaded = False
                for sub in self._unstored(new):
                    sub.fut.cancel()
                raise

    def _unstored(self, new: Sequence[Submission]) -> list[Submission]:
        """The submissions a failed pass did not store, taken out of memory again."""
        left = [s for s in new if not s.fut.done()]
        for s in left:
            self.state.drop(s.doc["_id"])
        return left

    # --- one pass ---------------------------------------------------------------------

    async def _pass(self, new: Sequence[Submission] = ()) -> int:
        st = self.state
        now = st.clock()
        started = asyncio.get_running_loop().time()
        fresh = {s.doc["_id"]: s for s in new}
        for s in new:  # they join memory now; their transactions store them (commit.py)
            st.admit(s.doc, s.spec)  # validated once, at submission
        slots: list[Slots] = []

        def claim(p: Placement) -> None:
            s = st.fleet.claims_for(p)
            st.fleet.claim(p.node.node_id, s)
            slots.append(s)

        waiting = st.waiting()
        result = plan(
            waiting,
            st.fleet.index,
            now_ms(now),
            starve_after_ms=int(st.settings.starve_after_s * 1000),
            max_holds=st.settings.max_holds,
            explain_budget=st.settings.explain_budget,
            on_place=claim,
            explained=st.explained,
            pass_no=self._passes,
        )
        self._passes += 1
        self._explain_more = result.never_explained > 0
        self.holds = result.holds
        self.last_pass = result
        by_job: Placed = {}
        for i, (w, p) in enumerate(result.placed):
            by_job.setdefault(w.req.job_id, []).append((w, p, slots[i]))
        changed = self._reasons(result, now)  # new jobs are stored with theirs
        jobs = list(by_job) + [j for j in fresh if j not in by_job]
        for i in range(0, len(jobs), COMMIT_CHUNK):  # the relay starts on the first chunk
            chunk = jobs[i : i + COMMIT_CHUNK]
            await commit(st, {j: by_job.get(j, []) for j in chunk}, fresh, now)
        stored = [c for c in changed if c[0] not in fresh]
        explained = await self._explain(result, stored, now)
        METRICS.jobs_placed.add(len(result.placed))
        self.placed_by_region.update(p.node.region for _, p in result.placed)
        METRICS.set_queue_depth(len(waiting) - len(result.placed))
        took = asyncio.get_running_loop().time() - started
        if len(result.placed) + explained > CHECKPOINT_AFTER:
            self.memory.checkpoint_soon()  # a restart should not read all of that again
        first = self.memory.first_pass
        if took > 1.0 or first:
            log.info(
                "%s: %d placed, %d waiting, %d submitted, %.2f s",
                "first pass after loading" if first else "long pass",
                len(result.placed),
                len(waiting) - len(result.placed),
                len(new),
                took,
            )
        self.memory.first_pass = False
        return len(result.placed)

    def _reasons(self, result: PassResult, now: datetime) -> list[tuple[str, Doc]]:
        """The reasons this pass explained, made current in memory; returns the (job,
        fields) that changed and must be stored."""
        per_job: dict[str, NoPlacement] = {}
        for w in result.waiting:
            r = result.reasons.get(w.key)
            if r is not None and w.req.job_id not in per_job:
                per_job[w.req.job_id] = r
        # Jobs of one request shape share their reason object: worded once, not once a job.
        said: dict[int, tuple[str, list[dict[str, object]]]] = {}
        at = now_ms(now)
        sets: list[tuple[str, Doc]] = []
        for job_id, r in per_job.items():
            job = self.state.jobs.get(job_id)
            if job is None:
                continue
            if id(r) not in said:
                said[id(r)] = (r.explain(), r.structured())
            text, detail = said[id(r)]
            if job.get("queue_reason") == text:
                continue
            fields = {"queue_reason": text, "queue_detail": detail, "explained_ms": at}
            job.update(fields)
            sets.append((job_id, fields))
        return sets

    async def _explain(self, result: PassResult, sets: list[tuple[str, Doc]], now: datetime) -> int:
        """Store the reasons that changed (`_reasons`); tell the burstable demand when it
        changed (demand.py). Returns how many jobs' reasons were rewritten."""
        st = self.state
        if sets:

            async def write(tx: Transaction) -> int:
                rev = await st.next_rev(tx)
                updates = [UpdateOne({"_id": j}, {"$set": {**f, "rev": rev}}) for j, f in sets]
                await st.db.jobs.bulk_write(updates, ordered=False, session=tx.session)
                return rev

            st.committed(await st.store.transaction(write))
        await self.demand.after_pass(result.waiting)
        return len(sets)


def _race(exc: Exception) -> str:
    """What a lost race was, short: a bulk write's error text holds whole job documents."""
    if isinstance(exc, BulkWriteError):
        first = (exc.details.get("writeErrors") or [{}])[0]
        return f"BulkWriteError {first.get('code')}: {first.get('errmsg')}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"
