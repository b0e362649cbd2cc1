"""The worker runtime port: how a placement's worker is run, watched, stopped and found
again after a restart. The worker manager (worker/manager.py) keeps the state in the
worker's directory, runs the steps the runtime declares (`steps`: what its workers need
before they run, worker/pipeline.py) and reports; a runtime only runs the worker and writes
the files of the supervisor protocol (`supervise.py`): `started.json` when it runs, `log`,
and `exit.json` when it has ended.

Two implementations, chosen per worker by the runtime policy (policy.py):

- `podman` (default): each worker in its own OCI container; podman pulls, builds and
  mounts the images, and crun or runc starts the containers under the worker's shell
  supervisor (`runc.py`) or, where they cannot, `podman run` does (`podman.py`).
- `process` (the operator's opt-in for the node owner's own jobs): a bare host process under
  a tiny shell supervisor (`process.py`; `supervise.py`).

A runtime hears of a worker's end as it happens (procwatch.py) and then calls `notify`, so
the manager reports it at once rather than at its next periodic round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..steps.base import Step
    from ..worker.workdir import Worker


class WorkerRuntime(Protocol):
    """What the worker manager needs of a runtime. Every method but `launch` and `poll` is
    quick and does not block on the runtime: slow work (podman calls) happens in `poll`,
    once per round. The manager hands a worker to `alive`, `request_stop`, `poll` only once
    it is launched."""

    name: str
    pulls_images: bool  # runs a job's own image (StartWorker.image), pulling it first
    lost_at_restart: str  # the reason of a worker `reattach` could not find
    lost_at_runtime: str  # the reason of a worker `alive` stopped seeing without exit.json

    @property
    def steps(self) -> Sequence[Step]:
        """What its workers need before they run, in order (the manager runs them)."""

    async def launch(self, w: Worker) -> None:
        """Start the worker (its steps are set up; env.json holds its env values, which the
        runtime deletes once handed over). Raises WorkerFailed when it could not even begin;
        a command that cannot be executed is an end (exit.json), not a failure to launch."""

    def launched(self, w: Worker) -> bool:
        """Was it handed to the runtime (it counts as running until exit.json)? Its files
        say, so a restarted agent knows too."""

    def alive(self, w: Worker) -> bool:
        """May it still write exit.json? False only when the runtime knows it is gone."""

    def request_stop(self, w: Worker) -> None:
        """`stop_requested` is written: stop it (exit.json then records `stopped`)."""

    def reattach(self, w: Worker) -> bool:
        """After an agent restart, for a launched worker without exit.json: is it still
        there?"""

    def kill_orphan(self, w: Worker) -> None:
        """It is being reported lost: end whatever of it may still hold GPUs (its steps'
        teardown then releases what they made)."""

    notify: Callable[[], None]  # set by the manager: call it when a worker has news

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        """Once per watch round, before the workers' files are read; `full`: the periodic
        safety-net round (check everything, even without news)."""
