"""The full job specification (R-JOB-1..7, R-RES-1..3, R-SCHED-4): every refusal names the
field, the rule and what would be valid; file, flags and events share this validation."""

from typing import Any

import pytest
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from gpufleet_scheduler import jobrequest
from pydantic import ValidationError

BASE: dict[str, Any] = {"name": "hello", "gpu_types": ["RTX 3090"], "command": ["true"]}


class Errors(dict[str, tuple[str, str | None]]):
    """Field -> (rule, valid); a missing key finds the first field under it."""

    def __missing__(self, key: str) -> tuple[str, str | None]:
        for k, v in self.items():
            if k.startswith(key + "."):
                return v
        raise KeyError(key)


def errors_of(**spec: Any) -> Errors:
    with pytest.raises(ValidationError) as info:
        SubmitJob.model_validate({"spec": {**BASE, **spec}})
    return Errors({e.field: (e.rule, e.valid) for e in field_errors(info.value)})


def ok(**spec: Any) -> JobSpec:
    return JobSpec.model_validate({**BASE, **spec})


def test_job_types_r_job_1() -> None:
    assert errors_of(type="batch")["spec.type"][0] == "R-JOB-1"
    assert ok(type="inference").type == "inference"


@pytest.mark.parametrize(
    ("field", "value"),
    [("disk_size_gb", 5), ("disk_size_gb", 1001), ("cpu_count", 6), ("max_price", "-1")],
)
def test_resources_r_job_2(field: str, value: Any) -> None:
    assert errors_of(**{field: value})[f"spec.{field}"][0] == "R-JOB-2"


@pytest.mark.parametrize("types", [None, [], ["None"], ["None (CPU only)"]])
def test_a_cpu_only_job_names_no_gpu_type_r_job_2(types: Any) -> None:
    spec = ok(gpu_types=types, gpu_count=0, cpu_count=8)
    assert spec.gpu_types == [] and spec.cpu_only and spec.cpu_count == 8
    assert jobrequest.of_spec(spec).cpu_count == 8
    # stored without its (default) empty gpu_types, read back the same
    assert JobSpec.model_validate(jobrequest.stored_spec(spec)) == spec


def test_cpu_only_and_gpu_fields_do_not_mix_r_job_2() -> None:
    rule, valid = errors_of(gpu_count=0, cpu_count=8)["spec.gpu_types"]  # BASE names a GPU
    assert rule == "R-JOB-2" and valid and "gpu_types: []" in valid
    assert errors_of(cpu_count=8)["spec.cpu_count"][0] == "R-JOB-2"  # a GPU job's
    rule, valid = errors_of(gpu_types=None)["spec.gpu_types"]  # a GPU job without a type
    assert rule == "R-JOB-2" and valid and "RTX 3090" in valid
    assert errors_of(gpu_types=["None"], gpu_count=0)["spec"][0] == "R-JOB-2"  # no cpu_count


@pytest.mark.parametrize("cpus", [5, 6, 7, 10, 14, 18, 254])
def test_a_cpu_only_jobs_cpu_count_is_a_multiple_of_4_r_job_2(cpus: int) -> None:
    """CPU-only specs within 4..256, where no other rule refuses cpu_count: only the
    multiple-of-4 rule does."""
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({**BASE, "gpu_types": None, "gpu_count": 0, "cpu_count": cpus})
    (err,) = field_errors(info.value)
    assert (err.field, err.rule, err.valid) == ("cpu_count", "R-JOB-2", "4, 8, 12, ...")
    assert err.message == f"cpu_count must be a multiple of 4, got {cpus}"


@pytest.mark.parametrize("cpus", [4, 8, 12, 64])
def test_a_cpu_only_job_with_a_multiple_of_4_cpus_is_accepted(cpus: int) -> None:
    assert ok(gpu_types=None, gpu_count=0, cpu_count=cpus).cpu_count == cpus


def test_fractional_gpu_r_sched_4() -> None:
    spec = ok(gpu_count="0.25")
    assert spec.gpu_count == 1 and str(spec.gpu_fraction) == "0.25"
    assert errors_of(gpu_count=2, gpu_fraction="0.5")["spec.gpu_fraction"][0] == "R-SCHED-4"
    assert errors_of(gpu_fraction="1.5")["spec.gpu_fraction"][0] == "R-SCHED-4"


def test_datasets_r_job_3() -> None:
    assert len(ok(datasets=[{"name": "PASCAL VOC"}, {"name": "coco"}]).datasets) == 2
    rule, valid = errors_of(type="inference", datasets=[{"name": "x"}])["spec.datasets"]
    assert rule == "R-JOB-3" and valid and "notebook" in valid
    dup = errors_of(datasets=[{"name": "a b"}, {"name": "a_b"}])
    assert dup["spec.datasets"][0] == "R-JOB-3"


@pytest.mark.parametrize(
    ("kind", "path", "good"),
    [
        ("aws", "s3://b/x", True),
        ("aws", "https://b/x", False),
        ("azure", "https://a.blob.core.windows.net/c", True),
        ("gcp", "gs://b/x", True),
        ("gcp", "s3://b/x", False),
        ("local", "~/data", True),
        ("local", "$DATA/x", True),
        ("local", "./data", False),
        ("web", "ftps://h/x.tar", True),
        ("web", "file:///x", False),
    ],
)
def test_input_paths_follow_their_type_r_job_3(kind: str, path: str, good: bool) -> None:
    spec = {"type": "inference", "input_data": {"type": kind, "path": path}}
    if good:
        ok(**spec)
    else:
        rule, valid = errors_of(**spec)["spec.input_data"]
        assert rule == "R-JOB-3" and valid


def test_wasabi_needs_an_endpoint_and_web_is_input_only() -> None:
    e = errors_of(type="inference", input_data={"type": "wasabi", "path": "s3://b"})
    assert e["spec.input_data"][0] == "R-JOB-3"
    ok(type="inference", input_data={"type": "wasabi", "path": "s3://b", "endpoint": "https://w"})
    assert errors_of(output_data={"type": "web", "path": "https://x"})["spec.output_data"][0] == (
        "R-JOB-3"
    )


def test_platform_output_is_model_dataset_or_checkpoint() -> None:
    ok(output_data={"type": "platform", "path": "model"})
    rule, valid = errors_of(output_data={"type": "platform", "path": "bucket"})["spec.output_data"]
    assert rule == "R-JOB-3" and valid == "model, dataset, checkpoint"
    assert errors_of(type="notebook", output_data={"type": "platform", "path": "model"})[
        "spec.output_data"
    ][0] == ("R-JOB-3")


def test_regional_datastore_stays_inside_its_root_r_res_2() -> None:
    good = {"type": "regional_datastore", "path": "/sub", "datastore": "nas", "region": "r1"}
    assert ok(output_data=good).pinned_region == "r1"
    for path in ("/a/../../etc", "/a/%2e%2e/x", "/a\x00b"):
        e = errors_of(output_data={**good, "path": path})
        assert e["spec.output_data"][0] == "R-RES-2"


def test_model_code_and_checkpoints_r_job_4() -> None:
    ok(model={"source": "git", "path": "git@github.com:me/repo.git"})
    assert errors_of(model={"source": "git", "path": "ftp://x"})["spec.model"][0] == "R-JOB-4"
    assert errors_of(checkpoints=[{"name": "My Ck"}, {"name": "My_Ck"}])["spec.checkpoints"][0] == (
        "R-JOB-4"
    )


def test_workers_r_job_5() -> None:
    assert errors_of(type="notebook", workers=2)["spec.workers"][0] == "R-JOB-5"
    spec = ok(workers=2, command=[], worker_commands=[["a"], ["b"]])
    assert spec.command_for(1) == ["b"]
    assert errors_of(workers=2, command=[], worker_commands=[["a"]])["spec.worker_commands"][0] == (
        "R-JOB-5"
    )
    assert errors_of(command=[])["spec.command"][0] == "R-JOB-5"


ROUTE = {"path": "/predict", "file": "app/predict.py", "function": "predict"}
MODEL = {"source": "git", "path": "https://github.com/me/m.git"}


def test_endpoints_r_job_6() -> None:
    ok(type="endpoint", command=[], model=MODEL, endpoint={"routes": [ROUTE]})
    ok(type="endpoint", command=[], endpoint={"server_command": ["nginx"]})
    e = errors_of(type="endpoint", command=[])
    assert e["spec.endpoint"][0] == "R-JOB-6"
    both = {"routes": [ROUTE], "server_command": ["x"]}
    assert errors_of(type="endpoint", model=MODEL, endpoint=both)["spec.endpoint"][0] == "R-JOB-6"
    twice = {"routes": [ROUTE, ROUTE]}
    assert errors_of(type="endpoint", model=MODEL, endpoint=twice)["spec.endpoint"][0] == "R-JOB-6"


@pytest.mark.parametrize(
    "route",
    [
        {**ROUTE, "verb": "GET"},
        {**ROUTE, "file": "../x.py"},
        {**ROUTE, "file": "x.txt"},
        {**ROUTE, "body": [{"name": "a", "type": "string"}, {"name": "a", "type": "integer"}]},
        {**ROUTE, "body": [{"name": "a", "type": "string", "optional": True}]},
        {**ROUTE, "body": [{"name": "a", "type": "integer", "optional": True, "default": "null"}]},
        {**ROUTE, "body": [{"name": "a", "type": "integer", "optional": True, "default": "'x'"}]},
    ],
)
def test_bad_routes_r_job_6(route: dict[str, Any]) -> None:
    e = errors_of(type="endpoint", command=[], model=MODEL, endpoint={"routes": [route]})
    assert any(rule == "R-JOB-6" for rule, _ in e.values()), e


def test_optional_parameter_with_a_python_literal_default() -> None:
    body = [{"name": "k", "type": "integer", "optional": True, "default": "None"}]
    ok(type="endpoint", command=[], model=MODEL, endpoint={"routes": [{**ROUTE, "body": body}]})


def test_environment_r_job_7() -> None:
    spec = ok(environment={"python_version": "3.11", "framework": "pytorch", "keys": ["aws"]})
    assert spec.environment.packages.INSTALL_ORDER == ("apt", "conda", "requirements.txt", "pip")
    assert errors_of(environment={"python_version": "2.7"})["spec.environment"][0] == "R-JOB-7"
    assert errors_of(environment={"keys": ["dropbox"]})["spec.environment"][0] == "R-JOB-7"
    big = {"image": "me/img:1", "image_size_gb": 50}
    rule, valid = errors_of(environment=big)["spec.environment"]
    assert rule == "R-JOB-7" and valid and "50" in valid
    nb = errors_of(type="notebook", environment={"image": "me/img:1"})["spec.environment"]
    assert nb[0] == "R-JOB-7"
    ok(type="notebook", environment={"image": "me/img:1", "image_packages": ["jupyterlab"]})
    assert errors_of(env={"1BAD": "x"})["spec.env"][0] == "R-JOB-7"


def test_a_regional_datastore_names_its_region_r_res_1() -> None:
    """A datastore is a region's: without the region the job would not be pinned there."""
    located = {"type": "regional_datastore", "path": "/sub", "datastore": "nas"}
    assert errors_of(input_data=located, type="inference")["spec.input_data"][0] == "R-RES-1"
    assert errors_of(output_data=located)["spec.output_data"][0] == "R-RES-1"
    pinned = ok(output_data={**located, "region": "lab"})
    assert pinned.pinned_region == "lab"


def test_any_job_type_may_hold_a_reservation_r_res_3() -> None:
    for job_type in ("training", "inference", "notebook", "endpoint"):
        extra = {"endpoint": {"server_command": ["serve"]}} if job_type == "endpoint" else {}
        spec = ok(type=job_type, reservation={"region": "lab", "name": "port-80"}, **extra)
        assert spec.pinned_region == "lab"


def test_a_job_pinned_to_two_regions_is_refused_r_res_1() -> None:
    e = errors_of(
        type="notebook",
        region="a",
        reservation={"region": "b", "name": "port-80"},
    )
    assert any(rule == "R-RES-1" for rule, _ in e.values())
    assert ok(region="a").pinned_region == "a"


def test_every_failure_is_reported_at_once() -> None:
    e = errors_of(disk_size_gb=1, type="inference", datasets=[{"name": "x"}], env={"-": "x"})
    assert {"spec.disk_size_gb", "spec.datasets", "spec.env"} <= set(e)


def test_nested_schema_errors_name_the_nested_rule() -> None:
    e = errors_of(datasets=[{"name": "-bad"}], type="training")
    assert e["spec.datasets.0.name"][0] == "R-JOB-3"
    e = errors_of(type="inference", input_data={"type": "dropbox", "path": "/x"})
    assert e["spec.input_data.type"][0] == "R-JOB-3"


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"gpu_count": "0.25", "max_price": "1.50", "region": "us-east1"},
        {"gpu_count": 2, "workers": 2, "command": [], "worker_commands": [["a"], ["b"]]},
        {
            "type": "endpoint",
            "command": [],
            "model": MODEL,
            "endpoint": {"routes": [ROUTE]},
            "environment": {"python_version": "3.10", "framework": "pytorch", "keys": ["aws"]},
            "env": {"A": "1"},
        },
        {
            "datasets": [{"name": "PASCAL VOC"}],
            "checkpoints": [{"name": "ck"}],
            "output_data": {
                "type": "regional_datastore",
                "path": "/o",
                "datastore": "nas",
                "region": "r1",
            },
            "disk_size_gb": 10,
        },
    ],
)
def test_a_job_keeps_its_spec_without_defaults_and_reads_back_the_same(
    fields: dict[str, Any],
) -> None:
    """The scheduler stores what differs from the defaults (jobrequest.stored_spec); env values
    are sealed apart from it (tests/unit/test_secrets.py)."""
    spec = ok(**fields)
    stored = jobrequest.stored_spec(spec)
    assert JobSpec.model_validate(stored) == spec.redacted()
    assert jobrequest.shown_spec(stored) == spec.redacted().model_dump(mode="json")


def test_a_stored_spec_leaves_its_defaults_out() -> None:
    assert jobrequest.stored_spec(ok(disk_size_gb=10)) == BASE  # 10 GB is the default
