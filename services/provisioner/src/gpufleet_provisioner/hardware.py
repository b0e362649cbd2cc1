"""R-NODE-4: a node's hardware against the requirements of its region. Pure; every failure listed.

Sizes are decimal, as drives are sold: 1 TB = 1000 GB. A GPU counts as SXM when the node
says so (`gpu_form_factor: "sxm"`) or NVML's name says so ("A100-SXM4-80GB").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet_contracts.nodes import GpuInfo, HardwareInventory

TB_GB = 1000
MIN_NVME_DRIVES = 2
MIN_SATA_DRIVES = 3
MIN_SATA_GB = 2 * TB_GB
MIN_NIC_MBPS = 10_000
MIN_LANES_PER_GPU = 8


@dataclass(frozen=True)
class Failure:
    rule: str  # short id, e.g. "R-NODE-4.nvme-count"
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


def _is_sxm(gpu: GpuInfo, hw: HardwareInventory) -> bool:
    return (hw.gpu_form_factor or "").lower() == "sxm" or "SXM" in gpu.nvml_name.upper()


def check_hardware(
    gpus: Sequence[GpuInfo],
    hw: HardwareInventory | None,
    *,
    storage_mode: str = "local",
    allow_public_jobs: bool = False,
) -> list[Failure]:
    """Every R-NODE-4 rule this compute node fails (empty: it may serve jobs)."""
    if hw is None:
        return [
            Failure(
                "R-NODE-4.inventory",
                "the node agent reported no hardware inventory (drives, TPM, NICs); "
                "upgrade the agent",
            )
        ]
    out: list[Failure] = []
    n = len(gpus)

    models = sorted({g.model or g.nvml_name for g in gpus})
    if len(models) > 1:
        out.append(
            Failure("R-NODE-4.same-model", f"all GPUs must be the same model; found {models}")
        )

    nvme = [d for d in hw.drives if d.kind == "nvme"]
    if len(nvme) < MIN_NVME_DRIVES:
        out.append(
            Failure(
                "R-NODE-4.nvme-count",
                f"at least {MIN_NVME_DRIVES} NVMe drives are required; found {len(nvme)}",
            )
        )
    need_tb = (n + 1) // 2  # 1 TB per 2 GPUs, rounded up
    total_gb = sum(d.size_gb for d in nvme)
    if total_gb < need_tb * TB_GB:
        out.append(
            Failure(
                "R-NODE-4.nvme-size",
                f"{n} GPUs need >= {need_tb} TB of NVMe in total; found {total_gb} GB",
            )
        )

    if hw.tpm_version is None:
        out.append(Failure("R-NODE-4.tpm", "a TPM 2.0 is required; none found"))
    elif not hw.tpm_version.startswith("2"):
        out.append(Failure("R-NODE-4.tpm", f"a TPM 2.0 is required; found TPM {hw.tpm_version}"))

    if storage_mode == "central":
        fastest = max((nic.speed_mbps or 0 for nic in hw.nics), default=0)
        if fastest < MIN_NIC_MBPS:
            out.append(
                Failure(
                    "R-NODE-4.nic",
                    f"central storage needs a NIC of >= 10 Gb/s; fastest is {fastest} Mb/s",
                )
            )
    else:
        sata = [d for d in hw.drives if d.kind == "sata"]
        big = [d for d in sata if d.size_gb >= MIN_SATA_GB]
        if len(big) < MIN_SATA_DRIVES:
            out.append(
                Failure(
                    "R-NODE-4.sata",
                    f"local storage needs >= {MIN_SATA_DRIVES} SATA drives of >= 2 TB each; "
                    f"found {len(big)} (of {len(sata)} SATA drives)",
                )
            )

    if allow_public_jobs:
        vram_mb = sum(g.memory_mb for g in gpus)
        if hw.memory_mb is None or hw.memory_mb < 2 * vram_mb:
            out.append(
                Failure(
                    "R-NODE-4.memory",
                    f"selling capacity needs RAM >= 2 x VRAM ({2 * vram_mb} MB); "
                    f"found {hw.memory_mb} MB",
                )
            )
        narrow = [
            g.index for g in gpus if not _is_sxm(g, hw) and (g.pcie_width or 0) < MIN_LANES_PER_GPU
        ]
        if narrow:
            out.append(
                Failure(
                    "R-NODE-4.pcie-lanes",
                    f"selling capacity needs >= {MIN_LANES_PER_GPU} PCIe lanes per GPU; "
                    f"GPUs {narrow} have fewer (or did not report)",
                )
            )
        need_cores = sum(4 if (g.pcie_gen or 0) >= 4 else 2 for g in gpus)
        if hw.cpu_cores is None or hw.cpu_cores < need_cores:
            out.append(
                Failure(
                    "R-NODE-4.cores",
                    f"selling capacity needs {need_cores} CPU cores (2 per PCIe 3.0 GPU, "
                    f"4 per PCIe 4.0 GPU); found {hw.cpu_cores}",
                )
            )
    return out
