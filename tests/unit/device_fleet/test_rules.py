"""Where devices may be (R-DEV-1, R-NODE-3) and what a configuration may say (R-DEV-2), on
plain data."""

from __future__ import annotations

import pytest
from gpufleet_contracts.datastores import RegionFacts
from gpufleet_contracts.devices import AddDevice, DeviceConfigSpec, DeviceModel
from gpufleet_contracts.errors import Refused
from gpufleet_device_fleet.rules import check_config, check_region
from pydantic import ValidationError

CENTRAL = RegionFacts(
    region_id="acme/lab",
    compute_nodes=0,
    plan="team",
    provider="physical",
    storage_mode="central",
    storage_node_active=True,
)


def test_a_central_region_with_an_active_storage_node_takes_devices() -> None:
    check_region("lab", CENTRAL)


@pytest.mark.parametrize(
    ("change", "rule", "says"),
    [
        ({"provider": "gcp"}, "R-DEV-1", "not a physical region"),
        ({"storage_mode": "local"}, "R-DEV-1", "storage mode is not central"),
        ({"storage_node_active": False}, "R-NODE-3", "no active storage node"),
    ],
)
def test_other_regions_are_refused_naming_the_rule(change: dict, rule: str, says: str) -> None:
    with pytest.raises(Refused) as caught:
        check_region("lab", CENTRAL.model_copy(update=change))
    assert caught.value.code == "invalid"
    assert [(f.field, f.rule, f.message) for f in caught.value.fields] == [("region", rule, says)]


def test_the_five_jetson_models() -> None:
    assert {m.value for m in DeviceModel} == {
        "jetson-agx-xavier",
        "jetson-xavier-nx",
        "jetson-agx-orin",
        "jetson-orin-nx",
        "jetson-orin-nano",
    }
    with pytest.raises(ValidationError):
        AddDevice(region="lab", name="d1", minion_id="m1", model="jetson-tx2")  # type: ignore[arg-type]


def spec(**kw: object) -> DeviceConfigSpec:
    return DeviceConfigSpec.model_validate(
        {"image": "nvcr.io/l4t:r36", "model": "yolo", "start_command": "python serve.py", **kw}
    )


def test_image_model_and_start_command_are_required() -> None:
    for missing in ("image", "model", "start_command"):
        data = {"image": "i", "model": "m", "start_command": "c"}
        del data[missing]
        with pytest.raises(ValidationError):
            DeviceConfigSpec.model_validate(data)


def test_paths_are_made_canonical_and_kept_inside() -> None:
    got = check_config(spec(datastore="nas", datastore_path="/cams/%2e/out"))
    assert got.datastore_path == "/cams/./out"
    assert got.output_path == "/opt/ml/output"


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"datastore": "nas", "datastore_path": "/../etc"}, "datastore_path"),
        ({"datastore": "nas", "datastore_path": "/a/%2e%2e/%2e%2e/x"}, "datastore_path"),
        ({"datastore_path": "/sub"}, "datastore_path"),  # a path needs its datastore
        ({"output_path": "relative"}, "output_path"),
        ({"output_path": "/"}, "output_path"),
    ],
)
def test_bad_paths_are_refused_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(Refused) as caught:
        check_config(spec(**kw))
    assert caught.value.fields[0].field == field


def test_env_names_and_key_types_are_checked() -> None:
    assert spec(keys=["huggingface", "aws", "aws"]).keys == ["aws", "huggingface"]
    with pytest.raises(ValidationError):
        spec(keys=["nope"])
    with pytest.raises(ValidationError):
        spec(env={"1BAD": "x"})
