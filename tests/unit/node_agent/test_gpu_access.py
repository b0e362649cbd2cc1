"""Node agent: how real GPUs reach a container (gpu_access) and a share's MPS (mps), as data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from gpufleet_node_agent.host import mps
from gpufleet_node_agent.host.gpu_access import (
    CONTROL_DEVICES,
    GpuAccess,
    HostGpu,
    cdi_installed,
    choose_mode,
    driver_files,
    find_driver_dir,
)
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_spec, run_argv
from gpufleet_node_agent.worker.spec import WorkerSpec

GPUS = {0: HostGpu(0, 0, "GPU-0000", 81559), 1: HostGpu(1, 4, "GPU-1111", 81559)}


def test_device_nodes_are_the_workers_own_by_minor_number_plus_the_control_devices() -> None:
    access = GpuAccess("devices", GPUS)
    assert access.devices([1]) == ["/dev/nvidia4", *CONTROL_DEVICES]
    assert access.devices([]) == []  # a worker without GPUs gets no GPU device at all
    with pytest.raises(KeyError, match="not on this node"):
        access.devices([2])


def test_cdi_names_each_gpu_by_uuid_and_binds_no_library_itself() -> None:
    access = GpuAccess("cdi", GPUS, driver_files(Path("/nonexistent")))
    assert access.devices([0, 1]) == ["nvidia.com/gpu=GPU-0000", "nvidia.com/gpu=GPU-1111"]
    assert access.library_binds([0]) == [] and access.env([0]) == {}


def test_simulated_gpus_reach_no_device() -> None:
    none = GpuAccess.none()
    assert (none.real, none.devices([0, 1]), none.env([0])) == (False, [], {})


def test_driver_files_are_the_driver_libraries_only_each_behind_its_soname(tmp_path: Path) -> None:
    real = tmp_path / "libcuda.so.580.159.04"
    real.write_bytes(b"")
    (tmp_path / "libcuda.so.1").symlink_to(real.name)
    (tmp_path / "libnvidia-gpucomp.so.580.159.04").write_bytes(b"")
    (tmp_path / "libnvidia-ml.so.1").write_bytes(b"")
    (tmp_path / "libssl.so.3").write_bytes(b"")  # a host library: never given to a job
    (tmp_path / "libnvidia-ptxjitcompiler.so.1").symlink_to("gone")  # dangling: skipped
    found = {b.target: b.host for b in driver_files(tmp_path)}
    assert found == {
        "/usr/local/nvidia/lib64/libcuda.so.1": real,
        "/usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.159.04": tmp_path
        / "libnvidia-gpucomp.so.580.159.04",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1": tmp_path / "libnvidia-ml.so.1",
    }
    assert find_driver_dir([tmp_path / "none", tmp_path]) == tmp_path


def test_auto_prefers_cdi_when_its_spec_is_installed(tmp_path: Path) -> None:
    assert not cdi_installed([tmp_path])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert cdi_installed([tmp_path])
    assert choose_mode("auto", cdi=True) == "cdi"
    assert choose_mode("auto", cdi=False) == "devices"
    assert choose_mode("devices", cdi=True) == "devices"
    with pytest.raises(ValueError, match="GPUFLEET_GPU_ACCESS"):
        choose_mode("all", cdi=False)


def test_a_share_tells_its_own_daemon_its_sms_and_memory_then_starts_its_server() -> None:
    assert mps.share_commands("0.5", 40779, 10000) == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 40779M",
        "start_server -uid 10000",
    ]
    assert mps.thread_percentage("0.001") == 1 and mps.thread_percentage(1) == 100


def test_a_shares_container_gets_its_pipes_and_nothing_else_of_mps(tmp_path: Path) -> None:
    spec: dict[str, Any] = {
        "placement_id": "pl-9",
        "job_id": "j",
        "worker": 0,
        "command": ["true"],
        "gpu_indices": [1],
        "gpu_fraction": "0.5",
        "gpu_memory_limit_mb": 40779,
    }
    pipe = tmp_path / "mps" / "pl-9" / "pipe"
    c = container_spec(
        WorkerSpec.model_validate(spec),
        tmp_path,
        "m",
        PodmanConfig(),
        gpu=GpuAccess("devices", GPUS),
        mps_pipe=pipe,
    )
    argv = run_argv(c)
    assert f"{pipe}:{mps.MPS_TARGET}:rw" in argv
    assert c.env["CUDA_MPS_PIPE_DIRECTORY"] == mps.MPS_TARGET
    assert c.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # a client may only lower it
    assert c.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_without_the_mps_control_daemon_a_share_does_not_run(tmp_path: Path) -> None:
    daemons = mps.Mps(tmp_path, None, 10000)
    error = daemons.start("pl-1", "GPU-0000", "0.5", 1000)
    assert error is not None and "cannot be enforced" in error
    (tmp_path / "pl-old" / "pipe").mkdir(parents=True)
    (tmp_path / "pl-live" / "pipe").mkdir(parents=True)
    daemons.sweep(["pl-live"])  # after a restart: the shares whose worker is gone
    assert daemons.placements() == ["pl-live"]
    assert mps.find_control(str(tmp_path / "missing")) is None
    exe = tmp_path / "nvidia-cuda-mps-control"
    exe.write_text("#!/bin/sh\n")
    os.chmod(exe, 0o755)
    assert mps.find_control(str(exe)) == str(exe)


def test_the_path_to_a_shares_pipes_must_be_searchable_by_the_workers_user(
    tmp_path: Path,
) -> None:
    """Checking makes nothing: a directory not made yet is skipped, a 0700 one is named."""
    closed = tmp_path / "state"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    target = closed / "mps"
    assert mps.closed_ancestor(target) == closed
    assert not target.exists()
    os.chmod(closed, 0o711)
    above = mps.closed_ancestor(target)  # pytest's own temporary directories are 0700
    assert above is None or above in tmp_path.parents or above == tmp_path
