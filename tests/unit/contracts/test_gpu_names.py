"""GPU types written loosely or short (R-JOB-2): one catalogue model each, stored by its
catalogue name; a name two models share is refused with both as what would be valid."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.catalog import catalog, name_key, short_names
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from pydantic import ValidationError

BASE: dict[str, Any] = {"name": "hello", "command": ["true"]}


def test_the_short_names_are_the_runs_of_words_that_hold_the_model_number() -> None:
    assert short_names("RTX 2080 Ti") == {"2080", "rtx2080", "2080ti", "rtx2080ti"}
    assert short_names("A100 80GB") == {"a100", "a10080gb"}
    assert short_names("T4") == {"t4"}
    assert short_names("Mystery") == set()  # no model number: only its own name
    assert name_key(" A100-80GB_x ") == "a10080gbx"


@pytest.mark.parametrize(
    ("written", "model"),
    [
        ("H100", "H100 80GB"),
        ("h100", "H100 80GB"),
        ("H100 80GB", "H100 80GB"),
        ("A100-80GB", "A100 80GB"),
        ("a100_80gb", "A100 80GB"),
        ("a100 40gb", "A100 40GB"),
        ("rtx3090", "RTX 3090"),
        ("3090", "RTX 3090"),
        ("RTX-3090", "RTX 3090"),
        ("2080ti", "RTX 2080 Ti"),
        ("rtx 2060 super", "RTX 2060 Super"),
        ("a6000", "RTX A6000"),
        ("t4", "T4"),
        ("gtx1060", "GTX 1060"),
    ],
)
def test_a_loose_or_short_name_stands_for_its_one_model(written: str, model: str) -> None:
    assert catalog().models_named(written) == [model]
    assert JobSpec.model_validate({**BASE, "gpu_types": [written]}).gpu_types == [model]


def test_the_stored_spec_has_the_catalogue_names_once_each() -> None:
    spec = JobSpec.model_validate({**BASE, "gpu_types": ["H100", "h100 80gb", "3090", "T4"]})
    assert spec.gpu_types == ["H100 80GB", "RTX 3090", "T4"]
    assert spec.model_dump(exclude_defaults=True)["gpu_types"] == spec.gpu_types
    assert JobSpec.model_validate(spec.model_dump()) == spec  # read back the same


def errors(gpu_types: list[str]) -> list[tuple[str, str, str | None, str]]:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({"spec": {**BASE, "gpu_types": gpu_types}})
    return [(e.field, e.rule, e.valid, e.message) for e in field_errors(info.value)]


def test_an_ambiguous_name_is_refused_with_its_candidates() -> None:
    [(field, rule, valid, message)] = errors(["A100"])
    assert (field, rule, valid) == ("spec.gpu_types", "R-JOB-2", "A100 40GB, A100 80GB")
    assert "A100 could be A100 40GB or A100 80GB" in message
    assert catalog().models_named("a-100") == ["A100 40GB", "A100 80GB"]


@pytest.mark.parametrize("written", ["80GB", "H100 SXM", "rtx", "super", "4000", "A100 80"])
def test_a_name_of_no_model_is_unknown(written: str) -> None:
    [(field, rule, valid, message)] = errors([written])
    assert (field, rule) == ("spec.gpu_types", "R-JOB-2")
    assert valid is not None and "H100 80GB" in valid and "unknown" in message
