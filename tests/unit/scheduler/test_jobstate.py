from gpufleet_contracts.jobs import JobState, WorkerState
from gpufleet_scheduler.jobstate import job_state

W = WorkerState


def test_states_follow_workers() -> None:
    assert job_state([W.waiting], False) is JobState.queued
    assert job_state([W.placed], False) is JobState.starting
    assert job_state([W.running, W.waiting], False) is JobState.running
    assert job_state([W.finished, W.waiting], False) is JobState.running
    assert job_state([W.finished, W.finished], False) is JobState.finished
    assert job_state([W.finished, W.failed], False) is JobState.failed
    assert job_state([W.stopped], False) is JobState.stopped


def test_cancelled_job_is_stopped_once_every_worker_ended() -> None:
    assert job_state([W.running], True) is JobState.running
    assert job_state([W.stopped, W.finished], True) is JobState.stopped
