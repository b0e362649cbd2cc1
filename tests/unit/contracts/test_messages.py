"""Contracts: validation names field and rule; wire format; tolerance of new fields."""

import json
from datetime import UTC, datetime

import pytest
from gpufleet_contracts import Envelope, envelope_for, field_errors
from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.jobs import JobQueued, JobSpec, StartWorker, SubmitJob
from pydantic import ValidationError


def errors_of(**spec: object) -> dict[str, tuple[str, str | None]]:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({"spec": spec})
    return {e.field: (e.rule, e.valid) for e in field_errors(info.value)}


BASE = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}


def test_disk_size_below_10_names_field_and_rule() -> None:
    errs = errors_of(**{**BASE, "disk_size_gb": 5})
    assert errs["spec.disk_size_gb"] == ("R-JOB-2", "10..1000 GB per worker")


def test_unknown_gpu_type_lists_the_valid_ones() -> None:
    errs = errors_of(**{**BASE, "gpu_types": ["RTX 9999"]})
    rule, valid = errs["spec.gpu_types"]
    assert rule == "R-JOB-2" and valid is not None and "RTX 3090" in valid


def test_negative_price_and_every_other_failure_reported_together() -> None:
    errs = errors_of(**{**BASE, "max_price": "-1", "disk_size_gb": 2000, "cpu_count": 6})
    assert set(errs) == {"spec.max_price", "spec.disk_size_gb", "spec.cpu_count"}
    assert all(rule == "R-JOB-2" for rule, _ in errs.values())


def test_a_job_needs_gpus_or_cpus() -> None:
    errs = errors_of(**{**BASE, "gpu_count": 0})
    assert any(rule == "R-JOB-2" for rule, _ in errs.values())


def test_unknown_fields_in_a_spec_are_refused_but_messages_tolerate_them() -> None:
    errs = errors_of(**{**BASE, "gpu_typo": ["x"]})
    assert "spec.gpu_typo" in errs
    # A newer producer may add fields to an event: an older consumer still reads it.
    evt = JobQueued(
        job_id="j",
        owner="a",
        creator="a",
        spec=JobSpec.model_validate(BASE),
        queued_at=datetime.now(UTC),
    )
    data = json.loads(evt.to_bytes())
    data["added_in_v2"] = {"x": 1}
    assert JobQueued.from_bytes(json.dumps(data)).job_id == "j"


def test_subjects_fill_their_placeholders() -> None:
    cmd = StartWorker(
        minion_id="gpu-7",
        job_id="j",
        job_name="n",
        worker=0,
        command=["x"],
        gpu_indices=[0],
        placement_id="p",
    )
    assert cmd.subject() == "gpufleet.v1.cmd.node.gpu-7.start_worker"


def test_cloudevents_headers_round_trip_and_id_is_the_dedup_key() -> None:
    cmd = StartWorker(
        minion_id="m",
        job_id="j",
        job_name="n",
        worker=0,
        command=["x"],
        gpu_indices=[0],
        placement_id="p",
    )
    env = envelope_for(cmd, source="gpufleet/test", id="abc")
    h = env.headers()
    assert h["ce-id"] == h["Nats-Msg-Id"] == "abc"
    assert h["ce-specversion"] == "1.0" and h["ce-type"] == "gpufleet.node.start_worker.v1"
    back = Envelope.from_headers(h)
    assert back is not None and back.id == "abc" and back.subject == cmd.subject()


@pytest.mark.parametrize(
    "nvml,model",
    [
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("Some Other GPU", None),
    ],
)
def test_catalogue_maps_nvml_names(nvml: str, model: str | None) -> None:
    assert catalog().from_nvml_name(nvml) == model
