"""Which mounts of a job `gpufleet job connect` sends and receives: its `local` inputs, model
code and output, by the mount a node asks for, with the path as the spec wrote it."""

from __future__ import annotations

from gpufleet_contracts.jobs import JobSpec
from gpufleet_scheduler.localdata import local_mounts


def spec(**kw: object) -> JobSpec:
    base = {"name": "fit", "type": "inference", "gpu_types": ["RTX 3090"], "command": ["true"]}
    return JobSpec.model_validate({**base, **kw})


def test_local_input_model_and_output_are_the_jobs_local_mounts() -> None:
    found = local_mounts(
        spec(
            input_data={"type": "local", "path": "~/data"},
            model={"source": "local", "path": "$CODE/model"},
            output_data={"type": "local", "path": "/results"},
        )
    )
    assert [(m.mount, m.path, m.direction, m.state) for m in found] == [
        ("/opt/ml/input", "~/data", "input", "waiting"),
        ("/opt/ml/models", "$CODE/model", "input", "waiting"),
        ("output", "/results", "output", "waiting"),
    ]


def test_a_job_without_local_data_has_none() -> None:
    assert local_mounts(spec(input_data={"type": "aws", "path": "s3://b/k"})) == []
