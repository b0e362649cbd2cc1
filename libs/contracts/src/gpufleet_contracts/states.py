"""A job's type and the states of a job and of its workers (R-JOB-8), and money."""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated

from pydantic import Field


class JobType(StrEnum):
    notebook = "notebook"
    training = "training"
    inference = "inference"
    endpoint = "endpoint"


class JobState(StrEnum):
    """R-JOB-8. `queued` is shown to users as "waiting for GPUs" ("for CPUs": a CPU-only job)."""

    queued = "queued"
    starting = "starting"
    running = "running"
    uploading = "uploading"
    finished = "finished"
    failed = "failed"
    stopped = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (JobState.finished, JobState.failed, JobState.stopped)


class WorkerState(StrEnum):
    waiting = "waiting"  # no GPUs yet; costs nothing (R-JOB-5)
    placed = "placed"  # GPUs reserved, the node was told to start it
    running = "running"
    uploading = "uploading"  # its command ended, its output is being put (still billed)
    finished = "finished"
    failed = "failed"
    stopped = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (WorkerState.finished, WorkerState.failed, WorkerState.stopped)


Money = Annotated[Decimal, Field(max_digits=18, decimal_places=6)]
