"""R-NODE-4: the hardware rules, every failure listed."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts.nodes import DriveInfo, GpuInfo, HardwareInventory, NicInfo
from gpufleet_provisioner.hardware import check_hardware


def gpu(i: int, name: str = "NVIDIA GeForce RTX 3090", **kw: Any) -> GpuInfo:
    model = {"NVIDIA GeForce RTX 3090": "RTX 3090", "NVIDIA A100-SXM4-40GB": "A100 40GB"}.get(
        name, name
    )
    base: dict[str, Any] = {
        "index": i,
        "uuid": f"GPU-{i}",
        "model": model,
        "nvml_name": name,
        "memory_mb": 24576,
        "pcie_gen": 4,
        "pcie_width": 16,
    }
    return GpuInfo(**{**base, **kw})


def hw(**kw: Any) -> HardwareInventory:
    base: dict[str, Any] = {
        "drives": [
            DriveInfo(name="nvme0n1", kind="nvme", size_gb=1000),
            DriveInfo(name="nvme1n1", kind="nvme", size_gb=1000),
            *[DriveInfo(name=f"sd{c}", kind="sata", size_gb=2000) for c in "abc"],
        ],
        "tpm_version": "2.0",
        "nics": [NicInfo(name="eth0", speed_mbps=10000)],
        "memory_mb": 128 * 1024,
        "cpu_cores": 16,
    }
    return HardwareInventory(**{**base, **kw})


def rules(failures: list[Any]) -> list[str]:
    return [f.rule for f in failures]


def test_a_good_node_passes() -> None:
    assert check_hardware([gpu(0), gpu(1)], hw()) == []
    assert check_hardware([gpu(0), gpu(1)], hw(), allow_public_jobs=True) == []


def test_no_inventory_reported_fails() -> None:
    assert rules(check_hardware([gpu(0)], None)) == ["R-NODE-4.inventory"]


def test_mixed_gpu_models() -> None:
    failures = check_hardware([gpu(0), gpu(1, "NVIDIA A100-SXM4-40GB")], hw())
    assert rules(failures) == ["R-NODE-4.same-model"]
    assert "A100 40GB" in failures[0].message and "RTX 3090" in failures[0].message


@pytest.mark.parametrize(("gpus", "need_tb"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (8, 4)])
def test_nvme_total_is_one_tb_per_two_gpus_rounded_up(gpus: int, need_tb: int) -> None:
    exact = [DriveInfo(name=f"nvme{i}n1", kind="nvme", size_gb=need_tb * 500) for i in range(2)]
    short = [DriveInfo(name=f"nvme{i}n1", kind="nvme", size_gb=need_tb * 500 - 1) for i in range(2)]
    sata = [DriveInfo(name=f"sd{c}", kind="sata", size_gb=2000) for c in "abc"]
    g = [gpu(i) for i in range(gpus)]
    assert check_hardware(g, hw(drives=exact + sata)) == []
    assert rules(check_hardware(g, hw(drives=short + sata))) == ["R-NODE-4.nvme-size"]


def test_one_nvme_drive_is_not_enough_even_if_large() -> None:
    drives = [DriveInfo(name="nvme0n1", kind="nvme", size_gb=8000)] + [
        DriveInfo(name=f"sd{c}", kind="sata", size_gb=2000) for c in "abc"
    ]
    assert rules(check_hardware([gpu(0)], hw(drives=drives))) == ["R-NODE-4.nvme-count"]


@pytest.mark.parametrize("tpm", [None, "1.2"])
def test_tpm_2_required(tpm: str | None) -> None:
    assert rules(check_hardware([gpu(0)], hw(tpm_version=tpm))) == ["R-NODE-4.tpm"]


def test_local_storage_needs_three_sata_drives_of_2tb() -> None:
    drives = [
        DriveInfo(name="nvme0n1", kind="nvme", size_gb=1000),
        DriveInfo(name="nvme1n1", kind="nvme", size_gb=1000),
        DriveInfo(name="sda", kind="sata", size_gb=2000),
        DriveInfo(name="sdb", kind="sata", size_gb=2000),
        DriveInfo(name="sdc", kind="sata", size_gb=1000),
    ]
    assert rules(check_hardware([gpu(0)], hw(drives=drives))) == ["R-NODE-4.sata"]
    # central storage does not need them, but needs a 10 Gb/s NIC
    assert check_hardware([gpu(0)], hw(drives=drives), storage_mode="central") == []
    slow = hw(drives=drives, nics=[NicInfo(name="eth0", speed_mbps=1000)])
    assert rules(check_hardware([gpu(0)], slow, storage_mode="central")) == ["R-NODE-4.nic"]


def test_public_regions_check_memory_lanes_and_cores() -> None:
    gpus = [gpu(i, pcie_width=4 if i == 1 else 16) for i in range(4)]  # 4 x 24 GB, PCIe 4.0
    weak = hw(memory_mb=100 * 1024, cpu_cores=8)
    assert check_hardware(gpus, weak) == []  # private region: not checked
    failures = check_hardware(gpus, weak, allow_public_jobs=True)
    assert rules(failures) == ["R-NODE-4.memory", "R-NODE-4.pcie-lanes", "R-NODE-4.cores"]
    assert "[1]" in failures[1].message
    assert "16 CPU cores" in failures[2].message


def test_pcie3_gpus_need_two_cores_each_and_sxm_needs_no_lanes() -> None:
    gpus = [gpu(i, pcie_gen=3) for i in range(4)]
    roomy = hw(cpu_cores=8, memory_mb=192 * 1024)
    assert check_hardware(gpus, roomy, allow_public_jobs=True) == []
    assert check_hardware(gpus, hw(cpu_cores=7, memory_mb=192 * 1024), allow_public_jobs=True)
    sxm = [gpu(i, "NVIDIA A100-SXM4-40GB", pcie_width=None, memory_mb=40960) for i in range(2)]
    big = hw(memory_mb=256 * 1024)
    assert check_hardware(sxm, big, allow_public_jobs=True) == []


def test_every_failure_is_listed_at_once() -> None:
    bare = HardwareInventory()
    failures = check_hardware(
        [gpu(0), gpu(1, "NVIDIA A100-SXM4-40GB")], bare, allow_public_jobs=True
    )
    assert rules(failures) == [
        "R-NODE-4.same-model",
        "R-NODE-4.nvme-count",
        "R-NODE-4.nvme-size",
        "R-NODE-4.tpm",
        "R-NODE-4.sata",
        "R-NODE-4.memory",
        "R-NODE-4.cores",
    ]
