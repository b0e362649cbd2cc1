"""The alert state machine of one rule, as Prometheus's rule manager runs it, over plain data.

Each evaluation gives the label sets the rule's query returned (with their values). A label
set not yet alerting becomes `pending`, and `firing` once its condition held `for_s` (at
once when `for_s` is 0). A pending alert whose condition is gone is dropped (it never fired:
no event). A firing one whose condition is gone keeps firing until it has been gone for
`keep_firing_for_s`, then is `resolved`; its condition back before that, it fires on as one
alert. An alert that resolved is done: the label set matching again starts a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from gpufleet_contracts.alerts import AlertState


def fingerprint(labels: Mapping[str, str]) -> str:
    """A label set's stable key (sorted, hashed)."""
    data = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Instance:
    """One alert of a rule: a label set and where it stands."""

    labels: Mapping[str, str]
    state: AlertState
    started_at: datetime  # its condition first held (Prometheus's activeAt)
    value: float
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    # the first evaluation its condition was gone while firing (Prometheus's keepFiringSince)
    keep_firing_since: datetime | None = None


@dataclass(frozen=True)
class Step:
    """What one evaluation did to one label set: `before` -> `after` (None: dropped)."""

    key: str
    before: Instance | None
    after: Instance | None

    @property
    def fired(self) -> bool:
        was = self.before is not None and self.before.state is AlertState.firing
        return not was and self.after is not None and self.after.state is AlertState.firing

    @property
    def resolved(self) -> bool:
        return self.after is not None and self.after.state is AlertState.resolved

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class Timing:
    for_s: float
    keep_firing_for_s: float


def _present(before: Instance | None, sample: Sample, now: datetime, t: Timing) -> Instance:
    if before is None:
        before = Instance(sample.labels, AlertState.pending, now, sample.value)
    current = replace(before, value=sample.value, keep_firing_since=None)
    held = (now - current.started_at).total_seconds()
    if current.state is AlertState.pending and held >= t.for_s:
        return replace(current, state=AlertState.firing, fired_at=now)
    return current


def _absent(before: Instance, now: datetime, t: Timing) -> Instance | None:
    if before.state is AlertState.pending:
        return None
    since = before.keep_firing_since or now
    if t.keep_firing_for_s > 0 and (now - since).total_seconds() < t.keep_firing_for_s:
        return replace(before, keep_firing_since=since)
    return replace(before, state=AlertState.resolved, resolved_at=now, keep_firing_since=None)


def evaluate(
    active: Mapping[str, Instance],
    samples: Mapping[str, Sample],
    now: datetime,
    timing: Timing,
) -> list[Step]:
    """One evaluation at `now`: `active`, the pending and firing alerts by key; `samples`,
    what the query returned, by the same key (`fingerprint` of the labels). Every label
    set's step, in key order; unchanged ones included (their value moves)."""
    steps: list[Step] = []
    for key in sorted(set(active) | set(samples)):
        before = active.get(key)
        sample = samples.get(key)
        if sample is not None:
            steps.append(Step(key, before, _present(before, sample, now, timing)))
        elif before is not None:
            steps.append(Step(key, before, _absent(before, now, timing)))
    return steps
