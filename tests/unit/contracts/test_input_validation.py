"""Integers are integers (never a boolean or a string) and names print (no control or format
characters), in the job spec and the other commands and requests; each refusal names its
field and its rule (gpufleet_contracts.fields)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.billing import EntriesQuery
from gpufleet_contracts.fields import NAME_RULE, name_problem
from gpufleet_contracts.jobs import (
    EnqueueJob,
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


# --- names print ---------------------------------------------------------------------------

BAD_NAMES = {
    "NUL": "team\x00a",
    "ESC": "team\x1b[31ma",
    "newline": "team\na",
    "right-to-left override": "team\u202ea",
    "zero-width space": "team\u200ba",
    "private use": "team\ue000",
    "unassigned": "team\u0378",
    "line separator": "team\u2028a",
    "paragraph separator": "team\u2029a",
    "leading space": " team",
    "trailing tab": "team\t",
}
GOOD_NAMES = ["team-a", "PASCAL VOC 2012", "Größe", "名前", "a\u00a0b", "x.y_z"]


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_a_project_name_refuses_control_and_format_characters(name: str) -> None:
    rule, message = refusals(SubmitJob, {"spec": {**BASE, "project": name}})["spec.project"]
    assert rule == "schema:name_chars"
    assert "Unicode Cc, Cf, Cs, Co, Cn, Zl, Zp" in message and NAME_RULE in message
    assert message.isprintable()  # names the character, never prints it


def test_the_refusal_names_the_character_and_where_it_is() -> None:
    assert name_problem("team\u202ea") == "U+202E RIGHT-TO-LEFT OVERRIDE at position 4"
    assert name_problem("a\x00") == "U+0000 at position 1"
    assert name_problem(" a") == "leading or trailing whitespace"
    # pydantic refuses a lone surrogate before this check can (not valid UTF-8 text).
    assert name_problem("a\ud800") == "U+D800 at position 1"


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_names_in_any_script_with_inner_spaces_are_names(name: str) -> None:
    assert JobSpec.model_validate({**BASE, "project": name}).project == name
    assert name_problem(name) is None


@pytest.mark.parametrize(
    ("model", "data", "field", "rule"),
    [
        # a name with a pattern of its own: the pattern refuses it first, under its rule
        (SubmitJob, {"spec": {**BASE, "name": "hello\u202e"}}, "spec.name", "R-JOB-2"),
        (
            SubmitJob,
            {"spec": {**BASE, "datasets": [{"name": "coco\n"}]}},
            "spec.datasets.0.name",
            "R-JOB-3",
        ),
        (SubmitJob, {"spec": {**BASE, "env": {"A\u200b": "1"}}}, "spec.env", "R-JOB-7"),
        # the pattern allows spaces, the name rule no trailing one
        (SubmitJob, {"spec": {**BASE, "name": "hello "}}, "spec.name", "schema:name_chars"),
        (SubmitJob, {"spec": {**BASE, "region": "eu\u200b"}}, "spec.region", "schema:name_chars"),
        (
            SubmitJob,
            {
                "spec": {
                    **BASE,
                    "type": "notebook",
                    "reservation": {"region": "r1", "name": "port\x1b80"},
                }
            },
            "spec.reservation.name",
            "schema:name_chars",
        ),
        (
            SubmitJob,
            {
                "spec": {
                    **BASE,
                    "output_data": {
                        "type": "regional_datastore",
                        "path": "/o",
                        "datastore": "nas\u2028",
                        "region": "r1",
                    },
                }
            },
            "spec.output_data.datastore",
            "schema:name_chars",
        ),
        (
            SubmitJob,
            {"spec": {**BASE, "environment": {"packages": {"pip": ["numpy\u202e"]}}}},
            "spec.environment.packages.pip.0",
            "schema:name_chars",
        ),
        (EnqueueJob, {"request_id": "r\x00", "spec": BASE}, "request_id", "schema:name_chars"),
        (RegisterNode, {**REGISTER, "name": "node\u202e1"}, "name", "schema:name_chars"),
        (RegisterNode, {**REGISTER, "region": "local\n"}, "region", "schema:name_chars"),
        (
            StartWorker,
            {**START, "mounts": [{"target": "/opt/ml/in\x00", "kind": "input", "source": "x"}]},
            "mounts.0.target",
            "schema:name_chars",
        ),
        (StartWorker, {**START, "job_name": "\u202ehello"}, "job_name", "schema:name_chars"),
    ],
)
def test_every_name_like_field_refuses_them_naming_field_and_rule(
    model: type[BaseModel], data: dict[str, Any], field: str, rule: str
) -> None:
    assert refusals(model, data)[field][0] == rule


def test_commands_and_environment_values_are_free_text_but_never_nul() -> None:
    spec = JobSpec.model_validate(
        {**BASE, "command": ["python", "-c", "print(1)\nprint(2)"], "env": {"A": "x\ny\u202e"}}
    )
    assert spec.command[2] == "print(1)\nprint(2)"
    errors = refusals(SubmitJob, {"spec": {**BASE, "command": ["python", "a\x00b"]}})
    assert errors["spec.command.1"][0] == "schema:nul_char"
    assert "NUL" in errors["spec.command.1"][1]
    assert "spec.env.A" in refusals(SubmitJob, {"spec": {**BASE, "env": {"A": "\x00"}}})
    assert "command.0" in refusals(StartWorker, {**START, "command": ["\x00"]})
