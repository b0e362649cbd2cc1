"""Verified nodes: a node's GPU check against its registration and the catalogue. Pure.

`judge` lists every check, passed or failed, and says whether the node is verified (it may
take other accounts' jobs) and, when not, whether a later check may answer otherwise
(`retry`: no answer, a check that could not run, a GPU busy with a worker) or only a new
registration can (the hardware is not what the node claims).

Memory is in MiB as NVML and CUDA count it; the catalogue's `memory_gb` is decimal, as GPUs
are sold (an "80 GB" card shows about 81,000 MiB). Bandwidth is a device-to-device copy's
bytes read and written per second, in GB/s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.nodes import GpuInfo, HardwareInventory
from gpufleet_contracts.verification import CheckedGpu, GpuCheck

MIB = 1024 * 1024
SIMULATED = "simulated GPUs: nothing to check"

# The lowest device-to-device copy rate a real GPU of each class shows: about 40% of the
# slowest model of the class in the catalogue (GTX 1060 192 GB/s, RTX A4000 448, T4 320),
# room for clocks still ramping up from idle; a copy in host memory, or an emulated
# device, is far below.
BANDWIDTH_FLOOR_GBPS: Mapping[str, float] = {
    "development": 75.0,
    "professional": 180.0,
    "datacenter": 130.0,
}


@dataclass(frozen=True)
class CheckPolicy:
    """How close the check's figures must come to the claim."""

    # What the driver and a CUDA context may keep of a GPU's memory: the check must
    # allocate at least the catalogue's memory for the model less this share.
    memory_margin: float = 0.10
    bandwidth_floor_gbps: Mapping[str, float] = field(
        default_factory=lambda: dict(BANDWIDTH_FLOOR_GBPS)
    )
    # The host's memory as the check read it may fall this far short of the registration's
    # (the same /proc/meminfo; a little may go to the kernel between the two readings).
    host_memory_margin: float = 0.02


@dataclass(frozen=True)
class Claim:
    """What the node's registration claims, as the check is judged against it."""

    gpus: tuple[GpuInfo, ...]
    simulated: bool
    cpu_cores: int | None = None
    memory_mb: int | None = None

    @classmethod
    def of(cls, gpus: Sequence[GpuInfo], simulated: bool, hw: HardwareInventory | None) -> Claim:
        return cls(
            gpus=tuple(gpus),
            simulated=simulated,
            cpu_cores=None if hw is None else hw.cpu_cores,
            memory_mb=None if hw is None else hw.memory_mb,
        )

    def fingerprint(self) -> str:
        """What a check proves, as one hash: a registration with another one has other
        hardware, and is unverified until checked again."""
        facts = {
            "simulated": self.simulated,
            "cpu_cores": self.cpu_cores,
            "memory_mb": self.memory_mb,
            "gpus": [
                [g.index, g.uuid, g.model, g.nvml_name, g.memory_mb, g.pcie_gen, g.pcie_width]
                for g in sorted(self.gpus, key=lambda g: g.index)
            ],
        }
        text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Verdict:
    verified: bool
    reason: str | None  # why not: every failed check, in order
    checks: tuple[str, ...]  # "ok: ..." or "failed: ..." (what `node show` lists)
    retry: bool = False  # not verified, but a later check may answer otherwise

    @classmethod
    def failed(cls, reason: str, *, retry: bool, checks: Sequence[str] = ()) -> Verdict:
        return cls(False, reason, (*checks, f"failed: {reason}"), retry)


def _gb(mib: float) -> str:
    return f"{mib * MIB / 1e9:.1f} GB"


def memory_needed_mb(model: str, policy: CheckPolicy) -> int:
    """The device memory a GPU of `model` must let the check allocate, in MiB."""
    gb = catalog().gpus[model].memory_gb
    return int(gb * 1e9 * (1 - policy.memory_margin) / MIB)


@dataclass
class _Checks:
    passed: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    retry_only: bool = True  # every failure is one a later check may not repeat

    def ok(self, text: str) -> None:
        self.passed.append(f"ok: {text}")

    def fail(self, text: str, *, retry: bool = False) -> None:
        self.passed.append(f"failed: {text}")
        self.failures.append(text)
        self.retry_only = self.retry_only and retry

    def verdict(self) -> Verdict:
        if not self.failures:
            return Verdict(True, None, tuple(self.passed))
        return Verdict(False, "; ".join(self.failures), tuple(self.passed), self.retry_only)


def _gpu(
    want: GpuInfo,
    got: CheckedGpu,
    policy: CheckPolicy,
    proved: Collection[str],
    out: _Checks,
) -> None:
    """One registered GPU against what the check found of the GPU of the same UUID."""
    name = f"GPU {want.index} ({want.uuid})"
    model = want.model
    found_model = catalog().from_nvml_name(got.nvml_name)
    if model is None or model not in catalog().gpus:
        out.fail(f"{name}: {want.nvml_name!r} is no catalogue model")
        return
    if found_model != model:
        out.fail(f"{name}: NVML names it {got.nvml_name!r}, registered as {model}")
        return
    if got.index != want.index:
        out.fail(f"{name}: at NVML index {got.index}, registered at {want.index}")
    if got.memory_total_mb < want.memory_mb:
        out.fail(f"{name}: NVML reports {got.memory_total_mb} MiB, registered {want.memory_mb} MiB")
    link = (got.pcie_gen, got.pcie_width)
    if (want.pcie_gen, want.pcie_width) != (None, None) and link != (
        want.pcie_gen,
        want.pcie_width,
    ):
        out.fail(
            f"{name}: PCIe gen {got.pcie_gen} x{got.pcie_width}, registered gen "
            f"{want.pcie_gen} x{want.pcie_width}"
        )
    if got.in_use:
        if want.uuid in proved:
            out.ok(f"{name}: in use by a worker, not measured again (proved before)")
        else:
            out.fail(f"{name}: in use by a worker, not measured (checked when free)", retry=True)
        return
    if got.error:
        out.fail(f"{name}: {got.error}", retry=True)
        return
    need = memory_needed_mb(model, policy)
    allocated = got.allocated_mb or 0
    spec_gb = catalog().gpus[model].memory_gb
    if allocated < need:
        out.fail(
            f"{name}: {_gb(allocated)} allocated; a {model} has {spec_gb} GB "
            f"(at least {_gb(need)} must be)"
        )
    else:
        out.ok(f"{name}: {model}, {_gb(allocated)} allocated and written (>= {_gb(need)})")
    gpu_class = catalog().gpus[model].gpu_class
    floor = policy.bandwidth_floor_gbps.get(gpu_class, 0.0)
    bandwidth = got.bandwidth_gbps or 0.0
    if bandwidth < floor:
        out.fail(f"{name}: memory bandwidth {bandwidth:.0f} GB/s, below {floor:.0f} GB/s")
    else:
        out.ok(f"{name}: memory bandwidth {bandwidth:.0f} GB/s (>= {floor:.0f} GB/s)")


def judge(
    claim: Claim,
    found: GpuCheck,
    policy: CheckPolicy | None = None,
    proved: Collection[str] = (),
) -> Verdict:
    """Whether `found` bears out `claim`. `proved`: UUIDs of GPUs an earlier check of the
    same hardware proved (a GPU busy with a worker now is not measured again)."""
    policy = policy or CheckPolicy()
    if claim.simulated or found.simulated:
        why = SIMULATED if claim.simulated else "the check found simulated GPUs"
        return Verdict(False, why, (f"failed: {why}",), retry=False)
    out = _Checks()
    if found.error and not found.gpus:
        if claim.gpus:
            # No driver, or the check could not run: no GPU of the claim is there to sell.
            out.fail(f"the check found no GPUs: {found.error}", retry=True)
            return out.verdict()
        out.ok(f"no GPUs registered, none found ({found.error})")
    elif found.error:
        out.fail(f"the check failed: {found.error}", retry=True)
    by_uuid = {g.uuid: g for g in found.gpus}
    if len(found.gpus) != len(claim.gpus) or len(by_uuid) != len(found.gpus):
        out.fail(f"{len(found.gpus)} GPUs found, {len(claim.gpus)} registered")
    elif claim.gpus:
        out.ok(f"{len(claim.gpus)} GPUs, the UUIDs registered")
    for want in sorted(claim.gpus, key=lambda g: g.index):
        got = by_uuid.get(want.uuid)
        if got is None:
            out.fail(f"GPU {want.index} ({want.uuid}): not found")
            continue
        _gpu(want, got, policy, proved, out)
    if claim.cpu_cores is not None:
        seen = found.cpu_count or 0
        if seen < claim.cpu_cores:
            out.fail(f"{seen} CPUs seen, {claim.cpu_cores} registered")
        else:
            out.ok(f"{seen} CPUs (>= {claim.cpu_cores} registered)")
    if claim.memory_mb is not None:
        seen = found.memory_mb or 0
        need = int(claim.memory_mb * (1 - policy.host_memory_margin))
        if seen < need:
            out.fail(f"{seen} MiB of memory seen, {claim.memory_mb} MiB registered")
        else:
            out.ok(f"{seen} MiB of memory (registered {claim.memory_mb} MiB)")
    return out.verdict()


def unanswered(deadline_s: float) -> Verdict:
    """No answer in time: the node agent is stopped, too old to know the check, or slow."""
    return Verdict.failed(
        f"no answer to the GPU check within {deadline_s:.0f} s "
        "(the node agent is stopped, too old to run it, or was too slow)",
        retry=True,
    )


def late(by_s: float) -> Verdict:
    """An answer that came after the check's deadline."""
    return Verdict.failed(f"the GPU check was answered {by_s:.0f} s after its deadline", retry=True)


def changed() -> Verdict:
    """The node registered other hardware than its last check saw."""
    return Verdict.failed("its hardware changed since it was checked; checking again", retry=True)
