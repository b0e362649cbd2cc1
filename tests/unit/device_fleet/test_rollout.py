"""The rollout state machine (rollout.py) on plain data: canary first, then batches; stopped
when failures pass the threshold; per-device timeouts; cancel at any stage leaves no device
waiting or in progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpufleet_contracts.devices import IN_PROGRESS, DeployState, RolloutPhase, RolloutPolicy
from gpufleet_device_fleet import rollout
from gpufleet_device_fleet.rollout import Deploy, Revert, Rollout

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = DeployState


def states(r: Rollout) -> dict[str, DeployState]:
    return {t.device_id: t.state for t in r.targets}


def run(r: Rollout, device: str, *steps: DeployState, at: datetime = T0) -> tuple[Rollout, list]:
    effects: list = []
    for s in steps:
        r, more = rollout.observe(r, device, s, "boom" if s == S.failed else None, at)
        effects += more
    return r, effects


def test_waves_canary_then_batches() -> None:
    policy = RolloutPolicy(canary=1, batch_size=2)
    assert rollout.waves(["a", "b", "c", "d", "e"], policy) == [0, 1, 1, 2, 2]
    assert rollout.waves(["a", "b", "c"], RolloutPolicy(canary=0, batch_size=2)) == [0, 0, 1]


def test_canary_first_then_each_batch_after_the_previous_one() -> None:
    r, effects = rollout.begin(
        "r1", ["a", "b", "c", "d"], RolloutPolicy(canary=1, batch_size=2), T0
    )
    assert effects == [Deploy("a")]
    assert states(r) == {"a": S.pending, "b": S.waiting, "c": S.waiting, "d": S.waiting}
    r, effects = run(r, "a", S.downloading, S.starting)
    assert effects == [] and r.phase == RolloutPhase.canary
    r, effects = run(r, "a", S.running)
    assert effects == [Deploy("b"), Deploy("c")] and r.phase == RolloutPhase.batches
    r, effects = run(r, "b", S.running)
    assert effects == []  # c still on its way
    r, effects = run(r, "c", S.running)
    assert effects == [Deploy("d")]
    r, effects = run(r, "d", S.running)
    assert effects == [] and r.phase == RolloutPhase.succeeded and r.finished_at == T0


def test_a_failed_canary_stops_the_rollout_before_the_rest() -> None:
    r, _ = rollout.begin("r1", ["a", "b", "c"], RolloutPolicy(canary=1, batch_size=5), T0)
    r, effects = run(r, "a", S.downloading, S.failed)
    assert effects == []  # nothing else was told, nothing to take back
    assert r.phase == RolloutPhase.stopped
    assert r.reason == "canary a failed: boom"
    assert states(r) == {"a": S.failed, "b": S.cancelled, "c": S.cancelled}
    assert r.target("b").reason.startswith("not deployed: canary a failed")  # type: ignore[union-attr]


def test_failures_over_the_threshold_stop_it_and_take_back_devices_on_their_way() -> None:
    policy = RolloutPolicy(canary=0, batch_size=4, max_failed_percent=50, min_tried=2)
    r, _ = rollout.begin("r1", ["a", "b", "c", "d", "e"], policy, T0)
    r, _ = run(r, "a", S.failed)
    assert r.phase == RolloutPhase.batches  # one tried: under min_tried
    r, _ = run(r, "b", S.running)
    assert r.phase == RolloutPhase.stopped  # 1 of 2 failed: 50 %
    assert "1 of 2 devices failed" in (r.reason or "")
    r2, effects = rollout.begin("r2", ["a", "b", "c", "d"], policy, T0)
    r2, _ = run(r2, "c", S.downloading)
    r2, _ = run(r2, "a", S.failed)
    r2, effects = run(r2, "b", S.failed)
    assert set(effects) == {Revert("c"), Revert("d")}
    assert not any(s in IN_PROGRESS or s == S.waiting for s in states(r2).values())


def test_below_the_threshold_it_goes_on() -> None:
    policy = RolloutPolicy(canary=0, batch_size=2, max_failed_percent=60, min_tried=1)
    r, _ = rollout.begin("r1", ["a", "b", "c"], policy, T0)
    r, _ = run(r, "a", S.failed)
    assert r.phase == RolloutPhase.stopped  # 1 of 1: 100 %
    r, _ = rollout.begin("r1", ["a", "b", "c"], policy, T0)
    r, _ = run(r, "a", S.running)
    r, effects = run(r, "b", S.failed)  # 1 of 2: 50 % < 60 %
    assert effects == [Deploy("c")] and r.phase == RolloutPhase.batches


def test_a_device_not_running_within_its_timeout_failed() -> None:
    policy = RolloutPolicy(canary=1, batch_size=1, device_timeout_s=60)
    r, _ = rollout.begin("r1", ["a", "b"], policy, T0)
    r, _ = run(r, "a", S.downloading)
    same, effects = rollout.expire(r, T0 + timedelta(seconds=59))
    assert same == r and effects == []
    r, effects = rollout.expire(r, T0 + timedelta(seconds=60))
    assert r.phase == RolloutPhase.stopped
    assert effects == [Revert("a")]
    assert "not running 60 s after it was told (last: downloading)" in (r.target("a").reason or "")  # type: ignore[union-attr]


@pytest.mark.parametrize("stage", ["start", "canary-downloading", "batch", "finished"])
def test_cancel_at_any_stage_leaves_nothing_in_progress(stage: str) -> None:
    r, _ = rollout.begin("r1", ["a", "b", "c"], RolloutPolicy(canary=1, batch_size=1), T0)
    if stage == "canary-downloading":
        r, _ = run(r, "a", S.downloading)
    if stage in ("batch", "finished"):
        r, _ = run(r, "a", S.running)
        r, _ = run(r, "b", S.starting)
    if stage == "finished":
        r, _ = run(r, "b", S.running)
        r, _ = run(r, "c", S.running)
    before = r
    r, effects = rollout.cancel(r, T0, "cancelled by its owner")
    if stage == "finished":
        assert (r, effects) == (before, [])
        return
    assert r.phase == RolloutPhase.cancelled
    assert not any(s in IN_PROGRESS or s == S.waiting for s in states(r).values())
    on_the_way = {t.device_id for t in before.targets if t.state in IN_PROGRESS}
    assert set(effects) == {Revert(d) for d in on_the_way}
    # a late report changes nothing once it is over
    assert rollout.observe(r, "b", S.running, None, T0) == (r, [])


def test_late_and_backward_reports_change_nothing() -> None:
    r, _ = rollout.begin("r1", ["a", "b"], RolloutPolicy(canary=1, batch_size=1), T0)
    r, _ = run(r, "a", S.starting)
    assert rollout.observe(r, "a", S.downloading, None, T0) == (r, [])
    assert rollout.observe(r, "b", S.running, None, T0) == (r, [])  # not told yet
    assert rollout.observe(r, "zz", S.running, None, T0) == (r, [])


def test_a_rollout_needs_devices() -> None:
    with pytest.raises(ValueError):
        rollout.begin("r1", [], RolloutPolicy(), T0)
