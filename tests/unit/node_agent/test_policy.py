"""Node agent: the runtime policy (issue 14: no job of another account ever runs outside a
container; bare processes only for the node owner's own jobs, on the operator's opt-in)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import StartWorker, WorkerFinished, WorkerState
from gpufleet_node_agent.__main__ import adopt_owner
from gpufleet_node_agent.runtimes.policy import Decision, RuntimePolicy
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.settings import AgentSettings
from gpufleet_node_agent.steps.base import Step
from gpufleet_node_agent.worker.manager import WorkerManager
from gpufleet_node_agent.worker.workdir import Worker
from pydantic import ValidationError

from .test_workers import FakeBroker, until

PY = sys.executable


def job(owner: str | None, creator: str | None = None, placement: str = "pl-1") -> StartWorker:
    return StartWorker(
        minion_id="m1",
        job_id="job-1",
        job_name="demo",
        worker=0,
        command=[PY, "-c", "print('hi')"],
        gpu_indices=[0],
        placement_id=placement,
        owner=owner,
        creator=owner if creator is None else creator,
    )


@pytest.mark.parametrize(
    ("allow", "owner", "creator", "expected"),
    [
        (True, "acme", "acme", "process"),  # the owner's own job, opted in
        (False, "acme", "acme", "podman"),  # not opted in: a container
        (True, "other", "other", "podman"),  # another account's job: always a container
        (True, "acme", "other", "podman"),  # federated: another account's command
        (True, "other", "acme", "podman"),
        (True, None, None, "podman"),  # an older scheduler's command: not the owner's
    ],
)
def test_containers_unless_the_owners_own_job_and_opted_in(
    allow: bool, owner: str | None, creator: str | None, expected: str
) -> None:
    policy = RuntimePolicy(node_owner="acme", allow_bare=allow)
    cmd = job(owner, creator or "")
    if creator is None:
        cmd = cmd.model_copy(update={"creator": None})
    assert policy.choose(cmd) == Decision(expected)


def test_without_a_container_runtime_another_accounts_job_is_refused() -> None:
    policy = RuntimePolicy("acme", allow_bare=True, container_error="podman is not installed")
    assert policy.choose(job("acme")) == Decision("process")
    refused = policy.choose(job("other"))
    assert refused.runtime is None
    assert refused.refused is not None
    assert "never runs outside a container" in refused.refused
    assert "podman is not installed" in refused.refused
    own = RuntimePolicy("acme", container_error="podman is not installed").choose(job("acme"))
    assert own.runtime is None and "GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs" in str(own.refused)


def test_settings_default_to_containers_and_refuse_the_old_process_runtime() -> None:
    s = AgentSettings(minion_id="m1")
    assert (s.worker_runtime, s.allow_bare_processes) == ("podman", "no")
    assert AgentSettings(minion_id="m1", allow_bare_processes="own-jobs").allow_bare_processes
    assert AgentSettings(minion_id="m1", allow_bare_processes="0").allow_bare_processes == "no"
    with pytest.raises(ValidationError, match="GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs"):
        AgentSettings(minion_id="m1", worker_runtime="process")
    with pytest.raises(ValidationError):
        AgentSettings(minion_id="m1", allow_bare_processes="everyone")


def test_the_node_owner_is_the_enrolments_account() -> None:
    s = AgentSettings(minion_id="m1", account="local")
    adopt_owner(s, None)
    assert s.account == "local"
    adopt_owner(s, "acme")
    assert s.account == "acme"


class FakeContainers:
    """A container runtime that records what it was handed and never runs anything."""

    name = "podman"
    pulls_images = False
    steps: tuple[Step, ...] = ()
    lost_at_restart = "gone at restart"
    lost_at_runtime = "gone"

    def __init__(self) -> None:
        self.launched_ids: list[str] = []
        self.notify: Callable[[], None] = lambda: None

    async def launch(self, w: Worker) -> None:
        self.launched_ids.append(w.placement_id)
        w.file("launched").touch()

    def launched(self, w: Worker) -> bool:
        return w.file("launched").exists()  # as a runtime's own files say

    def alive(self, w: Worker) -> bool:
        return True

    def request_stop(self, w: Worker) -> None:
        pass

    def reattach(self, w: Worker) -> bool:
        return True

    def kill_orphan(self, w: Worker) -> None:
        pass

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        pass


def manager(tmp_path: Path, broker: FakeBroker, policy: RuntimePolicy, **kw: Any) -> Any:
    containers = FakeContainers()
    m = WorkerManager(
        tmp_path,
        "m1",
        broker,
        gpu_indices=[0, 1],
        runtime=containers,
        others=[ProcessRuntime()],
        policy=policy,
        **kw,
    )
    return m, containers


async def test_the_manager_runs_each_worker_where_the_policy_says(tmp_path: Path) -> None:
    broker = FakeBroker()
    m, containers = manager(tmp_path, broker, RuntimePolicy("acme", allow_bare=True))
    assert m.start(job("other", placement="theirs"))
    assert m.start(job("acme", placement="mine"))
    assert containers.launched_ids == ["theirs"]  # only another account's job
    mine = m.active["mine"]
    assert (mine.runtime, (mine.dir / "supervisor.pid").exists()) == ("process", True)
    await until(m, lambda: "mine" not in m.active)
    (done,) = broker.events(WorkerFinished)
    assert (done.placement_id, done.state) == ("mine", WorkerState.finished)
    # A restarted manager finds each worker with the runtime its spec.json names.
    again, _ = manager(tmp_path, FakeBroker(), RuntimePolicy("acme", allow_bare=True))
    found = again.recover()
    assert found.reattached == ["theirs"]
    assert again.active["theirs"].runtime == "podman"


async def test_a_refused_worker_is_reported_failed_with_the_reason(tmp_path: Path) -> None:
    broker = FakeBroker()
    policy = RuntimePolicy("acme", allow_bare=True, container_error="podman is not installed")
    m, containers = manager(tmp_path, broker, policy)
    assert not m.start(job("other"))
    assert containers.launched_ids == []
    assert not (m.worker_dir("pl-1") / "supervisor.pid").exists()  # never ran bare
    await until(m, lambda: not m.active)
    (done,) = broker.events(WorkerFinished)
    assert done.state == WorkerState.failed
    assert done.reason is not None and "never runs outside a container" in done.reason
