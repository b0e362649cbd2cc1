"""The GPU catalogue (PRODUCT.md section 9), kept as data in `catalog.json`.

Its "None (CPU only)" row is no GPU model: a CPU-only job (R-JOB-2) names no GPU type and
pays per CPU-hour. `usage_fee_per_cpu_hour` is the usage fee of one CPU-hour on one's own
node (R-BILL-1 has none for CPUs): the development class's GPU-hour fee (0.05) per 4 CPUs,
the smallest CPU-only job, = 0.0125 (services/billing/README.md, "CPU-only jobs").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class GpuModel:
    model: str
    memory_gb: int
    gpu_class: str  # development | professional | datacenter
    fp32_tflops: Decimal | None
    fp16_tflops: Decimal | None
    nvml_patterns: tuple[str, ...]


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GpuModel]
    usage_fee: dict[str, Decimal]
    usage_fee_per_cpu_hour: Decimal = Decimal("0.0125")

    def model_names(self) -> list[str]:
        return list(self.gpus)

    def usage_fee_per_gpu_hour(self, model: str) -> Decimal:
        """R-BILL-1: the usage fee of `model`'s class, per GPU-hour."""
        return self.usage_fee[self.gpus[model].gpu_class]

    def from_nvml_name(self, nvml_name: str) -> str | None:
        """Catalogue model of an NVML device name ("NVIDIA GeForce RTX 3090" -> "RTX 3090")."""
        name = " " + nvml_name.upper().replace("NVIDIA", "").strip()
        # Longest pattern first, so "A100-SXM4-80GB" wins over a shorter, looser one.
        candidates = [(p, g.model) for g in self.gpus.values() for p in g.nvml_patterns]
        for pattern, model in sorted(candidates, key=lambda c: -len(c[0])):
            if pattern.upper() in name:
                return model
        return None


def _dec(v: object) -> Decimal | None:
    return None if v is None else Decimal(str(v))


@cache
def catalog() -> Catalog:
    raw = json.loads(resources.files(__package__).joinpath("catalog.json").read_text())
    gpus = {
        g["model"]: GpuModel(
            model=g["model"],
            memory_gb=int(g["memory_gb"]),
            gpu_class=g["class"],
            fp32_tflops=_dec(g["fp32_tflops"]),
            fp16_tflops=_dec(g["fp16_tflops"]),
            nvml_patterns=tuple(g["nvml_patterns"]),
        )
        for g in raw["gpus"]
    }
    fees = {k: Decimal(v) for k, v in raw["usage_fee_per_gpu_hour"].items()}
    return Catalog(
        gpus=gpus, usage_fee=fees, usage_fee_per_cpu_hour=Decimal(raw["usage_fee_per_cpu_hour"])
    )
