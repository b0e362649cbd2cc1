"""The GPU check on a real GPU (skipped where there is no NVIDIA driver or no GPU): run as
the agent runs it, it proves each GPU's memory and bandwidth, and the provisioner's rules
verify this machine's own registration from it, and refuse a claim of another model.

What a GPU machine run shows (services/node-agent/README.md, "GPU check"): each GPU's
allocated MiB and copy bandwidth, and the check's time, printed by the first test.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pynvml
import pytest
from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.verification import GpuCheck, VerifyGpus
from gpufleet_node_agent.host.cuda import CudaUnavailable, Driver
from gpufleet_node_agent.host.gpuchecks import GpuChecks
from gpufleet_node_agent.host.inventory import NvmlUnavailable, read_nvml
from gpufleet_provisioner.verification import (
    BANDWIDTH_FLOOR_GBPS,
    CheckPolicy,
    Claim,
    judge,
    memory_needed_mb,
)


def _gpus() -> int:
    try:
        inventory = read_nvml()
        Driver.load()
    except (NvmlUnavailable, CudaUnavailable, pynvml.NVMLError):
        return 0
    return len(inventory.gpus)


pytestmark = pytest.mark.skipif(_gpus() == 0, reason="no NVIDIA driver, CUDA library or GPU")


def run_check(*args: str) -> GpuCheck:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet_node_agent.gpucheck", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return GpuCheck.model_validate(json.loads(out.stdout))


def test_each_gpu_is_proved_and_this_machines_registration_is_verified() -> None:
    inventory = read_nvml()
    found = run_check("--nonce", secrets.token_urlsafe(32))
    print(found.model_dump_json(indent=2))  # the figures of this GPU machine
    assert found.error is None and len(found.gpus) == len(inventory.gpus)
    for registered, got in zip(inventory.gpus, found.gpus, strict=True):
        assert (got.uuid, got.nvml_name, got.memory_total_mb) == (
            registered.uuid,
            registered.nvml_name,
            registered.memory_mb,
        )
        assert got.error is None, got.error
        assert got.allocated_mb is not None and got.bandwidth_gbps is not None
        if registered.model in catalog().gpus:
            assert got.allocated_mb >= memory_needed_mb(registered.model, CheckPolicy())
            floor = BANDWIDTH_FLOOR_GBPS[catalog().gpus[registered.model].gpu_class]
            assert got.bandwidth_gbps >= floor
        # and most of what NVML says it has: the check really took the memory
        assert got.allocated_mb >= 0.8 * got.memory_total_mb
    claim = Claim.of(inventory.gpus, False, inventory.hardware)
    verdict = judge(claim, found)
    assert verdict.verified, verdict.checks


def test_a_claim_of_another_model_or_more_gpus_is_not_verified() -> None:
    inventory = read_nvml()
    found = run_check("--nonce", secrets.token_urlsafe(32))
    first = inventory.gpus[0]
    bigger = "H200" if first.model != "H200" else "GTX 1060"
    forged = first.model_copy(update={"model": bigger, "nvml_name": f"NVIDIA {bigger}"})
    claim = Claim.of([forged, *inventory.gpus[1:]], False, inventory.hardware)
    assert not judge(claim, found).verified
    extra = first.model_copy(update={"index": 99, "uuid": "GPU-not-there"})
    assert not judge(Claim.of([*inventory.gpus, extra], False, None), found).verified


def test_a_gpu_in_use_is_left_alone_and_the_agent_answers_in_time() -> None:
    found = run_check("--nonce", secrets.token_urlsafe(32), "--skip", "0")
    assert found.gpus[0].in_use and found.gpus[0].allocated_mb is None

    class Kept:
        messages: list[bytes] = []

        async def publish(self, message: bytes, subject: str, **kw: object) -> None:
            self.messages.append(message)

    cmd = VerifyGpus(
        minion_id="gpu-box",
        check_id="c" * 32,
        nonce=secrets.token_urlsafe(32),
        timeout_s=240,
        deadline=datetime.now(UTC) + timedelta(seconds=300),
    )
    checks = GpuChecks("gpu-box", Kept(), simulated=lambda: False, in_use=set)
    result = asyncio.run(checks.run(cmd))
    assert result.error is None and all(g.error is None for g in result.gpus)
    assert result.took_s is not None and result.took_s < cmd.timeout_s
