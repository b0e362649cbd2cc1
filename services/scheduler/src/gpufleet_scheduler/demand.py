"""What the provisioner may burst for (PendingDemandChanged, R-SCHED-3): told only when it
changed, and at most once every `demand_every_s`.

Only a waiting worker whose project allows bursting (`allow_burst`) is demand: the
provisioner can do nothing for any other (scaling.plan_scale_up skips them), so a fleet
with no such job publishes nothing, however long its queue. What counts as a change is the
set of those workers (the provisioner bursts one instance per worker), not their reasons.
Before, every pass told up to 1,000 waiting workers (~260 KB) whether or not any could
burst: 1,467 events, 379 MB, in one 2,000-job run, each stored, relayed, parsed and
stored again by the provisioner, and half the database's CPU (issue 15).

A change within `demand_every_s` of the last event is told when that interval ends, from
memory as it is then (the latest demand wins; none is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from gpufleet_bus import emit
from gpufleet_contracts.jobs import Demand, PendingDemandChanged
from gpufleet_store import Transaction, from_ms

from .queue import Waiting
from .state import State

log = logging.getLogger("gpufleet.scheduler")

Key = frozenset[tuple[str, int]]


def burstable(state: State, waiting: Sequence[Waiting]) -> list[Waiting]:
    """The waiting workers the provisioner may burst for (their project allows it)."""
    out = []
    for w in waiting:
        job = state.jobs.get(w.req.job_id)
        if job is not None and state.request(job).allow_burst:
            out.append(w)
    return out


class DemandTeller:
    def __init__(self, state: State) -> None:
        self.state = state
        self._told: Key = frozenset()  # nothing to burst for until told otherwise
        self._last = -1e9  # loop time of the last event
        self._later: asyncio.Task[None] | None = None
        self.events = 0  # told so far (benchmarks, tests)

    def every_s(self) -> float:
        return self.state.settings.demand_every_s

    async def after_pass(self, waiting: Sequence[Waiting]) -> None:
        """A pass left `waiting` unplaced: tell the demand now, later, or not at all."""
        demand = burstable(self.state, waiting)
        if _key(demand) == self._told:
            return
        due = self._last + self.every_s() - asyncio.get_running_loop().time()
        if due > 0:
            if self._later is None or self._later.done():
                self._later = asyncio.create_task(self._tell_later(due))
            return
        await self._tell(demand, len(waiting))

    async def _tell_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if not self.state.loaded:  # no longer leading: the next leader tells it
            return
        waiting = self.state.waiting()
        demand = burstable(self.state, waiting)
        if _key(demand) != self._told:
            try:
                await self._tell(demand, len(waiting))
            except Exception:  # the next pass tells it again
                log.exception("pending demand not told")

    async def _tell(self, demand: list[Waiting], waiting: int) -> None:
        st = self.state
        self._last = asyncio.get_running_loop().time()
        oldest = sorted(demand, key=lambda w: w.queued_ms)[: PendingDemandChanged.MAX_DEMANDS]
        demands = [d for d in (self._demand_of(w) for w in oldest) if d]
        now = st.clock()

        async def body(tx: Transaction) -> None:
            emit(tx, PendingDemandChanged(demands=demands, at=now, waiting=waiting))

        await st.store.transaction(body)
        self._told = _key(demand)
        self.events += 1

    async def stop(self) -> None:
        if self._later is not None:
            self._later.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._later

    def _demand_of(self, w: Waiting) -> Demand | None:
        job = self.state.jobs.get(w.req.job_id)
        if job is None:
            return None
        req = self.state.request(job)
        return Demand(
            job_id=w.req.job_id,
            worker=w.req.worker,
            owner=w.req.owner,
            project=req.project,
            gpu_types=list(w.req.gpu_types),
            gpu_count=w.req.gpu_count,
            max_price=w.req.max_price,
            region=w.req.region,
            burst_allowed=req.allow_burst,
            waiting_since=from_ms(w.queued_ms) or self.state.clock(),
            gpu_fraction=w.req.fraction,
            reason=job.get("queue_reason"),
            cpu_count=w.req.cpu_count,
        )


def _key(demand: Sequence[Waiting]) -> Key:
    return frozenset((w.req.job_id, w.req.worker) for w in demand)
