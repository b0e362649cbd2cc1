"""Verified nodes: a GPU check's answer against the registration and the catalogue (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts.nodes import GpuInfo, HardwareInventory
from gpufleet_contracts.verification import CheckedGpu, GpuCheck
from gpufleet_provisioner.verification import (
    SIMULATED,
    CheckPolicy,
    Claim,
    judge,
    memory_needed_mb,
)

H200 = "NVIDIA H200"
H200_MIB = 143771  # what NVML reports of an H200's memory


def claimed(i: int, **kw: Any) -> GpuInfo:
    base: dict[str, Any] = {
        "index": i,
        "uuid": f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
        "model": "H200",
        "nvml_name": H200,
        "memory_mb": H200_MIB,
        "pcie_gen": 5,
        "pcie_width": 16,
    }
    return GpuInfo(**{**base, **kw})


def claim(n: int = 8, **kw: Any) -> Claim:
    hw = HardwareInventory(memory_mb=2 * 1024 * 1024, cpu_cores=128)
    return Claim.of([claimed(i) for i in range(n)], kw.pop("simulated", False), kw.pop("hw", hw))


def found_gpu(g: GpuInfo, **kw: Any) -> CheckedGpu:
    base: dict[str, Any] = {
        "index": g.index,
        "uuid": g.uuid,
        "nvml_name": g.nvml_name,
        "memory_total_mb": g.memory_mb,
        "pcie_gen": g.pcie_gen,
        "pcie_width": g.pcie_width,
        "allocated_mb": 142_000,
        "bandwidth_gbps": 3900.0,
    }
    return CheckedGpu(**{**base, **kw})


def answer(c: Claim, **kw: Any) -> GpuCheck:
    base: dict[str, Any] = {
        "driver_version": "550.54",
        "gpus": [found_gpu(g) for g in c.gpus],
        "cpu_count": 128,
        "memory_mb": 2 * 1024 * 1024,
    }
    return GpuCheck(**{**base, **kw})


def test_a_node_whose_check_bears_out_its_claim_is_verified() -> None:
    c = claim()
    v = judge(c, answer(c))
    assert v.verified and v.reason is None and not v.retry
    assert all(check.startswith("ok: ") for check in v.checks), v.checks
    assert "ok: 8 GPUs, the UUIDs registered" in v.checks
    assert any("GPU 7" in check and "allocated and written" in check for check in v.checks)


def test_the_memory_to_prove_is_the_catalogues_less_the_margin() -> None:
    # 141 GB decimal, less 10%: 121,021 MiB; an 80 GB card less 10%: 68,664 MiB
    assert memory_needed_mb("H200", CheckPolicy()) == int(141e9 * 0.9 / 2**20)
    assert memory_needed_mb("H100 80GB", CheckPolicy(memory_margin=0.10)) == 68664


def test_the_attackers_node_claiming_8_h200_with_no_gpus_is_not_verified() -> None:
    """The forged registration of issue 26: 8 x H200 claimed; the real check finds no
    driver. A later check may find them (retry), but it is not verified now."""
    v = judge(claim(), GpuCheck(error="no NVIDIA driver (NVML Shared Library Not Found)"))
    assert not v.verified and v.retry
    assert v.reason == "the check found no GPUs: no NVIDIA driver (NVML Shared Library Not Found)"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"allocated_mb": 24_000}, "GPU 3 (GPU-00000003-aaaa-bbbb-cccc-000000000000): 25.2 GB"),
        ({"allocated_mb": None}, "0.0 GB allocated; a H200 has 141 GB (at least 126.9 GB must be)"),
        ({"bandwidth_gbps": 40.0}, "memory bandwidth 40 GB/s, below 130 GB/s"),
        ({"nvml_name": "NVIDIA GeForce RTX 3090"}, "NVML names it 'NVIDIA GeForce RTX 3090'"),
        ({"memory_total_mb": 24576}, "NVML reports 24576 MiB, registered 143771 MiB"),
        ({"pcie_width": 4}, "PCIe gen 5 x4, registered gen 5 x16"),
        ({"index": 5}, "at NVML index 5, registered at 3"),
    ],
)
def test_figures_below_the_claim_are_not_verified(change: dict[str, Any], why: str) -> None:
    """One GPU of eight is not what was claimed: not verified, and no retry (only a new
    registration, or someone asking, checks it again)."""
    c = claim()
    found = answer(c)
    gpus = list(found.gpus)
    gpus[3] = gpus[3].model_copy(update=change)
    v = judge(c, found.model_copy(update={"gpus": gpus}))
    assert not v.verified and not v.retry
    assert v.reason is not None and why in v.reason, v.reason
    assert any(check.startswith("failed: GPU 3") for check in v.checks)


def test_fewer_gpus_or_other_uuids_than_registered_are_not_verified() -> None:
    c = claim()
    found = answer(c)
    fewer = judge(c, found.model_copy(update={"gpus": found.gpus[:2]}))
    assert not fewer.verified and "2 GPUs found, 8 registered" in str(fewer.reason)
    assert "GPU 2 (GPU-00000002-aaaa-bbbb-cccc-000000000000): not found" in str(fewer.reason)
    other = list(found.gpus)
    other[0] = other[0].model_copy(update={"uuid": "GPU-somebody-else"})
    swapped = judge(c, found.model_copy(update={"gpus": other}))
    assert (
        not swapped.verified
        and "GPU 0" in str(swapped.reason)
        and "not found" in str(swapped.reason)
    )
    twice = list(found.gpus)
    twice[1] = twice[0]
    assert not judge(c, found.model_copy(update={"gpus": twice})).verified


def test_a_host_with_fewer_cpus_or_less_memory_than_registered_is_not_verified() -> None:
    c = claim()
    assert "8 CPUs seen, 128 registered" in str(
        judge(c, answer(c).model_copy(update={"cpu_count": 8})).reason
    )
    v = judge(c, answer(c).model_copy(update={"memory_mb": 64 * 1024}))
    assert not v.verified and "65536 MiB of memory seen" in str(v.reason)


def test_simulated_gpus_are_never_verified() -> None:
    c = claim(simulated=True)
    v = judge(c, GpuCheck(simulated=True))
    assert (v.verified, v.reason, v.retry) == (False, SIMULATED, False)
    # even an answer that looks perfect: the registration says its GPUs are simulated
    assert not judge(c, answer(claim())).verified
    # and a real registration whose check finds simulated GPUs
    real = claim()
    assert judge(real, GpuCheck(simulated=True)).reason == "the check found simulated GPUs"


def test_a_gpu_busy_with_a_worker_counts_only_when_proved_before() -> None:
    c = claim(2)
    found = answer(c)
    busy = found.model_copy(
        update={"gpus": [found.gpus[0], found_gpu(c.gpus[1], in_use=True, allocated_mb=None)]}
    )
    first = judge(c, busy)
    assert not first.verified and first.retry
    assert "GPU 1" in str(first.reason) and "in use by a worker" in str(first.reason)
    again = judge(c, busy, proved=[g.uuid for g in c.gpus])
    assert again.verified, again.checks


def test_a_check_that_failed_on_a_gpu_may_be_retried() -> None:
    c = claim(2)
    found = answer(c)
    gpus = [found.gpus[0], found.gpus[1].model_copy(update={"error": "cuCtxCreate_v2 failed"})]
    v = judge(c, found.model_copy(update={"gpus": gpus}))
    assert not v.verified and v.retry and "cuCtxCreate_v2 failed" in str(v.reason)
    mig = [found.gpus[0], found.gpus[1].model_copy(update={"error": "MIG mode is on"})]
    assert not judge(c, found.model_copy(update={"gpus": mig})).verified


def test_a_node_without_gpus_is_verified_for_its_cpus_when_the_check_finds_none() -> None:
    c = claim(0)
    v = judge(c, GpuCheck(error="no NVIDIA driver (x)", cpu_count=128, memory_mb=2 * 1024 * 1024))
    assert v.verified, v.checks
    assert "ok: no GPUs registered, none found (no NVIDIA driver (x))" in v.checks


def test_a_gpu_not_in_the_catalogue_is_not_verified() -> None:
    odd = GpuInfo(index=0, uuid="GPU-x", model=None, nvml_name="NVIDIA Mystery", memory_mb=1)
    c = Claim.of([odd], False, None)
    v = judge(c, GpuCheck(gpus=[found_gpu(odd)]))
    assert not v.verified and "is no catalogue model" in str(v.reason)


def test_the_fingerprint_changes_with_the_gpus_and_the_host() -> None:
    c = claim()
    assert c.fingerprint() == claim().fingerprint()
    swapped = Claim.of([claimed(0, uuid="GPU-other"), *c.gpus[1:]], False, None)
    assert swapped.fingerprint() != Claim.of(c.gpus, False, None).fingerprint()
    more_ram = claim(hw=HardwareInventory(memory_mb=4 * 1024 * 1024, cpu_cores=128))
    assert more_ram.fingerprint() != c.fingerprint()
    assert claim(simulated=True).fingerprint() != c.fingerprint()
