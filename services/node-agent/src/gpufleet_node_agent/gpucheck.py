"""gpufleet's GPU check, run by the node agent out of its own process, under a timeout:

    python -m gpufleet_node_agent.gpucheck --nonce NONCE [--skip 0,3] [--simulated]

prints one JSON object, a `GpuCheck` (gpufleet_contracts.verification): for each GPU what
NVML says (the same reading as the registration: UUID, name, memory, PCIe link, MIG mode)
and what CUDA proves (cuda.py: memory allocated, written and read back, a timed copy),
and the host's CPUs and memory. GPUs in `--skip` (held by this node's workers) get NVML's
facts only. Simulated GPUs are not checked: the answer says so. Without an NVIDIA driver
the answer says that instead. The byte written over each GPU's memory comes from the nonce.

Exit status 0 whenever it printed its answer (a failed GPU is part of the answer); 2 for
arguments it does not take.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pynvml  # nvidia-ml-py; untyped (the root mypy config ignores missing stubs)
from gpufleet_contracts.nodes import GpuInfo
from gpufleet_contracts.verification import TEXT_CHARS, CheckedGpu, GpuCheck

from .host.cuda import MIB, CudaError, CudaUnavailable, Driver, prove
from .host.inventory import _nvml_gpu, memory_mb

MIG = "MIG mode is on: the check needs the whole GPU"


def pattern_of(nonce: str) -> int:
    """The byte written over the GPUs' memory: from the nonce, never 0 (fresh memory)."""
    return hashlib.sha256(nonce.encode()).digest()[0] | 1


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _facts(index: int) -> tuple[GpuInfo, str]:
    """NVML's facts of GPU `index` (as registered) and its PCI bus id."""
    gpu = _nvml_gpu(index)
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return gpu, _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)


def _checked(gpu: GpuInfo, error: str | None = None, **measured: Any) -> CheckedGpu:
    return CheckedGpu(
        error=None if error is None else error[:TEXT_CHARS],
        index=gpu.index,
        uuid=gpu.uuid,
        nvml_name=gpu.nvml_name,
        memory_total_mb=gpu.memory_mb,
        pcie_gen=gpu.pcie_gen,
        pcie_width=gpu.pcie_width,
        mig_mode=gpu.mig_mode,
        **measured,
    )


def check(
    nonce: str,
    skip: Collection[int] = (),
    simulated: bool = False,
    load_driver: Callable[[], Driver] = Driver.load,
    meminfo: Path = Path("/proc/meminfo"),
) -> GpuCheck:
    """The whole check (see the module's docstring)."""
    started = time.monotonic()
    host: dict[str, Any] = {"cpu_count": os.cpu_count(), "memory_mb": memory_mb(meminfo)}

    def answer(error: str | None = None, **kw: Any) -> GpuCheck:
        took = round(time.monotonic() - started, 3)
        return GpuCheck(**host, **kw, error=error and error[:TEXT_CHARS], took_s=took)

    if simulated:
        return answer(simulated=True)
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        return answer(error=f"no NVIDIA driver ({exc or type(exc).__name__})")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        facts = [_facts(i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
    except pynvml.NVMLError as exc:
        return answer(error=f"reading the GPUs through NVML failed ({exc})")
    finally:
        pynvml.nvmlShutdown()
    gpus: list[CheckedGpu] = []
    cu: Driver | None = None
    unavailable: str | None = None
    for gpu, bus_id in facts:
        if gpu.index in skip:
            gpus.append(_checked(gpu, in_use=True))
            continue
        if gpu.mig_mode:
            gpus.append(_checked(gpu, error=MIG))
            continue
        if cu is None and unavailable is None:
            try:
                cu = load_driver()
                cu.init()
            except (CudaUnavailable, CudaError) as exc:
                unavailable = f"CUDA: {exc}"
        if cu is None or unavailable is not None:
            gpus.append(_checked(gpu, error=unavailable))
            continue
        try:
            proved = prove(cu, bus_id, gpu.uuid, pattern_of(nonce))
        except CudaError as exc:
            gpus.append(_checked(gpu, error=str(exc)))
            continue
        gpus.append(
            _checked(
                gpu,
                allocated_mb=proved.allocated // MIB,
                bandwidth_gbps=round(proved.bandwidth_gbps, 1),
            )
        )
    return answer(driver_version=driver, gpus=gpus)


def _indices(text: str) -> set[int]:
    return {int(i) for i in text.split(",") if i.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet_node_agent.gpucheck")
    parser.add_argument("--nonce", required=True, help="the control plane's, for this check")
    parser.add_argument("--skip", type=_indices, default=set(), help="GPUs in use: 0,3")
    parser.add_argument("--simulated", action="store_true", help="this node's GPUs are")
    args = parser.parse_args(argv)
    result = check(args.nonce, args.skip, args.simulated)
    sys.stdout.write(result.model_dump_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
