"""What this node has: GPUs (NVML) and the rest of the hardware the provisioner checks
(R-NODE-4): NVMe and SATA drives (/sys/block), TPM (/sys/class/tpm), NICs (/sys/class/net),
memory (/proc/meminfo) and CPU cores.

Without an NVIDIA driver the node reports no GPUs (R-NODE-6): it still registers and
heartbeats, and its inventory source says why. Simulated GPUs are a development option
(`GPUFLEET_SIMULATED_GPUS`, which `just up` and the tests switch on), never a fallback: such
a node says so in its registration (`simulated: true`) and in its start-up log. A simulated
inventory file is either a list of GPUs (no hardware reported) or an object
`{"gpus": [...], "hardware": {...}}`; a node with simulated GPUs reports simulated hardware.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml  # nvidia-ml-py; untyped (the root mypy config ignores missing stubs)
from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.nodes import DriveInfo, GpuInfo, HardwareInventory, NicInfo

from ..settings import AgentSettings

MIB = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class Inventory:
    gpus: list[GpuInfo]
    simulated: bool
    source: str  # "nvml", "nvml: <why there are no GPUs>", or the simulated inventory file
    driver_version: str | None = None
    note: str = ""
    hardware: HardwareInventory | None = None

    def describe(self) -> str:
        models: dict[str, int] = {}
        for g in self.gpus:
            key = g.model or g.nvml_name
            models[key] = models.get(key, 0) + 1
        listing = ", ".join(f"{n} x {m}" for m, n in models.items()) or "no GPUs"
        if self.simulated:
            return f"SIMULATED GPUs ({len(self.gpus)}): {listing}; {self.note}"
        if self.source != "nvml":
            return f"no GPUs ({self.source}): this node takes no GPU work"
        return f"real GPUs via NVML ({len(self.gpus)}): {listing}; driver {self.driver_version}"

    def logical_cpus(self) -> int:
        """The node's logical CPUs as it reports them (its hardware; else this machine's)."""
        cores = None if self.hardware is None else self.hardware.cpu_cores
        return cores or os.cpu_count() or 1


def offered_cpus(setting: int | None, logical: int, gpus: int) -> int:
    """The logical CPUs a node offers to CPU-only jobs (R-JOB-2; README "CPU-only jobs"):
    the operator's GPUFLEET_CPU_JOB_CPUS, at most its CPUs; unset, all the CPUs of a node
    without GPUs and none of a GPU node (its CPUs feed its GPUs' workers, as before)."""
    if setting is not None:
        return max(0, min(setting, logical))
    return logical if gpus == 0 else 0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Callable[..., T], *args: Any) -> T | None:
    """`fn(*args)`, or None when this GPU or driver does not support the query."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None


def _mig_mode(handle: Any) -> bool | None:
    modes = _optional(pynvml.nvmlDeviceGetMigMode, handle)
    if modes is None:
        return None
    return bool(modes[0] == pynvml.NVML_DEVICE_MIG_ENABLE)


def _nvml_gpu(index: int) -> GpuInfo:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(pynvml.nvmlDeviceGetName(h))
    return GpuInfo.model_validate(
        {
            "index": index,
            "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
            "model": catalog().from_nvml_name(name),
            "nvml_name": name,
            "memory_mb": int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // MIB,
            "pcie_gen": _optional(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width": _optional(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
            # Current link state drops at idle; it is kept as extra fields, for diagnosis only.
            "pcie_gen_current": _optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width_current": _optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            "mig_mode": _mig_mode(h),
        }
    )


class NvmlUnavailable(Exception):
    """NVML did not start: no NVIDIA driver, or no NVML library."""


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def read_nvml(root: Path = Path("/")) -> Inventory:
    """The GPUs NVML sees. Raises NvmlUnavailable when NVML cannot start, and
    pynvml.NVMLError when it starts but a GPU query fails."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        raise NvmlUnavailable(_reason(exc)) from exc
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = [_nvml_gpu(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
    finally:
        pynvml.nvmlShutdown()
    sxm = any("SXM" in g.nvml_name.upper() for g in gpus)
    return Inventory(
        gpus=gpus,
        simulated=False,
        source="nvml",
        driver_version=driver,
        hardware=read_hardware(root, gpu_form_factor="sxm" if sxm else "pcie"),
    )


# --- the rest of the hardware, from the OS ----------------------------------------------

SKIP_BLOCK = ("loop", "ram", "zram", "dm-", "sr", "md", "nbd", "fd")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_drives(sys_block: Path) -> list[DriveInfo]:
    """Whole disks: NVMe (`nvme*`), SATA (`sd*` on the ata transport, or any `sd*`)."""
    drives: list[DriveInfo] = []
    try:
        names = sorted(p.name for p in sys_block.iterdir())
    except OSError:
        return drives
    for name in names:
        if name.startswith(SKIP_BLOCK):
            continue
        sectors = _read(sys_block / name / "size")
        if sectors is None or not sectors.isdigit():
            continue
        kind = "nvme" if name.startswith("nvme") else "sata" if name.startswith("sd") else "other"
        size_gb = int(sectors) * 512 // 1_000_000_000  # sectors are 512 bytes; decimal GB
        rotational = _read(sys_block / name / "queue" / "rotational") == "1"
        drives.append(DriveInfo(name=name, kind=kind, size_gb=size_gb, rotational=rotational))
    return drives


def read_tpm(sys_tpm: Path) -> str | None:
    """ "2.0", "1.2", or None without a TPM."""
    try:
        devices = sorted(p for p in sys_tpm.iterdir() if p.name.startswith("tpm"))
    except OSError:
        return None
    for dev in devices:
        major = _read(dev / "tpm_version_major")
        if major is not None:
            return "2.0" if major == "2" else f"{major}.2" if major == "1" else major
        return "1.2"  # kernels without tpm_version_major expose only TPM 1.2 this way
    return None


def read_nics(sys_net: Path) -> list[NicInfo]:
    """Physical NICs (those with a `device`), with their link speed in Mb/s when up."""
    nics: list[NicInfo] = []
    try:
        names = sorted(p.name for p in sys_net.iterdir())
    except OSError:
        return nics
    for name in names:
        if name == "lo" or not (sys_net / name / "device").exists():
            continue
        speed = _read(sys_net / name / "speed")
        mbps = int(speed) if speed and speed.lstrip("-").isdigit() else None
        nics.append(NicInfo(name=name, speed_mbps=mbps if mbps and mbps > 0 else None))
    return nics


def memory_mb(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_hardware(root: Path = Path("/"), gpu_form_factor: str = "pcie") -> HardwareInventory:
    return HardwareInventory(
        drives=read_drives(root / "sys" / "block"),
        tpm_version=read_tpm(root / "sys" / "class" / "tpm"),
        nics=read_nics(root / "sys" / "class" / "net"),
        memory_mb=memory_mb(root / "proc" / "meminfo"),
        cpu_cores=os.cpu_count(),
        gpu_form_factor=gpu_form_factor,
    )


def read_simulated(path: Path, note: str) -> Inventory:
    raw = json.loads(path.read_text())
    hardware = None
    if isinstance(raw, dict):
        hw = raw.get("hardware")
        hardware = None if hw is None else HardwareInventory.model_validate(hw)
        raw = raw.get("gpus") or []
    gpus = [
        GpuInfo(
            index=int(g["index"]),
            uuid=str(g["uuid"]),
            model=catalog().from_nvml_name(str(g["nvml_name"])),
            nvml_name=str(g["nvml_name"]),
            memory_mb=int(g["memory_mb"]),
            pcie_gen=g.get("pcie_gen"),
            pcie_width=g.get("pcie_width"),
            mig_mode=g.get("mig_mode"),
        )
        for g in raw
    ]
    return Inventory(gpus=gpus, simulated=True, source=str(path), note=note, hardware=hardware)


def without_gpus(source: str, root: Path = Path("/")) -> Inventory:
    """A real node with no GPUs to offer; `source` says why. Its other hardware is read."""
    return Inventory(gpus=[], simulated=False, source=source, hardware=read_hardware(root))


def read_inventory(settings: AgentSettings, root: Path = Path("/")) -> Inventory:
    """The simulated file when GPUFLEET_SIMULATED_GPUS is set, without asking NVML (the same
    GPUs on every machine, which tests rely on); otherwise what NVML reports, and no GPUs
    when it cannot (R-NODE-6)."""
    sim = settings.simulated_gpus
    if sim is not None:
        return read_simulated(sim, f"GPUFLEET_SIMULATED_GPUS is set; inventory from {sim}")
    try:
        return read_nvml(root)
    except NvmlUnavailable as exc:
        return without_gpus(f"nvml: no NVIDIA driver ({exc})", root)
    except pynvml.NVMLError as exc:
        # NVML runs but a GPU does not answer: report the fault, never pretend.
        return without_gpus(f"nvml: reading the GPUs failed ({_reason(exc)})", root)
