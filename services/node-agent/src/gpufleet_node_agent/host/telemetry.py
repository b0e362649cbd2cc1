"""Live telemetry for the heartbeats (R-NODE-6): each GPU's sample, read through NVML or
simulated (and steered by a control file), and the host's CPU, RAM and disk.

A GPU sampler is a port with three adapters: `NvmlSampler` (real GPUs: NVML started once,
XID events watched between heartbeats), `SimulatedSampler` (values that follow whether a
worker holds the GPU, overridden by `<agent_state_dir>/simulated-telemetry.json`) and
`NoGpus`. `gpu_sampler` picks one for the inventory.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections import deque
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psutil
import pynvml  # nvidia-ml-py; untyped (the root mypy config ignores missing stubs)
from gpufleet_contracts import limits
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_contracts.nodes import GpuInfo, GpuSample, XidEvent
from pydantic import ValidationError

from .inventory import Inventory

log = logging.getLogger("gpufleet.node_agent")

MIB = 1024 * 1024
GB = 1_000_000_000
T = TypeVar("T")

CONTROL_FILE = "simulated-telemetry.json"  # in the agent's state directory
XID_POLLS = 256  # events read off one GPU's set per heartbeat, at most


class GpuSampler(Protocol):
    def sample(self, busy: Set[int]) -> list[GpuSample]:
        """One sample per GPU; `busy`: the GPUs a worker holds now."""
        ...

    def close(self) -> None: ...


class NoGpus:
    """A node without GPUs: NVML is never asked (without a driver it would fail each time)."""

    def sample(self, busy: Set[int]) -> list[GpuSample]:
        return []

    def close(self) -> None:
        return None


# --- real GPUs: NVML ---------------------------------------------------------------------


def _query(fn: Callable[..., T], *args: Any) -> T | None:
    """`fn(*args)`, or None when NVML fails it (NOT_SUPPORTED on consumer GPUs, a GPU lost)."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass
class _Gpu:
    index: int
    handle: Any
    events: Any  # its XID event set; None: XIDs not watched on it


class NvmlSampler:
    """Real GPUs. NVML is started at the first sample and kept until `close` (a failed start
    is tried again at the next heartbeat); each GPU's XID events go to an event set of its
    own, drained at every heartbeat."""

    def __init__(self, indices: Sequence[int], clock: Clock = utcnow) -> None:
        self.indices = list(indices)
        self.clock = clock
        self._gpus: list[_Gpu] | None = None
        self._warned = False

    def _start(self) -> list[_Gpu] | None:
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as exc:
            if not self._warned:
                log.warning("NVML unavailable for telemetry: %s", exc)
                self._warned = True
            return None
        gpus = []
        for i in self.indices:
            handle = _query(pynvml.nvmlDeviceGetHandleByIndex, i)
            gpus.append(_Gpu(i, handle, None if handle is None else _xid_events(handle)))
        return gpus

    def sample(self, busy: Set[int]) -> list[GpuSample]:
        if self._gpus is None:
            self._gpus = self._start()
        if self._gpus is None:
            return [GpuSample(index=i) for i in self.indices]
        return [self._sample(g) for g in self._gpus]

    def _sample(self, gpu: _Gpu) -> GpuSample:
        h = gpu.handle
        if h is None:
            return GpuSample(index=gpu.index)
        util = _query(pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = _query(pynvml.nvmlDeviceGetMemoryInfo, h)
        power_mw = _query(pynvml.nvmlDeviceGetPowerUsage, h)
        return GpuSample.model_validate(
            {
                "index": gpu.index,
                "utilization_pct": None if util is None else int(util.gpu),
                "memory_used_mb": None if mem is None else int(mem.used) // MIB,
                "temperature_c": _int(
                    _query(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
                ),
                "power_w": None if power_mw is None else int(power_mw) / 1000.0,
                **_ecc(h),
                **_retired(h),
                "xid_events": None if gpu.events is None else self._xids(gpu.events),
            }
        )

    def _xids(self, events: Any) -> list[XidEvent]:
        """The XIDs waiting in the GPU's event set (a wait of 0 ms: never blocks), the
        newest `limits.XID_EVENTS` of them."""
        seen: deque[XidEvent] = deque(maxlen=limits.XID_EVENTS)
        for _ in range(XID_POLLS):
            data = _query(pynvml.nvmlEventSetWait, events, 0)  # NVML_ERROR_TIMEOUT: none left
            if data is None:
                break
            if int(data.eventType) == pynvml.nvmlEventTypeXidCriticalError:
                seen.append(XidEvent(xid=int(data.eventData), at=self.clock()))
        return list(seen)

    def close(self) -> None:
        gpus, self._gpus = self._gpus, None
        if gpus is None:
            return
        for g in gpus:
            if g.events is not None:
                _query(pynvml.nvmlEventSetFree, g.events)
        _query(pynvml.nvmlShutdown)


def _xid_events(handle: Any) -> Any:
    """An event set watching this GPU's XID errors, or None where the driver refuses."""
    events = _query(pynvml.nvmlEventSetCreate)
    if events is None:
        return None
    try:
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    except pynvml.NVMLError:
        _query(pynvml.nvmlEventSetFree, events)
        return None
    return events


def _ecc(h: Any) -> dict[str, int | None]:
    """Total ECC errors, volatile and aggregate, corrected and uncorrected (None without ECC)."""
    corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    count = pynvml.nvmlDeviceGetTotalEccErrors
    return {
        "ecc_volatile_corrected": _int(_query(count, h, corrected, pynvml.NVML_VOLATILE_ECC)),
        "ecc_volatile_uncorrected": _int(_query(count, h, uncorrected, pynvml.NVML_VOLATILE_ECC)),
        "ecc_aggregate_corrected": _int(_query(count, h, corrected, pynvml.NVML_AGGREGATE_ECC)),
        "ecc_aggregate_uncorrected": _int(_query(count, h, uncorrected, pynvml.NVML_AGGREGATE_ECC)),
    }


def _retired(h: Any) -> dict[str, Any]:
    """Pages retired (both causes; before Ampere) and rows remapped (Ampere and later)."""
    pages = [
        _query(pynvml.nvmlDeviceGetRetiredPages, h, cause)
        for cause in (
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
    ]
    known = [len(p) for p in pages if p is not None]
    rows = _query(pynvml.nvmlDeviceGetRemappedRows, h)
    corrected, uncorrected, pending, failed = (None,) * 4 if rows is None else rows
    return {
        "retired_pages": sum(known) if known else None,
        "remapped_rows_corrected": _int(corrected),
        "remapped_rows_uncorrected": _int(uncorrected),
        "remapped_rows_pending": None if pending is None else bool(pending),
        "remapped_rows_failed": None if failed is None else bool(failed),
    }


# --- simulated GPUs -----------------------------------------------------------------------

IDLE = {"temperature_c": 30.0, "power_w": 20.0}
BUSY = {"temperature_c": 72.0, "power_w": 280.0}
FOLLOW = 0.5  # the share of the way to its target a simulated GPU's temperature moves per sample
OVERRIDABLE = frozenset(GpuSample.model_fields) - {"index", "xid_events"}


class SimulatedSampler:
    """Plausible values: an idle GPU ~30 C / 20 W / 0 %, one a worker holds ~72 C / 280 W /
    ~95 % with most of its memory used, its temperature moving there over a few heartbeats;
    ECC counts 0, no XIDs. The control file (`CONTROL_FILE` in the agent's state directory)
    overrides them per GPU, as long as it says so:

        {"gpus": {"0": {"temperature_c": 95, "ecc_volatile_uncorrected": 2, "xid": [79]}}}

    Any GpuSample field but `index` and `xid_events` can be set; `xid` lists XIDs to report,
    once per version of the file (write it again to inject them again). A file that does not
    parse, or a GPU's value of the wrong type, is logged and ignored."""

    def __init__(self, gpus: Sequence[GpuInfo], control: Path, clock: Clock = utcnow) -> None:
        self.gpus = list(gpus)
        self.control = control
        self.clock = clock
        self._temps = {g.index: IDLE["temperature_c"] for g in self.gpus}
        self._rng = random.Random(0)
        self._version: tuple[int, int, int] | None = None  # the control file's, last read

    def sample(self, busy: Set[int]) -> list[GpuSample]:
        overrides, fresh = self._read_control()
        return [
            self._sample(g, g.index in busy, overrides.get(str(g.index)), fresh) for g in self.gpus
        ]

    def _sample(self, gpu: GpuInfo, busy: bool, override: Any, fresh: bool) -> GpuSample:
        target = BUSY if busy else IDLE
        temp = self._temps[gpu.index]
        temp += (target["temperature_c"] - temp) * FOLLOW
        self._temps[gpu.index] = temp
        jitter = self._rng.uniform(-1.0, 1.0)
        base: dict[str, Any] = {
            "index": gpu.index,
            "utilization_pct": 95 + round(4 * jitter) if busy else 0,
            "memory_used_mb": int(gpu.memory_mb * 0.8) if busy else 0,
            "temperature_c": round(temp + jitter),
            "power_w": round(target["power_w"] + 5 * jitter, 1),
            "ecc_volatile_corrected": 0,
            "ecc_volatile_uncorrected": 0,
            "ecc_aggregate_corrected": 0,
            "ecc_aggregate_uncorrected": 0,
            "retired_pages": 0,
            "xid_events": [],
        }
        if not isinstance(override, dict):
            return GpuSample.model_validate(base)
        values = {k: v for k, v in override.items() if k in OVERRIDABLE}
        xids = override.get("xid") if fresh else None
        if isinstance(xids, int):
            xids = [xids]
        if isinstance(xids, list):
            at = self.clock()
            values["xid_events"] = [{"xid": x, "at": at} for x in xids[-limits.XID_EVENTS :]]
        try:
            return GpuSample.model_validate(base | values)
        except ValidationError as exc:
            log.warning("%s: GPU %d ignored: %s", self.control, gpu.index, exc)
            return GpuSample.model_validate(base)

    def _read_control(self) -> tuple[dict[str, Any], bool]:
        """The file's per-GPU overrides, and whether this version of it is new (its XIDs not
        reported yet)."""
        try:
            with self.control.open("rb") as f:
                data = f.read()
                st = os.fstat(f.fileno())  # after the read: a write under way shows later
            raw = json.loads(data)
        except FileNotFoundError:
            self._version = None
            return {}, False
        except (OSError, ValueError) as exc:
            log.warning("simulated telemetry %s ignored: %s", self.control, exc)
            return {}, False
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        fresh, self._version = version != self._version, version
        gpus = raw.get("gpus") if isinstance(raw, dict) else None
        return (gpus if isinstance(gpus, dict) else {}), fresh

    def close(self) -> None:
        return None


def gpu_sampler(inventory: Inventory, state_dir: Path, clock: Clock = utcnow) -> GpuSampler:
    """The sampler for this node's GPUs: none, simulated or NVML's."""
    if not inventory.gpus:
        return NoGpus()
    if inventory.simulated:
        return SimulatedSampler(inventory.gpus, state_dir / CONTROL_FILE, clock)
    return NvmlSampler([g.index for g in inventory.gpus], clock)


# --- the host: CPU and RAM from /proc, disk through psutil ---------------------------------


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


def ram_mb(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(MemTotal - MemAvailable, MemTotal), in MiB."""
    try:
        rows = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
        total_kb = int(rows["MemTotal"].split()[0])
        avail_kb = int(rows["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return (total_kb - avail_kb) // 1024, total_kb // 1024


@dataclass(frozen=True)
class HostSample:
    cpu_pct: float | None = None
    ram_used_mb: int | None = None
    disk_used_pct: float | None = None
    disk_free_gb: float | None = None
    disk_read_bytes: int | None = None
    disk_write_bytes: int | None = None
    ram_total_mb: int | None = None
    disk_used_bytes: int | None = None  # the filesystem of `HostSampler.disk`
    disk_total_bytes: int | None = None


class HostSampler:
    """CPU % since the previous call (or since construction), RAM used, and the disk: the
    filesystem holding `disk` (the agent's state directory) and the node's disk I/O."""

    def __init__(self, proc: Path = Path("/proc"), disk: Path = Path("/")) -> None:
        self.proc = proc
        self.disk = disk
        self._last = _cpu_times(proc / "stat")

    def cpu_pct(self) -> float | None:
        now = _cpu_times(self.proc / "stat")
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return round(100.0 * (now[0] - last[0]) / (now[1] - last[1]), 1)

    def sample(self) -> HostSample:
        used_pct = free_gb = read = write = used = total = None
        try:
            usage = psutil.disk_usage(str(self.disk))
            used_pct, free_gb = float(usage.percent), round(usage.free / GB, 1)
            used, total = int(usage.used), int(usage.total)
        except OSError:
            pass
        try:
            io = psutil.disk_io_counters()  # None where the kernel shows no disks
        except (OSError, RuntimeError):
            io = None
        if io is not None:
            read, write = int(io.read_bytes), int(io.write_bytes)
        ram = ram_mb(self.proc / "meminfo")
        return HostSample(
            cpu_pct=self.cpu_pct(),
            ram_used_mb=None if ram is None else ram[0],
            disk_used_pct=used_pct,
            disk_free_gb=free_gb,
            disk_read_bytes=read,
            disk_write_bytes=write,
            ram_total_mb=None if ram is None else ram[1],
            disk_used_bytes=used,
            disk_total_bytes=total,
        )
