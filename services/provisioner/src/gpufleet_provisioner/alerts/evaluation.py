"""The evaluation round: every rule's query asked of Prometheus, its alerts moved by the state
machine (states.py) and stored with their events (book.py).

A rule whose query fails keeps its alerts as they are (a Prometheus that cannot answer
resolves nothing) and says why in its status. A rule that matches more label sets than it
may hold alerts keeps those already alerting first, then the rest in key order.
"""

from __future__ import annotations

import asyncio
import logging

from gpufleet_contracts.clock import Clock

from .book import AlertBook
from .prometheus import Prometheus, PrometheusError
from .states import Sample, Timing, evaluate, fingerprint
from .views import Rule

log = logging.getLogger("gpufleet.provisioner.alerts")

QUERIES_AT_ONCE = 8  # rules evaluated at the same time (each one query, one transaction)


def labelled(rule: Rule, samples: list[Sample]) -> dict[str, Sample]:
    """The query's samples as alerts' label sets (the rule's labels over the series', and
    `alertname`), by key."""
    out: dict[str, Sample] = {}
    for s in samples:
        labels = {**s.labels, **rule.spec.labels, "alertname": rule.name}
        out[fingerprint(labels)] = Sample(labels, s.value)
    return out


def bounded(found: dict[str, Sample], live: set[str], cap: int) -> dict[str, Sample]:
    if len(found) <= cap:
        return found
    keys = sorted(found, key=lambda k: (k not in live, k))[:cap]
    return {k: found[k] for k in keys}


class Evaluator:
    def __init__(
        self,
        book: AlertBook,
        prometheus: Prometheus,
        builtin: list[Rule],
        clock: Clock,
        instances_per_rule: int,
    ) -> None:
        self.book = book
        self.prometheus = prometheus
        self.builtin = builtin
        self.clock = clock
        self.cap = instances_per_rule

    async def round(self) -> None:
        """Every rule once (QUERIES_AT_ONCE at a time), then the resolved alerts past their
        keep pruned, and past the cap of each rule that resolved some."""
        rules = [*self.builtin, *await self.book.rules()]
        slots = asyncio.Semaphore(QUERIES_AT_ONCE)
        resolving: list[str] = []

        async def one(rule: Rule) -> None:
            async with slots:
                try:
                    if await self.evaluate(rule):
                        resolving.append(rule.id)
                except Exception:
                    log.exception("alert rule %s (%s) failed its evaluation", rule.id, rule.name)

        await asyncio.gather(*(one(r) for r in rules))
        await self.book.prune(self.clock(), self.cap, resolving)

    async def evaluate(self, rule: Rule) -> bool:
        """One rule's evaluation; whether some of its alerts resolved."""
        now = self.clock()
        try:
            samples = await self.prometheus.query(rule.query)
        except PrometheusError as exc:
            log.warning("alert rule %s: %s", rule.name, exc)
            await self.book.evaluated(rule, now, str(exc)[:500])
            return False
        stored = await self.book.live(rule)
        found = labelled(rule, samples)
        kept = bounded(found, set(stored), self.cap)
        timing = Timing(rule.spec.for_s, rule.spec.keep_firing_for_s)
        steps = evaluate({k: v[1] for k, v in stored.items()}, kept, now, timing)
        changed = [s for s in steps if s.changed]
        if changed:
            await self.book.apply(rule, changed, {k: v[0] for k, v in stored.items()})
        await self.book.evaluated(rule, now, None, truncated=len(kept) < len(found))
        return any(s.resolved for s in changed)
