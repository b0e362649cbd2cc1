"""A job's shown run times: the node's claims kept within what the scheduler saw (H2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet_contracts.jobs import WorkerFinished, WorkerStarted, WorkerState
from gpufleet_scheduler.jobdoc import seconds
from gpufleet_scheduler.reports import Applied, clamp_time, finished, started

T = datetime(2025, 6, 2, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)


def test_a_claimed_time_is_kept_between_the_stored_bound_and_its_receipt() -> None:
    assert clamp_time(T - 87_600 * H, T, T + H) == T  # ten years before the placement
    assert clamp_time(T + 9 * H, T, T + H) == T + H  # after it was received
    assert clamp_time(T + H / 2, T, T + H) == T + H / 2
    assert clamp_time(T - H, None, None) == T - H  # nothing known: as claimed
    naive = (T - H).replace(tzinfo=None)
    assert clamp_time(naive, T, None) == T  # a naive time is read as UTC


def placed_job() -> dict[str, object]:
    worker = {"index": 0, "placement_id": "p", "minion_id": "n", "state": "placed", "placed_at": T}
    return {"_id": "j", "workers": [worker]}


def run(agent_off: timedelta, sched_off: timedelta = timedelta(0)) -> float | None:
    """A 20-minute run on a node whose clock is `agent_off` off the bus's (and a scheduler
    whose clock is `sched_off` off it); the times the scheduler keeps, as shown."""
    job = placed_job()
    job["workers"][0]["placed_at"] = T + sched_off  # type: ignore[index]
    real_start, real_end = T + timedelta(seconds=5), T + timedelta(minutes=20, seconds=5)
    common = {"job_id": "j", "worker": 0, "placement_id": "p", "minion_id": "n"}
    begun = WorkerStarted(**common, started_at=real_start + agent_off)
    started(job, begun, received=real_start + timedelta(milliseconds=50))
    done = WorkerFinished(
        **common,
        state=WorkerState.finished,
        exit_code=0,
        started_at=real_start + agent_off,
        ended_at=real_end + agent_off,
    )
    finished(job, done, real_end + timedelta(milliseconds=50), Applied())
    w = job["workers"][0]  # type: ignore[index]
    return seconds(w["started_at"], w["ended_at"])


def test_a_run_time_shown_whatever_the_agents_clock() -> None:
    """Issue 16: an agent an hour behind had every run under an hour shown as 0 s (its end
    clamped up to the start); its own start and end give the length, the offset cancels."""
    for off in (timedelta(0), H, -H, timedelta(seconds=-30)):
        shown = run(off)
        assert shown is not None and 1195 <= shown <= 1205, (off, shown)


def test_a_run_time_shown_with_the_schedulers_clock_ahead() -> None:
    """placed_at an hour after the start's receipt: not a bound (it would erase the run)."""
    shown = run(timedelta(0), sched_off=H)
    assert shown is not None and 1195 <= shown <= 1205
