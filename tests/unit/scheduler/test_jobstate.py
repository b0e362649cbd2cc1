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


def test_a_job_is_uploading_once_its_workers_are_uploading_or_ended() -> None:
    assert job_state([W.uploading], False) is JobState.uploading
    assert job_state([W.uploading, W.finished], False) is JobState.uploading
    assert job_state([W.uploading, W.failed], False) is JobState.uploading
    # another still runs, is placed or waits: the job runs
    assert job_state([W.uploading, W.running], False) is JobState.running
    assert job_state([W.uploading, W.placed], False) is JobState.running
    assert job_state([W.uploading, W.waiting], False) is JobState.running
    # an upload is not an end: a cancel waits for it, and it is no terminal state
    assert job_state([W.uploading], True) is JobState.uploading
    assert not W.uploading.terminal and not JobState.uploading.terminal
    assert job_state([W.finished], False) is JobState.finished
