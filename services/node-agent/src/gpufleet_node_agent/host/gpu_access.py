"""How a worker's container gets its GPUs, and nothing more (services/node-agent/README.md,
"GPUs in containers").

Two ways, chosen by `GPUFLEET_GPU_ACCESS` (`auto` picks CDI where a CDI spec for
`nvidia.com/gpu` is installed, else device nodes):

- `cdi`: the NVIDIA Container Toolkit's CDI spec (`nvidia-ctk cdi generate`) names each GPU
  by UUID; podman adds its device node, the control devices and the driver's libraries
  (`--device nvidia.com/gpu=<uuid>`).
- `devices`: no toolkit needed. The GPU's own device node (`/dev/nvidia<minor>`, the minor
  number NVML reports, not its index), the control devices, and the driver's user-space
  libraries bound read-only, one file at a time, at `/usr/local/nvidia/lib64` (the layout GKE
  uses; `LD_LIBRARY_PATH` points there). Never the host's whole library directory.

Simulated GPUs have no device: `GpuAccess.none()`.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
DRIVER_TARGET = "/usr/local/nvidia/lib64"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
# Where a driver's user-space libraries are found (the first holding libcuda.so.1 wins).
DRIVER_DIRS = (
    Path("/usr/local/nvidia/lib64"),
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib"),
)
# The compute part of the driver a CUDA program loads (nvidia-container-cli's "compute" and
# "utility" sets): the sonames, and versioned names matched by pattern.
DRIVER_SONAMES = (
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libcudadebugger.so.1",
    "libnvidia-allocator.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-opencl.so.1",
)
DRIVER_PATTERNS = (re.compile(r"^libnvidia-gpucomp\.so\.[0-9.]+$"),)


@dataclass(frozen=True)
class HostGpu:
    index: int  # NVML's index: what the scheduler's gpu_indices name
    minor: int  # its /dev/nvidia<minor>
    uuid: str
    memory_mb: int = 0  # NVML's total: a share's memory when the placement does not say


@dataclass(frozen=True)
class LibBind:
    host: Path
    target: str


@dataclass(frozen=True)
class GpuAccess:
    mode: str  # "devices", "cdi" or "none" (no real GPUs)
    gpus: Mapping[int, HostGpu] = field(default_factory=dict)
    driver_files: tuple[LibBind, ...] = ()

    @classmethod
    def none(cls) -> GpuAccess:
        return cls("none")

    @property
    def real(self) -> bool:
        return self.mode != "none"

    def describe(self) -> str:
        if self.mode == "cdi":
            return "CDI (nvidia.com/gpu=<uuid>)"
        if self.mode == "devices":
            libs = len(self.driver_files)
            return f"device nodes and {libs} driver libraries at {DRIVER_TARGET}"
        return "no real GPUs"

    def uuid(self, index: int) -> str | None:
        gpu = self.gpus.get(index)
        return gpu.uuid if gpu else None

    def devices(self, indices: Sequence[int]) -> list[str]:
        """`--device` values of a worker holding GPUs `indices` (none without real GPUs or
        GPUs). An index this node does not have is an error, not a silent no-GPU worker."""
        if not self.real or not indices:
            return []
        missing = [i for i in indices if i not in self.gpus]
        if missing:
            raise KeyError(f"GPU index {missing} is not on this node")
        if self.mode == "cdi":
            return [f"nvidia.com/gpu={self.gpus[i].uuid}" for i in indices]
        return [f"/dev/nvidia{self.gpus[i].minor}" for i in indices] + list(CONTROL_DEVICES)

    def library_binds(self, indices: Sequence[int]) -> list[LibBind]:
        """The driver's libraries, for a worker with GPUs in `devices` mode (CDI adds its own)."""
        if self.mode != "devices" or not indices:
            return []
        return list(self.driver_files)

    def env(self, indices: Sequence[int]) -> dict[str, str]:
        if self.mode != "devices" or not indices or not self.driver_files:
            return {}
        return {"LD_LIBRARY_PATH": DRIVER_TARGET}


def driver_files(directory: Path) -> tuple[LibBind, ...]:
    """The driver libraries in `directory`, each bound under its soname (the file behind a
    symlink is what is bound: a bind of a dangling link inside the container would fail)."""
    out: list[LibBind] = []
    names = set(DRIVER_SONAMES)
    try:
        entries = sorted(p.name for p in directory.iterdir())
    except OSError:
        return ()
    for name in entries:
        if name in names or any(p.match(name) for p in DRIVER_PATTERNS):
            real = (directory / name).resolve()
            if real.is_file():
                out.append(LibBind(real, f"{DRIVER_TARGET}/{name}"))
    return tuple(out)


def find_driver_dir(candidates: Iterable[Path] = DRIVER_DIRS) -> Path | None:
    for d in candidates:
        if (d / "libcuda.so.1").exists():
            return d
    return _ldconfig_dir()


def _ldconfig_dir() -> Path | None:
    try:
        out = subprocess.run(
            ["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return Path(line.split("=>", 1)[1].strip()).parent
    return None


def cdi_installed(dirs: Iterable[Path] = CDI_DIRS) -> bool:
    """Is a CDI spec of the kind `nvidia.com/gpu` installed (`nvidia-ctk cdi generate`)?"""
    for d in dirs:
        try:
            files = [p for p in d.iterdir() if p.suffix in (".yaml", ".yml", ".json")]
        except OSError:
            continue
        for p in files:
            try:
                if "nvidia.com/gpu" in p.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def choose_mode(setting: str, *, cdi: bool) -> str:
    """`auto`, `cdi` or `devices` (GPUFLEET_GPU_ACCESS) and whether CDI is installed."""
    if setting == "auto":
        return "cdi" if cdi else "devices"
    if setting not in ("cdi", "devices"):
        raise ValueError(f"GPUFLEET_GPU_ACCESS must be auto, cdi or devices, not {setting!r}")
    return setting


def read_host_gpus() -> dict[int, HostGpu]:
    """Index, minor number and UUID of each GPU, through NVML."""
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        out = {}
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out[i] = HostGpu(
                index=i,
                minor=int(pynvml.nvmlDeviceGetMinorNumber(h)),
                uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                memory_mb=int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20,
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def host_access(setting: str, driver_dir: Path | None) -> GpuAccess:
    """This node's GpuAccess, for its real GPUs (NVML must have started)."""
    mode = choose_mode(setting, cdi=cdi_installed())
    gpus = read_host_gpus()
    files: tuple[LibBind, ...] = ()
    if mode == "devices":
        directory = driver_dir or find_driver_dir()
        files = driver_files(directory) if directory else ()
    return GpuAccess(mode, gpus, files)
