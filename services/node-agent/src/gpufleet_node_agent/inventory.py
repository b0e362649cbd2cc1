"""What GPUs this node has (NVML, or a simulated file when there is no NVIDIA driver).

The simulated path exists so that the whole control plane can run on a laptop: such a node
says so in its registration (`simulated: true`) and in its start-up log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml  # nvidia-ml-py; untyped (the root mypy config ignores missing stubs)
from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.nodes import GpuInfo, GpuSample

from .settings import AgentSettings

log = logging.getLogger("gpufleet.node_agent")

MIB = 1024 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class Inventory:
    gpus: list[GpuInfo]
    simulated: bool
    source: str  # "nvml" or the simulated inventory file
    driver_version: str | None = None
    note: str = ""

    def describe(self) -> str:
        models: dict[str, int] = {}
        for g in self.gpus:
            key = g.model or g.nvml_name
            models[key] = models.get(key, 0) + 1
        listing = ", ".join(f"{n} x {m}" for m, n in models.items()) or "no GPUs"
        if self.simulated:
            return f"SIMULATED GPUs ({len(self.gpus)}): {listing}; {self.note}"
        return f"real GPUs via NVML ({len(self.gpus)}): {listing}; driver {self.driver_version}"


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


def read_nvml() -> Inventory:
    """The GPUs NVML sees. Raises pynvml.NVMLError / OSError when NVML cannot start."""
    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = [_nvml_gpu(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
    finally:
        pynvml.nvmlShutdown()
    return Inventory(gpus=gpus, simulated=False, source="nvml", driver_version=driver)


def read_simulated(path: Path, note: str) -> Inventory:
    raw = json.loads(path.read_text())
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
    return Inventory(gpus=gpus, simulated=True, source=str(path), note=note)


def read_inventory(settings: AgentSettings) -> Inventory:
    sim = settings.sim_inventory
    if settings.force_simulated:
        return read_simulated(
            sim, f"GPUFLEET_FORCE_SIMULATED is set; simulated inventory from {sim}"
        )
    try:
        return read_nvml()
    except (pynvml.NVMLError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        return read_simulated(
            sim, f"no NVIDIA driver found ({reason}); simulated inventory from {sim}"
        )


# --- telemetry --------------------------------------------------------------------------


def _nvml_sample(index: int) -> GpuSample:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def query(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except pynvml.NVMLError:
            return None

    util = query(lambda: int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
    mem = query(lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).used) // MIB)
    temp = query(lambda: int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))
    power_mw = query(lambda: int(pynvml.nvmlDeviceGetPowerUsage(h)))
    return GpuSample(
        index=index,
        utilization_pct=util,
        memory_used_mb=mem,
        temperature_c=temp,
        power_w=None if power_mw is None else power_mw / 1000.0,
    )


def sample_telemetry(inventory: Inventory) -> list[GpuSample]:
    """One sample per GPU. Simulated GPUs are idle; a failing NVML query gives None."""
    if inventory.simulated:
        return [
            GpuSample(index=g.index, utilization_pct=0, memory_used_mb=0) for g in inventory.gpus
        ]
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        log.warning("NVML unavailable for telemetry: %s", exc)
        return [GpuSample(index=g.index) for g in inventory.gpus]
    try:
        samples = []
        for g in inventory.gpus:
            try:
                samples.append(_nvml_sample(g.index))
            except pynvml.NVMLError:
                samples.append(GpuSample(index=g.index))
        return samples
    finally:
        pynvml.nvmlShutdown()


# --- host (CPU, RAM) from /proc ----------------------------------------------------------


def _cpu_times(stat: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs, from the first line of /proc/stat."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def ram_used_mb(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemTotal - MemAvailable, in MiB."""
    try:
        rows = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        total_kb = int(rows["MemTotal"].split()[0])
        avail_kb = int(rows["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return (total_kb - avail_kb) // 1024


class HostSampler:
    """CPU % since the previous call (or since construction), and RAM used."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last = _cpu_times(proc / "stat")

    def cpu_pct(self) -> float | None:
        now = _cpu_times(self.proc / "stat")
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return round(100.0 * (now[0] - last[0]) / (now[1] - last[1]), 1)

    def sample(self) -> tuple[float | None, int | None]:
        return self.cpu_pct(), ram_used_mb(self.proc / "meminfo")
