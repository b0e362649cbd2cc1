"""R-REG-2 / R-REG-3: supported regions and the quota arithmetic."""

from __future__ import annotations

import pytest
from gpufleet_provisioner.quota import (
    Quota,
    consume,
    fits,
    gcp_data,
    instance_needs,
    runnable_by_type,
    runnable_jobs,
)


def q(**limits: float) -> dict[str, Quota]:
    return {m: Quota(m, v, 0.0) for m, v in limits.items()}


AMPLE = {"CPUS": 10_000.0, "LOCAL_SSD_TOTAL_GB": 1_000_000.0}


def test_v100_quota_8_with_cpu_quota_0_runs_nothing() -> None:
    assert runnable_jobs("V100", q(NVIDIA_V100_GPUS=8, CPUS=0, LOCAL_SSD_TOTAL_GB=10_000)) == 0


def test_v100_quota_8_with_ssd_quota_0_runs_nothing() -> None:
    assert runnable_jobs("V100", q(NVIDIA_V100_GPUS=8, CPUS=1000, LOCAL_SSD_TOTAL_GB=0)) == 0


def test_ample_cpu_and_ssd_with_v100_quota_1_runs_one() -> None:
    assert runnable_jobs("V100", q(NVIDIA_V100_GPUS=1, **AMPLE)) == 1


@pytest.mark.parametrize(
    ("gpu", "metric", "k"),
    [
        ("P100", "NVIDIA_P100_GPUS", 6),
        ("V100", "NVIDIA_V100_GPUS", 8),
        ("T4", "NVIDIA_T4_GPUS", 8),
        ("A100 40GB", "NVIDIA_A100_GPUS", 12),
    ],
)
def test_cpus_per_gpu_k(gpu: str, metric: str, k: int) -> None:
    assert gcp_data().gpu_types[gpu].cpus_per_gpu == k
    quotas = q(**{metric: 100, "CPUS": 5 * k + (k - 1), "LOCAL_SSD_TOTAL_GB": 1_000_000})
    assert runnable_jobs(gpu, quotas) == 5


def test_local_ssd_is_375_gb_per_job() -> None:
    quotas = q(NVIDIA_T4_GPUS=100, CPUS=10_000, LOCAL_SSD_TOTAL_GB=375 * 3 + 374)
    assert runnable_jobs("T4", quotas) == 3


def test_available_is_limit_minus_usage() -> None:
    quotas = {
        "NVIDIA_T4_GPUS": Quota("NVIDIA_T4_GPUS", 4, 3),
        "CPUS": Quota("CPUS", 100, 0),
        "LOCAL_SSD_TOTAL_GB": Quota("LOCAL_SSD_TOTAL_GB", 3000, 0),
    }
    assert runnable_jobs("T4", quotas) == 1
    over = {**quotas, "CPUS": Quota("CPUS", 8, 20)}  # usage above limit: 0, never negative
    assert runnable_jobs("T4", over) == 0


def test_unknown_or_missing_types_run_nothing() -> None:
    assert runnable_jobs("RTX 3090", q(**AMPLE)) == 0
    assert runnable_jobs("T4", q(**AMPLE)) == 0  # no T4 quota at all
    assert set(runnable_by_type(q(**AMPLE))) == set(gcp_data().gpu_types)


def test_supported_regions_are_data() -> None:
    regions = gcp_data().regions
    assert len(regions) == 10 and "us-central1" in regions
    assert all(z.startswith(r) for r, zones in regions.items() for z in zones)


def test_fits_and_consume_for_multi_gpu_instances() -> None:
    quotas = q(NVIDIA_V100_GPUS=4, CPUS=32, LOCAL_SSD_TOTAL_GB=750)
    assert instance_needs("V100", 2) == {
        "NVIDIA_V100_GPUS": 2.0,
        "CPUS": 16.0,
        "LOCAL_SSD_TOTAL_GB": 375.0,
    }
    assert fits("V100", 2, quotas) and not fits("V100", 5, quotas)
    after = consume(quotas, instance_needs("V100", 2))
    assert fits("V100", 2, after)
    assert not fits("V100", 1, consume(after, instance_needs("V100", 2)))


def test_machine_types() -> None:
    t = gcp_data().gpu_types
    assert t["V100"].machine_for(1) == "n1-standard-8"
    assert t["A100 40GB"].machine_for(2) == "a2-highgpu-2g"
    assert t["P100"].machine_for(1) == "custom-6-23040"
