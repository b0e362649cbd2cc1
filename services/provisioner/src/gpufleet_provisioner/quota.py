"""R-REG-2 / R-REG-3: the supported GCP regions and the quota arithmetic. Pure.

Runnable jobs in a region for one GPU type = min(available GPUs of that type,
floor(available CPUs / k), floor(available local SSD GB / 375)), where k is the vCPUs an
instance gets per GPU of that type (6 for P100, 8 for V100 and T4, 12 for A100; the others
in `gcp_data.json`). "Available" is a quota's limit minus its usage, never below 0.

An instance with n GPUs needs n GPUs, n * k vCPUs and one 375 GB local SSD.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

CPU_METRIC = "CPUS"
SSD_METRIC = "LOCAL_SSD_TOTAL_GB"


@dataclass(frozen=True)
class GcpGpuType:
    model: str  # catalogue model ("V100")
    accelerator: str  # Compute accelerator type ("nvidia-tesla-v100")
    quota_metric: str  # regional quota ("NVIDIA_V100_GPUS")
    cpus_per_gpu: int  # k of R-REG-3
    machine_type: str  # template: {cpus}, {gpus}, {memory_mb}
    nvml_name: str
    memory_mb: int

    def machine_for(self, gpus: int) -> str:
        cpus = self.cpus_per_gpu * gpus
        return self.machine_type.format(cpus=cpus, gpus=gpus, memory_mb=cpus * 3840)


@dataclass(frozen=True)
class GcpData:
    regions: dict[str, list[str]]  # region -> zones, in order of preference
    gpu_types: dict[str, GcpGpuType]
    local_ssd_gb: int

    def by_accelerator(self, accelerator: str) -> GcpGpuType | None:
        short = accelerator.rsplit("/", 1)[-1]
        return next((t for t in self.gpu_types.values() if t.accelerator == short), None)


@cache
def gcp_data() -> GcpData:
    raw: dict[str, Any] = json.loads(
        resources.files(__package__).joinpath("gcp_data.json").read_text()
    )
    return GcpData(
        regions={k: list(v) for k, v in raw["regions"].items()},
        gpu_types={
            model: GcpGpuType(model=model, **spec) for model, spec in raw["gpu_types"].items()
        },
        local_ssd_gb=int(raw["local_ssd_gb"]),
    )


@dataclass(frozen=True)
class Quota:
    metric: str
    limit: float
    usage: float

    @property
    def available(self) -> float:
        return max(0.0, self.limit - self.usage)


Quotas = Mapping[str, Quota]


def available(quotas: Quotas, metric: str) -> float:
    q = quotas.get(metric)
    return 0.0 if q is None else q.available


def runnable_jobs(gpu_type: str, quotas: Quotas, data: GcpData | None = None) -> int:
    """R-REG-3 for one-GPU jobs of `gpu_type` (0 for a type GCP does not offer)."""
    data = data or gcp_data()
    t = data.gpu_types.get(gpu_type)
    if t is None:
        return 0
    return int(
        min(
            available(quotas, t.quota_metric),
            available(quotas, CPU_METRIC) // t.cpus_per_gpu,
            available(quotas, SSD_METRIC) // data.local_ssd_gb,
        )
    )


def runnable_by_type(quotas: Quotas, data: GcpData | None = None) -> dict[str, int]:
    data = data or gcp_data()
    return {model: runnable_jobs(model, quotas, data) for model in data.gpu_types}


def instance_needs(gpu_type: str, gpus: int, data: GcpData | None = None) -> dict[str, float]:
    """The quota one instance of `gpus` x `gpu_type` takes."""
    data = data or gcp_data()
    t = data.gpu_types[gpu_type]
    return {
        t.quota_metric: float(gpus),
        CPU_METRIC: float(gpus * t.cpus_per_gpu),
        SSD_METRIC: float(data.local_ssd_gb),
    }


def fits(gpu_type: str, gpus: int, quotas: Quotas, data: GcpData | None = None) -> bool:
    data = data or gcp_data()
    if gpu_type not in data.gpu_types:
        return False
    return all(available(quotas, m) >= v for m, v in instance_needs(gpu_type, gpus, data).items())


def consume(quotas: Quotas, needs: Mapping[str, float]) -> dict[str, Quota]:
    """`quotas` after `needs` were used (for planning several instances in one pass)."""
    out = dict(quotas)
    for metric, amount in needs.items():
        q = out.get(metric) or Quota(metric, 0.0, 0.0)
        out[metric] = Quota(metric, q.limit, q.usage + amount)
    return out
