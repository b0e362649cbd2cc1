"""The GPU check process (gpucheck.py): NVML's facts per GPU, CUDA's proof (a stand-in
driver), GPUs in use left alone, simulated GPUs and a machine without a driver said so;
and the module run as the agent runs it, here (no driver on this machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.verification import GpuCheck
from gpufleet_node_agent import gpucheck
from gpufleet_node_agent.host import inventory as inv_mod
from gpufleet_node_agent.host.cuda import GIB, CudaUnavailable, Driver

from .test_cuda import FakeCuda, FakeGpu
from .test_inventory import fake_pynvml

UUIDS = [
    "GPU-5d2b3c1e-0f4a-4b7e-9c11-2a3b4c5d6e7f",
    "GPU-6e3c4d2f-1a5b-4c8f-8d22-3b4c5d6e7f80",
    "GPU-7f4d5e3a-2b6c-4d9a-9e33-4c5d6e7f8091",
]
DEVICES = [
    {"name": "NVIDIA H100 80GB HBM3", "uuid": u, "mem_mb": 81559, "used_mb": 0}
    | {"gen": 5, "width": 16, "mig": 0, "util": 0, "temp": 30, "power_mw": 70000}
    for u in UUIDS
]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    fake = fake_pynvml(DEVICES)
    fake.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(
        busId=f"00000000:{0x3B + h:02X}:00.0".encode()
    )
    monkeypatch.setattr(inv_mod, "pynvml", fake)
    monkeypatch.setattr(gpucheck, "pynvml", fake)
    return fake


def cuda(**kw: Any) -> FakeCuda:
    return FakeCuda(
        [
            FakeGpu(bus_id=f"0000:{0x3B + i:02x}:00.0", uuid=u, free=80 * GIB, **kw)
            for i, u in enumerate(UUIDS)
        ]
    )


def test_each_free_gpu_is_proved_and_a_busy_one_left_alone(
    nvml: types.SimpleNamespace, tmp_path: Path
) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       263856128 kB\n")
    cu = cuda(rate_gbps=2900.0)
    found = gpucheck.check(
        "n" * 43, skip={1}, load_driver=lambda: Driver(cu), meminfo=tmp_path / "meminfo"
    )
    assert found.error is None and found.driver_version == "550.54.15"
    assert found.memory_mb == 263856128 // 1024 and found.cpu_count
    a, b, c = found.gpus
    assert (a.uuid, a.nvml_name, a.memory_total_mb, a.pcie_gen, a.pcie_width) == (
        UUIDS[0],
        "NVIDIA H100 80GB HBM3",
        81559,
        5,
        16,
    )
    assert a.allocated_mb is not None and 80 * 1024 - 100 < a.allocated_mb < 80 * 1024
    assert a.bandwidth_gbps == pytest.approx(2900.0, abs=0.1) and not a.in_use
    assert b.in_use and b.allocated_mb is None and b.bandwidth_gbps is None
    assert c.allocated_mb == a.allocated_mb
    assert nvml.calls == ["init", "shutdown"] and cu.contexts == 0
    # the byte written comes from the nonce: never 0, not the same for another nonce
    assert gpucheck.pattern_of("n" * 43) % 2 == 1
    assert {gpucheck.pattern_of(str(i)) for i in range(20)} != {gpucheck.pattern_of("0")}


def test_a_gpu_that_fails_is_reported_with_why_and_the_others_still_proved(
    nvml: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    cu = cuda()
    cu.gpus[2].fail = "cuCtxCreate_v2"
    found = gpucheck.check("x" * 43, load_driver=lambda: Driver(cu))
    assert [g.error for g in found.gpus[:2]] == [None, None]
    assert found.gpus[2].error == "cuCtxCreate_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"


def test_mig_mode_and_no_cuda_library_are_said(nvml: types.SimpleNamespace) -> None:
    DEVICES[0]["mig"] = 1
    try:

        def no_library() -> Driver:
            raise CudaUnavailable("no CUDA driver library (libcuda.so.1: cannot open)")

        found = gpucheck.check("x" * 43, load_driver=no_library)
    finally:
        DEVICES[0]["mig"] = 0
    assert found.gpus[0].error == gpucheck.MIG
    assert found.gpus[1].error == "CUDA: no CUDA driver library (libcuda.so.1: cannot open)"


def test_no_driver_is_said(nvml: types.SimpleNamespace) -> None:
    def no_driver() -> None:
        raise nvml.NVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    found = gpucheck.check("x" * 43)
    assert found.error == "no NVIDIA driver (Driver Not Loaded)" and found.gpus == []


def test_simulated_gpus_are_not_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not(*a: Any) -> None:
        raise AssertionError("NVML asked for simulated GPUs")

    monkeypatch.setattr(gpucheck.pynvml, "nvmlInit", must_not)
    sim = gpucheck.check("x" * 43, simulated=True)
    assert sim.simulated and sim.gpus == [] and sim.error is None


def _run(*args: str) -> GpuCheck:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet_node_agent.gpucheck", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return GpuCheck.model_validate(json.loads(out.stdout))


def test_the_module_as_the_agent_runs_it() -> None:
    """`python -m gpufleet_node_agent.gpucheck` here: simulated says so; otherwise this
    machine's truth (no NVIDIA driver here; on a GPU machine, its GPUs)."""
    assert _run("--nonce", "x" * 43, "--simulated").simulated
    found = _run("--nonce", "x" * 43, "--skip", "0,1")
    if found.error is not None:
        assert found.error.startswith("no NVIDIA driver") and found.gpus == []
    else:
        assert all(g.in_use for g in found.gpus if g.index in (0, 1))
    bad = subprocess.run(
        [sys.executable, "-m", "gpufleet_node_agent.gpucheck"], capture_output=True, timeout=60
    )
    assert bad.returncode == 2 and b"--nonce" in bad.stderr
