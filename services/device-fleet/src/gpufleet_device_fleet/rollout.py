"""A rollout as a pure state machine (R-DEV-3): a canary wave, then batches; stopped when
failures pass the threshold; a per-device timeout; cancellable at any stage.

Every function takes a `Rollout` and returns the next one with the `Effect`s the service must
carry out (tell a device to deploy, or to go back to what it ran before). Nothing here reads a
clock or a database: the service passes `now` and stores what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpufleet_contracts.devices import IN_PROGRESS, DeployState, RolloutPhase, RolloutPolicy

DONE = frozenset({DeployState.running, DeployState.failed, DeployState.cancelled})
FINISHED = frozenset({RolloutPhase.succeeded, RolloutPhase.stopped, RolloutPhase.cancelled})
ORDER = {
    s: i
    for i, s in enumerate(
        (DeployState.pending, DeployState.downloading, DeployState.starting, DeployState.running)
    )
}


@dataclass(frozen=True)
class Target:
    """One device of a rollout: its wave (0 the canary), where it is, why, and when it was
    told (its timeout counts from then)."""

    device_id: str
    wave: int
    state: DeployState = DeployState.waiting
    reason: str | None = None
    told_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class Rollout:
    rollout_id: str
    policy: RolloutPolicy
    targets: tuple[Target, ...]
    phase: RolloutPhase = RolloutPhase.canary
    wave: int = 0  # the wave under way
    reason: str | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def target(self, device_id: str) -> Target | None:
        return next((t for t in self.targets if t.device_id == device_id), None)


@dataclass(frozen=True)
class Deploy:
    """Tell the device to deploy the rollout's configuration."""

    device_id: str


@dataclass(frozen=True)
class Revert:
    """Tell the device to go back to what it ran before the rollout (it was on its way)."""

    device_id: str


Effect = Deploy | Revert
Step = tuple[Rollout, list[Effect]]


def waves(device_ids: list[str], policy: RolloutPolicy) -> list[int]:
    """Each device's wave: the first `canary` are wave 0, then batches of `batch_size`
    (with no canary the first batch is wave 0)."""
    out: list[int] = []
    for i, _ in enumerate(device_ids):
        if i < policy.canary:
            out.append(0)
        else:
            first = 1 if policy.canary else 0
            out.append(first + (i - policy.canary) // policy.batch_size)
    return out


def begin(rollout_id: str, device_ids: list[str], policy: RolloutPolicy, now: datetime) -> Step:
    """A new rollout: its first wave told at once."""
    if not device_ids:
        raise ValueError("a rollout needs at least one device")
    targets = tuple(
        Target(d, w) for d, w in zip(device_ids, waves(device_ids, policy), strict=True)
    )
    phase = RolloutPhase.canary if policy.canary else RolloutPhase.batches
    return _start_wave(Rollout(rollout_id, policy, targets, phase=phase, wave=0), now)


def observe(
    r: Rollout, device_id: str, state: DeployState, reason: str | None, now: datetime
) -> Step:
    """A device reported `state` for this rollout. A report that would move it backwards
    (an older one arriving late), or about a device not told yet, or after the rollout or
    the device ended, changes nothing."""
    t = r.target(device_id)
    if r.finished or t is None or t.state in DONE or t.state == DeployState.waiting:
        return r, []
    if state not in ORDER and state != DeployState.failed:
        return r, []
    if state in ORDER and ORDER[state] < ORDER.get(t.state, 0):
        return r, []
    why = reason if state == DeployState.failed else None
    if state == DeployState.failed and not why:
        why = "the device reported a failure"
    return _advance(_set(r, replace(t, state=state, reason=why, updated_at=now)), now)


def expire(r: Rollout, now: datetime) -> Step:
    """Devices not running within the policy's timeout of being told have failed."""
    if r.finished:
        return r, []
    limit = timedelta(seconds=r.policy.device_timeout_s)
    late = [
        t for t in r.targets if t.state in IN_PROGRESS and t.told_at and now - t.told_at >= limit
    ]
    if not late:
        return r, []
    for t in late:
        why = f"not running {r.policy.device_timeout_s} s after it was told (last: {t.state})"
        r = _set(r, replace(t, state=DeployState.failed, reason=why, updated_at=now))
    step = _advance(r, now)
    # a device timed out is told to go back, as a cancelled one is
    return step[0], [*step[1], *(Revert(t.device_id) for t in late)]


def cancel(r: Rollout, now: datetime, reason: str = "cancelled") -> Step:
    """Cancel at any stage: no device is left waiting or in progress."""
    if r.finished:
        return r, []
    return _halt(r, RolloutPhase.cancelled, reason, now)


def tried(r: Rollout) -> tuple[int, int]:
    """(devices told whose deployment ended, how many of them failed)."""
    ended = [t for t in r.targets if t.state in (DeployState.running, DeployState.failed)]
    return len(ended), sum(1 for t in ended if t.state == DeployState.failed)


def over_threshold(r: Rollout) -> bool:
    ended, failed = tried(r)
    if failed == 0 or ended < r.policy.min_tried:
        return False
    return failed * 100 >= r.policy.max_failed_percent * ended


def _advance(r: Rollout, now: datetime) -> Step:
    if r.phase == RolloutPhase.canary:
        failed = [t for t in r.targets if t.wave == 0 and t.state == DeployState.failed]
        if failed:
            first = failed[0]
            return _halt(
                r, RolloutPhase.stopped, f"canary {first.device_id} failed: {first.reason}", now
            )
    if over_threshold(r):
        ended, failed_n = tried(r)
        why = f"{failed_n} of {ended} devices failed, at or over {r.policy.max_failed_percent} %"
        return _halt(r, RolloutPhase.stopped, why, now)
    current = [t for t in r.targets if t.wave == r.wave]
    if any(t.state not in DONE for t in current):
        return r, []
    if r.wave + 1 > max(t.wave for t in r.targets):
        return replace(r, phase=RolloutPhase.succeeded, finished_at=now), []
    return _start_wave(replace(r, phase=RolloutPhase.batches, wave=r.wave + 1), now)


def _start_wave(r: Rollout, now: datetime) -> Step:
    told = [
        replace(t, state=DeployState.pending, told_at=now, updated_at=now)
        for t in r.targets
        if t.wave == r.wave and t.state == DeployState.waiting
    ]
    for t in told:
        r = _set(r, t)
    return r, [Deploy(t.device_id) for t in told]


def _halt(r: Rollout, phase: RolloutPhase, reason: str, now: datetime) -> Step:
    effects: list[Effect] = []
    targets = []
    for t in r.targets:
        if t.state == DeployState.waiting:
            t = replace(
                t, state=DeployState.cancelled, reason=f"not deployed: {reason}", updated_at=now
            )
        elif t.state in IN_PROGRESS:
            effects.append(Revert(t.device_id))
            t = replace(t, state=DeployState.cancelled, reason=f"stopped: {reason}", updated_at=now)
        targets.append(t)
    return replace(r, targets=tuple(targets), phase=phase, reason=reason, finished_at=now), effects


def _set(r: Rollout, target: Target) -> Rollout:
    return replace(
        r, targets=tuple(target if t.device_id == target.device_id else t for t in r.targets)
    )
