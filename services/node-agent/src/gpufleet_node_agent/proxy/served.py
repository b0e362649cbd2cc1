"""The endpoint workers this node serves, as the proxy sees them: read from the worker
manager's active workers (a worker whose StartWorker carried `serving` and has not ended),
probed until their socket answers (readiness), chosen in turn for requests, metered; their
EndpointReady (with the cold start's phases) and EndpointMetered published.

A notebook's worker is taken with the SHA-256 of its token (kept in its directory from its
start on: steps/serve.py), which its callers are checked against (app.py).

A worker is *ready* once GET of its health path through its socket answers below 500; the
probe runs every PROBE_S from the moment its socket appears. Requests to a job with no
ready worker are held by the app (app.py) until `changed` tells them to look again.

What was published of a worker is kept in its directory (`endpoint.json`: EndpointReady
sent, the meter's totals), so that an agent restarted meanwhile neither tells its
readiness again (with fewer phases: the steps' times are not kept) nor counts from zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet_bus.publish import Publisher, publish
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_contracts.serving import ColdStartPhase, EndpointMetered, EndpointReady, PhaseAt

from ..steps.base import StepName
from ..steps.serve import is_notebook, socket_path, token_sha256
from ..worker.files import read_json, write_json_atomic
from ..worker.workdir import LAUNCHED, Worker
from . import forward
from .hosts import UrlTemplate
from .pool import Pool, Unreachable

log = logging.getLogger("gpufleet.node_agent.proxy")

PROBE_S = 0.1  # while a worker is not ready
IDLE_S = 0.5  # otherwise: new workers, ended ones, metering
PROBE_TIMEOUT_S = 2.0
METERED_EVERY_S = 5.0
SOURCE = "gpufleet/node-agent/proxy"
KEPT = "endpoint.json"  # in the worker's directory: what was published of it
COUNTERS = ("requests", "errors", "bytes_in", "bytes_out", "messages")
# Which step's end (worker.done_at) is which phase of a cold start.
PHASE_OF = {
    StepName.image.value: ColdStartPhase.image_ready,
    StepName.inputs.value: ColdStartPhase.data_staged,
    LAUNCHED: ColdStartPhase.process_started,
}


@dataclass
class Meter:
    requests: int = 0
    errors: int = 0  # answered 5xx
    bytes_in: int = 0
    bytes_out: int = 0
    messages: int = 0  # websocket messages, both ways (their bytes are in bytes_in/out)
    seq: int = 0  # bumped on each change

    def answered(self, status: int) -> None:
        self.requests += 1
        if status >= 500:
            self.errors += 1
        self.seq += 1

    def moved(self, bytes_in: int = 0, bytes_out: int = 0) -> None:
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        self.seq += 1

    def message(self, bytes_in: int = 0, bytes_out: int = 0) -> None:
        self.messages += 1
        self.moved(bytes_in, bytes_out)


@dataclass(eq=False)
class Served:
    """One endpoint worker: its connections, whether it answers, its meter."""

    worker: Worker
    pool: Pool
    meter: Meter = field(default_factory=Meter)
    ready: bool = False
    first_answer: datetime | None = None
    told_ready: bool = False
    metered_sent: int = -1  # the meter's seq last published
    metered_at: float = -1e9  # monotonic
    token_sha256: str | None = None  # a notebook's: what opens it (None: nothing does)

    @property
    def job_id(self) -> str:
        return self.worker.job_id

    @property
    def notebook(self) -> bool:
        return is_notebook(self.worker.spec.serving)

    @property
    def socket(self) -> str:
        return str(socket_path(self.worker.dir))


def _there(path: str) -> bool:
    """A stat, not a wait: the probe looks once a round."""
    return os.path.lexists(path)


class Endpoints:
    def __init__(
        self,
        workers: Callable[[], Iterable[Worker]],
        *,
        minion_id: str,
        publisher: Publisher | None,
        template: UrlTemplate,
        uid: int | None,
        clock: Clock = utcnow,
        metered_every_s: float = METERED_EVERY_S,
    ) -> None:
        self.workers = workers  # the manager's active workers
        self.minion_id = minion_id
        self.publisher = publisher  # None: nothing published (tests of the app alone)
        self.template = template
        self.uid = uid  # who owns a worker's socket (the container's user)
        self.clock = clock
        self.metered_every_s = metered_every_s  # a worker's EndpointMetered, at most this often
        self._served: dict[str, Served] = {}  # by placement id
        self._turn: dict[str, itertools.count[int]] = {}  # round robin, by job
        self.changed = asyncio.Event()  # set (and replaced) when a worker gets ready or goes
        self._ended: list[Served] = []  # gone, their last metering not yet published

    # --- what the app asks --------------------------------------------------------------

    def of(self, job_id: str) -> list[Served]:
        """The job's endpoint workers on this node that have not ended (ready or not)."""
        self.sync()
        return [s for s in self._served.values() if s.job_id == job_id]

    def pick(self, job_id: str) -> Served | None:
        """A ready worker of the job, in turn; None when none is ready."""
        ready = [s for s in self.of(job_id) if s.ready]
        if not ready:
            return None
        turn = self._turn.setdefault(job_id, itertools.count())
        return ready[next(turn) % len(ready)]

    def unready(self, s: Served) -> None:
        """Its socket stopped answering: probed again, requests held meanwhile."""
        s.ready = False

    def answered(self, s: Served) -> None:
        """A request through it was answered: it is ready, whatever the probe says yet."""
        self._now_ready(s)

    # --- the workers -------------------------------------------------------------------

    def sync(self) -> None:
        """Take the endpoint workers the manager has now; those that ended, or left it, are
        dropped (their last metering published by the next round)."""
        live: set[str] = set()
        for w in self.workers():
            if w.spec.serving is None or w.file("exit.json").exists():
                continue
            live.add(w.placement_id)
            if w.placement_id not in self._served:
                self._served[w.placement_id] = self._taken(w)
        gone = [p for p in self._served if p not in live]
        for p in gone:
            s = self._served.pop(p)
            self._ended.append(s)
        if gone:
            self._wake()
            jobs = {s.job_id for s in self._served.values()}
            self._turn = {j: c for j, c in self._turn.items() if j in jobs}

    def _taken(self, w: Worker) -> Served:
        """A worker seen for the first time (by this agent: what an earlier one published of
        it is taken back)."""
        s = Served(w, Pool(socket_path(w.dir), self.uid))
        if s.notebook:
            s.token_sha256 = token_sha256(w.dir)
        kept = read_json(w.file(KEPT)) or {}
        s.told_ready = bool(kept.get("ready_told"))
        totals = kept.get("meter")
        if isinstance(totals, dict):
            for c in COUNTERS:
                setattr(s.meter, c, int(totals.get(c) or 0))
        return s

    def _keep(self, s: Served) -> None:
        m = s.meter
        meter = {c: getattr(m, c) for c in COUNTERS}
        with contextlib.suppress(OSError):  # its directory gone: nothing to keep it for
            write_json_atomic(s.worker.file(KEPT), {"ready_told": s.told_ready, "meter": meter})

    async def run(self) -> None:
        """Until cancelled: probe workers that are not ready, publish what is due."""
        try:
            while True:
                try:
                    await self._round()
                except Exception:  # a bug of a round: said, and the next round goes on
                    log.exception("endpoint proxy: a round failed")
                await asyncio.sleep(PROBE_S if self._waiting() else IDLE_S)
        finally:
            for s in [*self._served.values(), *self._ended]:
                await s.pool.aclose()

    def _waiting(self) -> bool:
        return any(not s.ready for s in self._served.values())

    async def _round(self) -> None:
        self.sync()
        waiting = [s for s in self._served.values() if not s.ready]
        await asyncio.gather(*(self._probe(s) for s in waiting))
        await self._publish_due()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _now_ready(self, s: Served) -> None:
        if s.ready:
            return
        s.ready = True
        if s.first_answer is None:
            s.first_answer = self.clock()
        self._wake()

    async def _probe(self, s: Served) -> None:
        if not _there(s.socket):
            return
        serving = s.worker.spec.serving
        path = serving.health_path if serving is not None else "/"
        headers = [(b"host", b"worker"), (b"user-agent", b"gpufleet-proxy-probe")]
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                status = await forward.status_of(s.pool, path.encode(), headers)
        except (Unreachable, forward.BrokeOff, *forward.BROKE):
            return
        if status < 500:
            self._now_ready(s)

    # --- what is published -------------------------------------------------------------

    def phases(self, s: Served) -> list[PhaseAt]:
        at = {PHASE_OF[k]: v for k, v in s.worker.done_at.items() if k in PHASE_OF}
        if s.first_answer is not None:
            at[ColdStartPhase.first_answer] = s.first_answer
        return [PhaseAt(phase=p, at=at[p]) for p in ColdStartPhase if p in at]

    def ready_event(self, s: Served) -> EndpointReady:
        w = s.worker
        return EndpointReady(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            url=self.template.url(w.job_id),
            phases=self.phases(s),
        )

    def metered_event(self, s: Served) -> EndpointMetered:
        w, m = s.worker, s.meter
        return EndpointMetered(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            at=self.clock(),
            requests=m.requests,
            errors=m.errors,
            bytes_in=m.bytes_in,
            bytes_out=m.bytes_out,
        )

    async def _publish_due(self) -> None:
        now = time.monotonic()
        sends = []
        for s in self._served.values():
            if s.ready and not s.told_ready:
                sends.append(self._told_ready(s))
            if s.meter.seq != s.metered_sent and now - s.metered_at >= self.metered_every_s:
                sends.append(self._metered(s, now))
        ended, self._ended = self._ended, []
        for s in ended:
            sends.append(self._last(s, now))
        await asyncio.gather(*sends)

    async def _told_ready(self, s: Served) -> None:
        if self.publisher is None:
            s.told_ready = True
            return
        evt = self.ready_event(s)
        try:
            await publish(
                self.publisher, evt, source=SOURCE, msg_id=f"ready:{s.worker.placement_id}"
            )
        except Exception as exc:  # NATS away: the next round tries again
            log.debug("endpoint %s: EndpointReady not sent: %s", s.worker.key, exc)
            return
        s.told_ready = True
        self._keep(s)
        log.info("endpoint %s ready at %s", s.worker.key, evt.url)

    async def _metered(self, s: Served, now: float) -> None:
        seq = s.meter.seq
        s.metered_at = now
        if self.publisher is None:
            s.metered_sent = seq
            return
        msg_id = f"metered:{s.worker.placement_id}:{seq}"
        try:
            await publish(self.publisher, self.metered_event(s), source=SOURCE, msg_id=msg_id)
        except Exception as exc:
            log.debug("endpoint %s: EndpointMetered not sent: %s", s.worker.key, exc)
            return
        s.metered_sent = seq
        self._keep(s)

    async def _last(self, s: Served, now: float) -> None:
        """Its last metering (once, at its end), then its connections closed."""
        with contextlib.suppress(Exception):
            await s.pool.aclose()
        s.metered_at = -1e9
        await self._metered(s, now)
        if s.metered_sent != s.meter.seq and self.publisher is not None:
            self._ended.append(s)  # not sent: again next round
