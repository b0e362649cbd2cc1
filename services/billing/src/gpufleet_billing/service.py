"""The billing service layer: applies the pure fee rules to the ledger, idempotently.

Handlers record facts (placements, starts, ends, devices, payment modes) and settle the charge
groups those facts change; the clock (`tick`) settles what time makes due: running hours,
finished days' device fees, daily payouts. Every write goes through `settle.delta`, so a
replayed event or a repeated tick posts nothing, and a fact learned late posts the exact
correction. By responsibility: placements.py (workers' runs), devices.py (device fees),
payouts.py (payouts), keeper.py (the store, the lock, the cursors they share).

The order of a worker's facts. Billing reads the worker stream (`gpufleet.v1.evt.worker.>`:
WorkerPlaced, WorkerStarted, WorkerFinished) through one consumer, a batch at a time
(gpufleet_bus.batches): a batch's placements first, then its starts, then its ends, which is
the order of one worker's facts, so a batch applies as the stream's order would. That order
puts a placement before the node's facts about it:

- the scheduler emits a WorkerPlaced and the StartWorker it goes with in one transaction,
  WorkerPlaced first (gpufleet_scheduler.placing), so into one outbox document, whose
  messages the relay publishes in order on one connection (gpufleet_bus.outbox);
- one NATS server processes a connection's messages in order: the WorkerPlaced is stored
  (EVENTS) before the StartWorker is (COMMANDS);
- the node agent starts the worker only on a StartWorker read from COMMANDS, and publishes
  its WorkerStarted, then its WorkerFinished (each acknowledged before the next is sent),
  after that; so both are stored after the WorkerPlaced. (A WorkerFinished before its
  WorkerStarted would be harmless anyway: it carries the start.)

Where this does not hold: the EVENTS stream refuses the WorkerPlaced for a moment (a limit,
a storage error) while COMMANDS stores the StartWorker, and the relay sends the document
again later, after the node reported; a cluster whose EVENTS and COMMANDS streams have
different leaders (no order across streams); a fact whose WorkerPlaced billing never read
(before the stream's history). Such a fact is parked, not retried: kept in `parked` and
applied when its placement is recorded (placements.py); one that never gets a placement stays
there, and charges nothing. A worker fact counts only on its node's own subject (app.py) and
from the node the placement named (`placements._from_its_node`).
"""

from __future__ import annotations

from datetime import datetime

from pymongo import ASCENDING, IndexModel

from . import ledger, running_totals
from .devices import Devices
from .fees import PLATFORM
from .payouts import Payouts
from .periods import day_of, to_ms
from .placements import MAX_HOURS_PER_TICK, Placements

INDEXES = {
    "placements": [IndexModel([("job_id", ASCENDING)])],
    "parked": [IndexModel([("placement_id", ASCENDING)])],
    "ledger": ledger.LEDGER_INDEXES,
    "devices": [IndexModel([("account", ASCENDING)])],
    "payout_accounts": [],
    "cursors": [],
    running_totals.TOTALS: [],
}


class Billing(Placements, Devices, Payouts):
    """Built from a store and a clock (Keeper's)."""

    async def tick(self, now: datetime | None = None) -> int:
        """Settle everything due at `now` (the clock by default); safe to repeat or to run late."""
        now = now or self.clock()
        today = day_of(to_ms(now))
        written = await self.bill_running_hours(to_ms(now))
        written += await self.charge_device_days(today)
        written += await self.make_payouts(today)
        return written


__all__ = ["INDEXES", "MAX_HOURS_PER_TICK", "PLATFORM", "Billing"]
