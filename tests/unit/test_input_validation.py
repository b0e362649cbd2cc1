"""Integers are integers (never a boolean or a string), in the job spec and the other
commands and requests; each refusal names its field and its rule (gpufleet_contracts.fields)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_billing.app import EntriesQuery
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import (
    JobSpec,
    ListJobs,
    StartWorker,
    StopWorker,
    SubmitJob,
)
from gpufleet_contracts.nodes import GpuInfo, RegisterNode
from pydantic import BaseModel, ValidationError

BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}
START: dict[str, Any] = {
    "minion_id": "n1",
    "job_id": "j1",
    "job_name": "hello",
    "worker": 0,
    "command": ["true"],
    "gpu_indices": [0],
    "placement_id": "p1",
}
GPU: dict[str, Any] = {
    "index": 0,
    "uuid": "GPU-1",
    "model": "RTX 3090",
    "nvml_name": "NVIDIA GeForce RTX 3090",
    "memory_mb": 24576,
}
REGISTER: dict[str, Any] = {
    "minion_id": "n1",
    "name": "node-1",
    "region": "local",
    "owner": "acme",
    "hostname": "gpu01",
    "gpus": [GPU],
    "simulated": True,
    "inventory_source": "sim",
    "agent_started_at": datetime.now(UTC).isoformat(),
}


def refusals(model: type[BaseModel], data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """field -> (rule, message) of each error, from JSON as it arrives on the bus."""
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(json.dumps(data))
    return {e.field: (e.rule, e.message) for e in field_errors(info.value, model)}


# --- booleans and strings are not integers ---------------------------------------------


@pytest.mark.parametrize(
    ("field", "rule"),
    [("gpu_count", "R-JOB-2"), ("workers", "R-JOB-5"), ("disk_size_gb", "R-JOB-2")],
)
@pytest.mark.parametrize("value", [True, False, "2", 2.0])
def test_spec_integers_refuse_booleans_strings_and_floats(
    field: str, rule: str, value: object
) -> None:
    errors = refusals(SubmitJob, {"spec": {**BASE, field: value}})
    assert errors[f"spec.{field}"] == (rule, "Input should be a valid integer")


def test_spec_integers_take_json_numbers() -> None:
    spec = SubmitJob.model_validate_json(
        json.dumps({"spec": {**BASE, "gpu_count": 2, "workers": 2, "disk_size_gb": 50}})
    ).spec
    assert (spec.gpu_count, spec.workers, spec.disk_size_gb) == (2, 2, 50)
    assert JobSpec.model_validate({**BASE, "gpu_count": "0.5"}).gpu_fraction is not None
    for field in ("cpu_count", "environment.image_size_gb"):
        data = (
            {**BASE, "cpu_count": True}
            if field == "cpu_count"
            else {**BASE, "environment": {"image": "me/i:1", "image_size_gb": True}}
        )
        assert f"spec.{field}" in refusals(SubmitJob, {"spec": data})


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (StartWorker, {**START, "worker": True}, "worker"),
        (StartWorker, {**START, "gpu_indices": [True]}, "gpu_indices.0"),
        (StartWorker, {**START, "disk_size_gb": "10"}, "disk_size_gb"),
        (StopWorker, {**START, "worker": True, "reason": "x"}, "worker"),
        (ListJobs, {"limit": True}, "limit"),
        (EntriesQuery, {"limit": True}, "limit"),
        (RegisterNode, {**REGISTER, "gpu_shares": True}, "gpu_shares"),
        (RegisterNode, {**REGISTER, "gpus": [{**GPU, "memory_mb": "24576"}]}, "gpus.0.memory_mb"),
        (GpuInfo, {**GPU, "index": False}, "index"),
    ],
)
def test_other_commands_and_requests_refuse_booleans_as_integers(
    model: type[BaseModel], data: dict[str, Any], field: str
) -> None:
    assert field in refusals(model, data)


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (SubmitJob, {"spec": {**BASE, "max_price": True}}, "spec.max_price"),
        (SubmitJob, {"spec": {**BASE, "gpu_fraction": True}}, "spec.gpu_fraction"),
        (RegisterNode, {**REGISTER, "price_per_gpu_hour": True}, "price_per_gpu_hour"),
        (StartWorker, {**START, "gpu_fraction": False}, "gpu_fraction"),
    ],
)
def test_money_and_fractions_refuse_booleans(
    model: type[BaseModel], data: dict[str, Any], field: str
) -> None:
    assert field in refusals(model, data)
    with pytest.raises(ValidationError):  # in Python too, not only from JSON
        model.model_validate(data)
