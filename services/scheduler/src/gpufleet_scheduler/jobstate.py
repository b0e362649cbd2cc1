"""A job's state follows from its workers' states (R-JOB-8); pure."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet_contracts.jobs import JobState, WorkerState

ACTIVE = (WorkerState.running, WorkerState.uploading)


def job_state(workers: Iterable[WorkerState], cancel_requested: bool) -> JobState:
    states = list(workers)
    if all(s.terminal for s in states):
        if cancel_requested:
            return JobState.stopped
        if any(s is WorkerState.failed for s in states):
            return JobState.failed
        if all(s is WorkerState.stopped for s in states):
            return JobState.stopped
        return JobState.finished
    if all(s.terminal or s is WorkerState.uploading for s in states):
        return JobState.uploading  # the commands ended; an output is still being put
    if any(s in ACTIVE for s in states) or any(s.terminal for s in states):
        return JobState.running
    if any(s is WorkerState.placed for s in states):
        return JobState.starting
    return JobState.queued
