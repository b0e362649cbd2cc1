"""Node agent: where an OCI container's bundle lives (runc.py), as files in a temporary
directory: on the runtimes' tmpfs, apart from the worker's directory, and its config.json
(the job's env values) deleted once the container exists, also where an older agent wrote
it (in the worker's directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet_node_agent.runtimes.runc import Runc
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker


async def _no_podman(*args: str, **kw: Any) -> tuple[int, bytes, bytes]:
    raise AssertionError("podman is not needed here")


def _runc(tmp_path: Path) -> Runc:
    return Runc(
        _no_podman,
        10000,
        root=tmp_path / "runc",
        crun=True,
        crun_root=tmp_path / "crun",
        bundles=tmp_path / "bundles",
    )


def _worker(tmp_path: Path) -> Worker:
    w = Worker(
        WorkerSpec(placement_id="p-1", job_id="job-1", worker=0), tmp_path / "workers" / "p-1"
    )
    w.dir.mkdir(parents=True)
    (w.dir / "runc.json").write_text(json.dumps({"name": "c", "image": "i", "runtime": "crun"}))
    return w


def test_the_bundle_is_apart_from_the_worker_directory_and_named_for_its_container(
    tmp_path: Path,
) -> None:
    runc = _runc(tmp_path)
    w = _worker(tmp_path)
    assert runc.bundle(w) == tmp_path / "bundles" / runc.name(w)
    assert not runc.bundle(w).is_relative_to(w.dir)


def test_the_config_is_deleted_once_the_container_exists(tmp_path: Path) -> None:
    runc = _runc(tmp_path)
    w = _worker(tmp_path)
    config = runc.bundle(w) / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"process": {"env": ["TOKEN=secret"]}}')
    (tmp_path / "crun" / runc.name(w)).mkdir(parents=True)
    (tmp_path / "crun" / runc.name(w) / "status").write_text("created")  # crun has read it
    runc.forget_config(w)
    assert not config.exists()


def test_an_older_agents_config_in_the_worker_directory_is_deleted_too(tmp_path: Path) -> None:
    runc = _runc(tmp_path)
    w = _worker(tmp_path)
    legacy = w.dir / "bundle" / "config.json"
    legacy.parent.mkdir()
    legacy.write_text('{"process": {"env": ["TOKEN=secret"]}}')
    runc.forget_config(w)  # its supervisor is gone (no supervisor.pid): read or never will be
    assert not legacy.exists()
