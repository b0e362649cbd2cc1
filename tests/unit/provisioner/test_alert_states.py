"""The alert state machine over a fake clock: `for`, `keep_firing_for`, per label set."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet_contracts.alerts import AlertState
from gpufleet_provisioner.alerts.evaluation import bounded
from gpufleet_provisioner.alerts.states import Instance, Sample, Step, Timing, evaluate, fingerprint

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOT = {"node": "n1", "gpu": "0"}
KEY = fingerprint(HOT)


class Rule:
    """One rule's alerts, evaluated at `t0 + s` seconds as a rule manager would."""

    def __init__(self, for_s: float = 0, keep_s: float = 0) -> None:
        self.timing = Timing(for_s, keep_s)
        self.active: dict[str, Instance] = {}
        self.steps: list[Step] = []

    def at(self, s: float, value: float | None) -> Instance | None:
        samples = {} if value is None else {KEY: Sample(HOT, value)}
        steps = evaluate(self.active, samples, T0 + timedelta(seconds=s), self.timing)
        self.steps.extend(steps)
        for step in steps:
            live = step.after is not None and step.after.state is not AlertState.resolved
            if live and step.after is not None:
                self.active[step.key] = step.after
            else:
                self.active.pop(step.key, None)
        return steps[0].after if steps else None

    def fired(self) -> int:
        return sum(s.fired for s in self.steps)

    def resolved(self) -> int:
        return sum(s.resolved for s in self.steps)


def test_for_zero_fires_at_once_and_resolves_when_gone() -> None:
    r = Rule()
    a = r.at(0, 90)
    assert a is not None and a.state is AlertState.firing and a.fired_at == T0
    a = r.at(15, None)
    assert a is not None and a.state is AlertState.resolved
    assert a.resolved_at == T0 + timedelta(seconds=15)
    assert (r.fired(), r.resolved()) == (1, 1)


def test_pending_until_for_then_firing_once() -> None:
    r = Rule(for_s=30)
    assert (a := r.at(0, 90)) is not None and a.state is AlertState.pending
    assert (a := r.at(15, 91)) is not None and a.state is AlertState.pending and a.value == 91
    assert (a := r.at(30, 92)) is not None and a.state is AlertState.firing
    assert a.started_at == T0 and a.fired_at == T0 + timedelta(seconds=30)
    assert (a := r.at(45, 93)) is not None and a.state is AlertState.firing
    assert r.fired() == 1


def test_pending_that_goes_away_never_fires_and_is_dropped() -> None:
    r = Rule(for_s=30)
    r.at(0, 90)
    assert r.at(15, None) is None
    assert r.active == {}
    # back again: a new pending alert, its `for` counted from now
    assert (a := r.at(30, 90)) is not None and a.state is AlertState.pending
    assert a.started_at == T0 + timedelta(seconds=30)
    assert (r.fired(), r.resolved()) == (0, 0)


def test_keep_firing_for_holds_then_resolves() -> None:
    r = Rule(keep_s=30)
    r.at(0, 90)
    a = r.at(15, None)
    assert a is not None and a.state is AlertState.firing
    assert a.keep_firing_since == T0 + timedelta(seconds=15)
    assert (a := r.at(30, None)) is not None and a.state is AlertState.firing
    assert (a := r.at(45, None)) is not None and a.state is AlertState.resolved
    assert (r.fired(), r.resolved()) == (1, 1)


def test_condition_back_within_keep_firing_for_is_the_same_alert() -> None:
    r = Rule(keep_s=30)
    r.at(0, 90)
    r.at(15, None)
    a = r.at(30, 95)
    assert a is not None and a.state is AlertState.firing and a.keep_firing_since is None
    assert a.started_at == T0 and a.fired_at == T0
    r.at(45, None)  # gone again: keep_firing_for counts from here, not from the first gap
    assert (a := r.at(70, None)) is not None and a.state is AlertState.firing
    assert (a := r.at(75, None)) is not None and a.state is AlertState.resolved
    assert (r.fired(), r.resolved()) == (1, 1)


def test_after_resolving_the_label_set_starts_a_new_alert() -> None:
    r = Rule()
    r.at(0, 90)
    r.at(15, None)
    a = r.at(30, 90)
    assert a is not None and a.state is AlertState.firing
    assert a.started_at == T0 + timedelta(seconds=30)
    assert (r.fired(), r.resolved()) == (2, 1)


def test_each_label_set_is_its_own_alert() -> None:
    other = {"node": "n1", "gpu": "1"}
    timing = Timing(0, 0)
    both = {KEY: Sample(HOT, 90), fingerprint(other): Sample(other, 88)}
    steps = evaluate({}, both, T0, timing)
    assert sorted(s.after.labels["gpu"] for s in steps if s.after) == ["0", "1"]
    assert all(s.fired for s in steps)
    active = {s.key: s.after for s in steps if s.after is not None}
    later = evaluate(active, {KEY: Sample(HOT, 91)}, T0 + timedelta(seconds=15), timing)
    by_gpu = {s.before.labels["gpu"]: s for s in later if s.before}
    assert not by_gpu["0"].fired and not by_gpu["0"].resolved
    assert by_gpu["1"].resolved


def test_fingerprint_ignores_label_order() -> None:
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"})
    assert fingerprint({"a": "1"}) != fingerprint({"a": "2"})


def test_a_rule_past_its_cap_keeps_the_alerts_it_has_first() -> None:
    found = {k: Sample({"k": k}, 1.0) for k in ("a", "b", "c", "d")}
    assert sorted(bounded(found, set(), 2)) == ["a", "b"]
    assert sorted(bounded(found, {"d"}, 2)) == ["a", "d"]
    assert bounded(found, set(), 9) == found
