"""The step pipeline (worker/pipeline.py): a worker's steps set up in order, then its launch,
as one task per worker; torn down in reverse, in one place, before its end is reported;
after an agent restart, only the steps without a done-marker run again. No NATS, no podman:
steps and a runtime that write down what they are asked."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import Mount, MountKind, StartWorker, WorkerFinished, WorkerState
from gpufleet_contracts.locations import S3Source, Source
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.staging.registry import Fetchers, Transfer
from gpufleet_node_agent.steps.base import Step, StepName, WorkerFailed
from gpufleet_node_agent.steps.inputs import InputsStep
from gpufleet_node_agent.worker.manager import WorkerManager
from gpufleet_node_agent.worker.pipeline import MARKERS
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

from .test_workers import FakeBroker, cmd, finished, until

PY = sys.executable


class Noted:
    """What the steps, the runtime and the broker were asked, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


class FakeStep:
    def __init__(
        self,
        noted: Noted,
        name: StepName,
        *,
        marked: bool = True,
        fail: str | None = None,
        wait: asyncio.Event | None = None,
        made: str | None = None,
    ) -> None:
        self.noted, self.name, self.marked = noted, name, marked
        self.fail, self.wait, self.made = fail, wait, made
        self.dies = False  # the agent is killed while this step waits: nothing more happens

    async def setup(self, w: Worker) -> None:
        self.noted.calls.append(f"setup {self.name}")
        if self.wait is not None:
            await self.wait.wait()
            if self.dies:
                raise asyncio.CancelledError
        if self.fail is not None:
            raise WorkerFailed(self.fail)
        if self.made is not None:
            w.made[self.name] = self.made

    async def teardown(self, w: Worker) -> None:
        self.noted.calls.append(f"teardown {self.name}")


class FakeRuntime:
    """Launches nothing: `started.json`, and a note of what its launch was given."""

    name = "fake"
    pulls_images = False
    lost_at_restart = "gone at restart"
    lost_at_runtime = "gone"

    def __init__(self, noted: Noted, steps: Sequence[Step]) -> None:
        self.noted = noted
        self.steps = tuple(steps)
        self.notify: Callable[[], None] = lambda: None
        self.launched_with: dict[str, dict[str, str]] = {}

    async def launch(self, w: Worker) -> None:
        self.noted.calls.append("launch")
        self.launched_with[w.placement_id] = dict(w.made)
        w.file("started.json").write_text(json.dumps({"pid": None, "started_at": "2026-01-01"}))

    def launched(self, w: Worker) -> bool:
        return w.file("started.json").exists()

    def alive(self, w: Worker) -> bool:
        return True

    def request_stop(self, w: Worker) -> None:
        self.noted.calls.append("request_stop")

    def reattach(self, w: Worker) -> bool:
        self.noted.calls.append("reattach")
        return True

    def kill_orphan(self, w: Worker) -> None:
        pass

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        pass


class NotingBroker(FakeBroker):
    def __init__(self, noted: Noted) -> None:
        super().__init__()
        self.noted = noted

    async def publish(self, message: bytes, subject: str, **kw: Any) -> None:
        await super().publish(message, subject, **kw)
        if kw["headers"]["ce-type"] == WorkerFinished.TYPE:
            self.noted.calls.append("reported")


def manager(tmp_path: Path, noted: Noted, steps: Sequence[Step]) -> tuple[WorkerManager, Any]:
    broker = NotingBroker(noted)
    rt = FakeRuntime(noted, steps)
    return WorkerManager(tmp_path, "m1", broker, gpu_indices=[0, 1], runtime=rt), broker


def end(m: WorkerManager, placement: str, code: int = 0) -> None:
    """What a runtime writes when its worker has ended."""
    ended = {"exit_code": code, "ended_at": "2026-01-01T00:00:01+00:00"}
    m.worker_dir(placement).joinpath("exit.json").write_text(json.dumps(ended))
    m.wake()


async def test_steps_run_in_order_then_the_launch_and_come_down_in_reverse_before_the_report(
    tmp_path: Path,
) -> None:
    noted = Noted()
    names = (StepName.keys, StepName.image, StepName.disk, StepName.inputs)
    m, broker = manager(tmp_path, noted, [FakeStep(noted, n) for n in names])
    assert m.start(cmd())
    await until(m, lambda: "launch" in noted.calls)
    end(m, "pl-1")
    evt = await finished(m, broker, "pl-1")
    assert evt.state == WorkerState.finished
    assert noted.calls == [
        "setup keys",
        "setup image",
        "setup disk",
        "setup inputs",
        "launch",
        "teardown inputs",
        "teardown disk",
        "teardown image",
        "teardown keys",
        "reported",
    ]


async def test_a_failed_step_fails_the_worker_with_its_reason_and_everything_comes_down(
    tmp_path: Path,
) -> None:
    noted = Noted()
    steps = [
        FakeStep(noted, StepName.keys),
        FakeStep(noted, StepName.image, fail="cannot pull image x: unauthorized"),
        FakeStep(noted, StepName.disk),
    ]
    m, broker = manager(tmp_path, noted, steps)
    assert m.start(cmd())  # on its way: its end is reported
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.reason) == (WorkerState.failed, "cannot pull image x: unauthorized")
    assert noted.calls == [
        "setup keys",
        "setup image",
        "teardown disk",  # safe on what was never set up
        "teardown image",
        "teardown keys",
        "reported",
    ]
    assert broker.events(WorkerFinished)[0].started_at is None  # never launched


async def test_a_stop_during_the_setup_stops_it_before_its_launch(tmp_path: Path) -> None:
    noted = Noted()
    pulling = asyncio.Event()
    steps = [FakeStep(noted, StepName.image, wait=pulling), FakeStep(noted, StepName.disk)]
    m, broker = manager(tmp_path, noted, steps)
    assert m.start(cmd())
    assert m.running() == ["job-1/0"]  # being set up counts as running
    m.stop("job-1", 0, "pl-1", "cancelled by user")
    pulling.set()
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.reason) == (WorkerState.stopped, "cancelled by user")
    assert "launch" not in noted.calls and "setup disk" not in noted.calls
    assert "request_stop" not in noted.calls  # nothing of it was the runtime's yet


async def test_after_a_restart_only_the_steps_without_a_done_marker_run_again(
    tmp_path: Path,
) -> None:
    noted = Noted()
    disk_made = asyncio.Event()
    first_disk = FakeStep(noted, StepName.disk, wait=disk_made)
    steps = [
        FakeStep(noted, StepName.keys, marked=False),
        FakeStep(noted, StepName.image, made="localhost/gpufleet/pkgs:abc"),
        first_disk,
        FakeStep(noted, StepName.share),
    ]
    first, _ = manager(tmp_path, noted, steps)
    assert first.start(cmd())
    await asyncio.sleep(0)
    assert noted.calls == ["setup keys", "setup image", "setup disk"]
    d = first.worker_dir("pl-1")
    assert d.joinpath(MARKERS).read_text() == "image\tlocalhost/gpufleet/pkgs:abc\n"
    first_disk.dies = True  # kill -9 of the agent while the disk is being made
    disk_made.set()
    await asyncio.sleep(0)

    again = Noted()
    names = (StepName.keys, StepName.image, StepName.disk, StepName.share)
    restarted, _ = manager(tmp_path, again, [FakeStep(again, n, marked=n != "keys") for n in names])
    found = restarted.recover()
    assert found.reattached == ["pl-1"]
    await until(restarted, lambda: "launch" in again.calls)
    # keys keep no marker (they find their work done); the image's is there; the disk's not
    assert again.calls == ["setup keys", "setup disk", "setup share", "launch"]
    rt = restarted.runtime
    assert isinstance(rt, FakeRuntime)
    assert rt.launched_with["pl-1"] == {"image": "localhost/gpufleet/pkgs:abc"}  # what it made
    assert d.joinpath(MARKERS).read_text().splitlines() == [
        "image\tlocalhost/gpufleet/pkgs:abc",
        "disk",
        "share",
    ]
    # launched: a further restart re-attaches it to its runtime and runs no step again
    later = Noted()
    third, _ = manager(tmp_path, later, [FakeStep(later, n) for n in names])
    assert third.recover().reattached == ["pl-1"]
    assert later.calls == ["reattach"]


async def test_a_bare_worker_is_launched_before_start_returns(tmp_path: Path) -> None:
    """Its steps wait on nothing: the pipeline's task never needs to start."""
    broker = FakeBroker()
    m = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0], runtime=ProcessRuntime())
    assert m.start(cmd(command=[PY, "-c", "print('up')"]))
    d = m.worker_dir("pl-1")
    assert d.joinpath("supervisor.pid").exists() and d.joinpath("output").is_dir()
    assert not d.joinpath(MARKERS).exists()  # its steps keep no done-marker
    evt = await finished(m, broker, "pl-1")
    assert (evt.state, evt.log_tail) == (WorkerState.finished, "up\n")


# --- staging: the inputs step and the fetchers' registry --------------------------------


def staged(tmp_path: Path, source: Source) -> Worker:
    mount = Mount(target="/opt/ml/input", kind=MountKind.input, source=source, env="ML_DATA_PATH")
    spec = WorkerSpec(placement_id="p", job_id="j", worker=0, command=("true",), mounts=(mount,))
    return Worker(spec, tmp_path)


async def test_a_source_a_fetcher_takes_is_fetched_into_its_mounts_directory(
    tmp_path: Path,
) -> None:
    fetched: list[tuple[Source, Path]] = []

    async def fetch(source: Source, dest: Path, t: Transfer) -> None:
        fetched.append((source, dest))
        (dest / "data.csv").write_text("a,b\n")

    step = InputsStep(lambda w: [], Fetchers({"s3": fetch}))
    w = staged(tmp_path, S3Source(url="s3://bucket/data"))
    await step.setup(w)
    assert fetched == [(S3Source(url="s3://bucket/data"), tmp_path / "mnt/opt/ml/input")]
    assert (tmp_path / "mnt/opt/ml/input/data.csv").read_text() == "a,b\n"
    assert step.marked  # what a fetcher brought is not fetched again after a restart


async def test_without_a_fetcher_a_source_leaves_its_directory_empty_unless_strict(
    tmp_path: Path,
) -> None:
    """Today's node: no fetcher at all. Jobs with data run on empty directories, as before
    staging; a strict inputs step fails such a worker with a reason instead."""
    w = staged(tmp_path, S3Source(url="s3://bucket/data"))
    lenient = InputsStep(lambda w: [tmp_path / "mnt/opt/ml/input"], strict=False)
    await lenient.setup(w)
    assert list((tmp_path / "mnt/opt/ml/input").iterdir()) == []
    assert not lenient.marked
    with pytest.raises(WorkerFailed, match="this node cannot fetch s3 sources"):
        await InputsStep(lambda w: []).setup(w)  # strict: the node's


# --- spec.json an older agent wrote ------------------------------------------------------


def test_an_older_agents_spec_json_is_read_as_a_typed_spec(tmp_path: Path) -> None:
    from gpufleet_node_agent.worker import spec as specs

    old = {  # as an agent before typed locations wrote it
        "placement_id": "pl-7",
        "job_id": "job-7",
        "job_name": "train",
        "worker": 1,
        "command": ["python", "train.py"],
        "env_names": ["TOKEN"],
        "gpu_indices": [0],
        "gpu_uuids": [],
        "received_at": "2026-11-20T10:00:00+00:00",
        "mounts": [
            {"target": "/opt/ml/input/a", "kind": "dataset", "source": "public dataset:A b"},
            {"target": "/opt/ml/input", "kind": "dataset", "source": "datasets"},
            {"target": "/opt/ml/models", "kind": "model", "source": "git:https://h/m.git"},
            {"target": "/opt/ml/output", "kind": "output", "source": "worker", "read_only": False},
        ],
        "output_archive": "train_1.zip",
        "output_upload": "gcp:gs://b/out",
        "gpu_fraction": "0.5",
        "gpu_memory_limit_mb": 1000,
        "cpu_count": None,
        "image": None,
        "disk_size_gb": 10,
        "base_environment": None,
        "packages": {"apt": [], "conda": [], "requirements": [], "pip": ["numpy"]},
        "owner": "acme",
        "creator": "acme",
        "runtime": "podman",
        "key_types": ["wandb"],
    }
    (tmp_path / "spec.json").write_text(json.dumps(old))
    spec = specs.read(tmp_path)
    assert spec is not None
    assert [m.source.model_dump() if m.source else None for m in spec.mounts] == [
        {"kind": "platform", "asset": "dataset", "name": "A b", "public": True},
        None,
        {"kind": "git", "url": "https://h/m.git"},
        None,
    ]
    assert spec.output is not None and spec.output.model_dump() == {
        "kind": "gcs",
        "url": "gs://b/out",
    }
    assert (spec.runtime, spec.command, spec.key_types) == (
        "podman",
        ("python", "train.py"),
        ("wandb",),
    )
    assert str(spec.gpu_fraction) == "0.5" and spec.packages.pip == ["numpy"]
    # and what this agent writes reads back as it was
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    assert specs.read(tmp_path) == spec


def test_the_oldest_spec_json_a_bare_worker_had_still_reads(tmp_path: Path) -> None:
    """Before runtimes were chosen per worker: no `runtime` (a bare process, or podman's
    when its marker is there), and a stop's tombstone with `command` null."""
    from gpufleet_node_agent.worker import spec as specs

    tomb = {"placement_id": "p", "job_id": "j", "worker": 0, "command": None}
    (tmp_path / "spec.json").write_text(json.dumps(tomb))
    spec = specs.read(tmp_path)
    assert spec is not None and (spec.runtime, spec.command) == ("process", ())
    (tmp_path / "container.json").write_text("{}")
    again = specs.read(tmp_path)
    assert again is not None and again.runtime == "podman"


def test_a_spec_json_that_a_tightened_rule_refuses_loses_that_field_not_the_worker(
    tmp_path: Path,
) -> None:
    from gpufleet_node_agent.worker import spec as specs

    spec = WorkerSpec(placement_id="p", job_id="j", worker=0, command=("true",))
    written = json.loads(spec.model_dump_json())
    written["packages"]["pip"] = ["numpy @ https://example.com/numpy.whl"]  # refused now
    (tmp_path / "spec.json").write_text(json.dumps(written))
    read = specs.read(tmp_path)
    assert read is not None and read.packages.empty() and read.command == ("true",)
    written["worker"] = "one"  # what a running worker needs: the worker is skipped, logged
    (tmp_path / "spec.json").write_text(json.dumps(written))
    assert specs.read(tmp_path) is None


async def test_an_older_agents_worker_is_reattached_with_its_spec_upgraded(
    tmp_path: Path,
) -> None:
    """A bare worker an older agent started: its spec.json in the old format, its supervisor
    still running; the restarted agent re-attaches it and reports its end."""
    broker = FakeBroker()
    first = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0], runtime=ProcessRuntime())
    code = "import time; time.sleep(0.5); print('done')"
    assert first.start(cmd(command=[PY, "-c", code]))
    d = first.worker_dir("pl-1")
    new = json.loads(d.joinpath("spec.json").read_text())
    old = {k: v for k, v in new.items() if k not in ("format", "output")}
    old["mounts"] = [{"target": "/opt/ml/output", "kind": "output", "source": "worker"}]
    old["output_upload"] = None
    d.joinpath("spec.json").write_text(json.dumps(old))
    restarted = WorkerManager(tmp_path, "m1", broker, gpu_indices=[0], runtime=ProcessRuntime())
    assert restarted.recover().reattached == ["pl-1"]
    evt = await finished(restarted, broker, "pl-1")
    assert (evt.state, evt.log_tail) == (WorkerState.finished, "done\n")


def test_a_start_worker_from_an_older_scheduler_reads_as_typed(tmp_path: Path) -> None:
    c = cmd().model_dump(mode="json")
    c["mounts"] = [{"target": "/opt/ml/input", "kind": "input", "source": "aws:s3://b/in"}]
    c["output_upload"] = "platform:model"
    typed = StartWorker.model_validate(c)
    assert typed.mounts[0].source == S3Source(url="s3://b/in")
    assert typed.output is not None and typed.output.model_dump() == {
        "kind": "platform",
        "asset": "model",
        "name": None,
        "public": False,
    }
    assert "output_upload" not in (typed.model_extra or {})
