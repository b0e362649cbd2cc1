"""The GPU catalogue (PRODUCT.md section 9), kept as data in `catalog.json`.

Its "None (CPU only)" row is no GPU model: a CPU-only job (R-JOB-2) names no GPU type and
pays per CPU-hour. `usage_fee_per_cpu_hour` is the usage fee of one CPU-hour on one's own
node (R-BILL-1 has none for CPUs): the development class's GPU-hour fee (0.05) per 4 CPUs,
the smallest CPU-only job, = 0.0125 (services/billing/README.md, "CPU-only jobs").

A GPU type may be written loosely (`models_named`): in any case, without spaces, dashes or
underscores ("a100_80gb", "RTX3090"), or as a short form, a run of the model's words that
holds its model number, its first word with a digit ("H100" for "H100 80GB", "3090" and
"rtx3090" for "RTX 3090", "2080 Ti" for "RTX 2080 Ti"). The short forms are derived from
the names, so a model added to `catalog.json` has them too; one that two models share
("A100": "A100 40GB" and "A100 80GB") names neither.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
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


def name_key(name: str) -> str:
    """A GPU type as names are compared: lower case, without spaces, dashes or underscores."""
    return re.sub(r"[\s_-]+", "", name).lower()


def short_names(model: str) -> set[str]:
    """The `name_key`s of every run of `model`'s words that holds its model number (its
    first word with a digit): "RTX 2080 Ti" -> 2080, rtx2080, 2080ti, rtx2080ti."""
    words = model.split()
    number = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), None)
    if number is None:
        return set()
    return {
        name_key("".join(words[i:j]))
        for i in range(number + 1)
        for j in range(number + 1, len(words) + 1)
    }


def _named(models: list[str]) -> dict[str, tuple[str, ...]]:
    """Each loose name -> the models it may mean (more than one: ambiguous)."""
    out: dict[str, list[str]] = {}
    for m in models:
        for key in short_names(m) | {name_key(m)}:
            out.setdefault(key, []).append(m)
    return {k: tuple(v) for k, v in out.items()}


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GpuModel]
    usage_fee: dict[str, Decimal]
    usage_fee_per_cpu_hour: Decimal = Decimal("0.0125")
    named: dict[str, tuple[str, ...]] = field(default_factory=dict)  # `_named` of the gpus

    def model_names(self) -> list[str]:
        return list(self.gpus)

    def models_named(self, name: str) -> list[str]:
        """The models `name` may mean: itself, the one it spells loosely, or every model it
        is a short form of (none: unknown; several: ambiguous)."""
        if name in self.gpus:
            return [name]
        key = name_key(name)
        spelt = [m for m in self.gpus if name_key(m) == key]
        return spelt or list(self.named.get(key, ()))

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
        gpus=gpus,
        usage_fee=fees,
        usage_fee_per_cpu_hour=Decimal(raw["usage_fee_per_cpu_hour"]),
        named=_named(list(gpus)),
    )
