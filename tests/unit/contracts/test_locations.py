"""Typed locations (gpufleet_contracts.locations): what a job spec's data, model code and output
become on their way to a node, by type, never as a "type:path" string."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts.jobs import JobSpec, Mount, MountKind, StartWorker
from gpufleet_contracts.locations import (
    AzureSource,
    DatastoreRef,
    GcsSource,
    GitSource,
    LocalSource,
    PlatformAsset,
    PlatformRef,
    S3Source,
    WebSource,
    legacy_source,
    legacy_target,
)
from gpufleet_scheduler.mounts import plan
from pydantic import TypeAdapter, ValidationError

BASE: dict[str, Any] = {"name": "my job", "gpu_types": ["RTX 3090"], "command": ["true"]}


def sources(**spec: Any) -> dict[str, Any]:
    p = plan(JobSpec.model_validate({**BASE, **spec}), 0)
    return {m.target: m.source for m in p.mounts}


@pytest.mark.parametrize(
    ("input_data", "typed"),
    [
        ({"type": "aws", "path": "s3://b/in"}, S3Source(url="s3://b/in")),
        (
            {"type": "wasabi", "path": "s3://b/in", "endpoint": "https://s3.wasabisys.com"},
            S3Source(url="s3://b/in", endpoint="https://s3.wasabisys.com"),
        ),
        ({"type": "gcp", "path": "gs://b/in"}, GcsSource(url="gs://b/in")),
        (
            {"type": "azure", "path": "https://a.blob.core.windows.net/c/in"},
            AzureSource(url="https://a.blob.core.windows.net/c/in"),
        ),
        ({"type": "web", "path": "ftp://h/in.csv"}, WebSource(url="ftp://h/in.csv")),
        ({"type": "local", "path": "~/data"}, LocalSource(path="~/data")),
        (
            {"type": "regional_datastore", "path": "/sub", "datastore": "nfs1", "region": "eu"},
            DatastoreRef(datastore="nfs1", path="/sub", region="eu"),
        ),
        (  # a datastore named with another type is in that datastore (tenancy.py)
            {"type": "aws", "path": "s3://b/in", "datastore": "nfs1", "region": "eu"},
            DatastoreRef(datastore="nfs1", path="s3://b/in", region="eu"),
        ),
    ],
)
def test_an_inference_input_travels_typed(input_data: dict[str, Any], typed: Any) -> None:
    spec = {"type": "inference", "input_data": input_data}
    if input_data.get("datastore"):
        spec["region"] = "eu"
    assert sources(**spec)["/opt/ml/input"] == typed


def test_datasets_checkpoints_and_model_code_are_platform_or_located() -> None:
    found = sources(
        datasets=[{"name": "PASCAL VOC", "public": True}, {"name": "coco"}],
        checkpoints=[{"name": "base"}],
        model={"source": "git", "path": "git@github.com:me/m.git"},
    )
    assert found["/opt/ml/input/PASCAL_VOC"] == PlatformRef(
        asset=PlatformAsset.dataset, name="PASCAL VOC", public=True
    )
    assert found["/opt/ml/input/coco"] == PlatformRef(asset=PlatformAsset.dataset, name="coco")
    assert found["/opt/ml/input"] is None  # the directory holding several: nothing fills it
    assert found["/opt/ml/checkpoint"] == PlatformRef(asset=PlatformAsset.checkpoint, name="base")
    assert found["/opt/ml/models"] == GitSource(url="git@github.com:me/m.git")
    assert found["/opt/ml/output"] is None
    platform_model = sources(model={"source": "platform", "path": "resnet-50"})
    assert platform_model["/opt/ml/models"] == PlatformRef(
        asset=PlatformAsset.model, name="resnet-50"
    )


def test_the_output_target_is_typed_and_platform_outputs_name_their_kind() -> None:
    spec = JobSpec.model_validate({**BASE, "output_data": {"type": "platform", "path": "dataset"}})
    assert plan(spec, 0).output == PlatformRef(asset=PlatformAsset.dataset)
    spec = JobSpec.model_validate({**BASE, "output_data": {"type": "gcp", "path": "gs://b/o"}})
    assert plan(spec, 0).output == GcsSource(url="gs://b/o")
    assert plan(JobSpec.model_validate(BASE), 0).output is None


def test_a_source_is_told_by_its_kind_and_keeps_its_form() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(Mount)
    m = adapter.validate_python(
        {"target": "/opt/ml/input", "kind": "input", "source": {"kind": "gcs", "url": "gs://b/x"}}
    )
    assert m.source == GcsSource(url="gs://b/x") and m.kind is MountKind.input
    for wrong in (
        {"kind": "gcs", "url": "s3://b/x"},  # a GCS location is gs://
        {"kind": "local", "path": "./rel"},  # never relative (R-JOB-3)
        {"kind": "ftp", "url": "ftp://h/x"},  # no such kind
        {"kind": "s3", "url": "s3://b/x", "extra": 1},  # nothing but its own fields
    ):
        with pytest.raises(ValidationError):
            adapter.validate_python({"target": "/opt/ml/input", "kind": "input", "source": wrong})


def test_a_start_worker_round_trips_its_typed_locations() -> None:
    mount = Mount(
        target="/opt/ml/input",
        kind=MountKind.input,
        source=DatastoreRef(datastore="nfs1", path="/d"),
        env="ML_DATA_PATH",
    )
    cmd = StartWorker(
        minion_id="m",
        job_id="j",
        job_name="n",
        worker=0,
        command=["true"],
        gpu_indices=[],
        placement_id="p",
        mounts=[mount],
        output=S3Source(url="s3://b/o"),
    )
    again = StartWorker.from_bytes(cmd.to_bytes())
    assert again.mounts == [mount] and again.output == S3Source(url="s3://b/o")


@pytest.mark.parametrize(
    ("text", "typed"),
    [
        ("dataset:PASCAL VOC", PlatformRef(asset=PlatformAsset.dataset, name="PASCAL VOC")),
        (
            "public checkpoint:base",
            PlatformRef(asset=PlatformAsset.checkpoint, name="base", public=True),
        ),
        ("datasets", None),
        ("checkpoints", None),
        ("worker", None),
        ("aws:s3://b/k", S3Source(url="s3://b/k")),
        ("wasabi:s3://b/k", S3Source(url="s3://b/k")),  # its endpoint was never in the string
        ("git:https://h/r.git", GitSource(url="https://h/r.git")),
        ("platform:resnet", PlatformRef(asset=PlatformAsset.model, name="resnet")),
        ("regional_datastore:nfs1:/a/b", DatastoreRef(datastore="nfs1", path="/a/b")),
        ("local:$DATA/x", LocalSource(path="$DATA/x")),
    ],
)
def test_an_older_schedulers_source_strings_read_as_typed(text: str, typed: Any) -> None:
    assert legacy_source(text) == typed


def test_an_older_schedulers_output_target_strings_read_as_typed() -> None:
    assert legacy_target("aws:s3://b/o") == S3Source(url="s3://b/o")
    assert legacy_target("platform:checkpoint") == PlatformRef(asset=PlatformAsset.checkpoint)
    assert legacy_target("regional_datastore:/out") is None  # its datastore was not said
    for text in ("s3://b/o", "web:https://h/x", "nonsense"):
        with pytest.raises(ValueError):
            legacy_target(text)
    with pytest.raises(ValueError):
        legacy_source("x")
