"""The rules of devices and their configurations, as pure functions over plain data (R-DEV-1,
R-DEV-2, R-NODE-3): every refusal names its field and rule."""

from __future__ import annotations

from gpufleet_contracts.datastores import RegionFacts
from gpufleet_contracts.devices import DeviceConfigSpec
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.paths import UnsafePath, contained_path


def check_region(name: str, facts: RegionFacts) -> None:
    """Devices only in physical regions with central storage and an active storage node."""
    if facts.provider != "physical":
        raise Refused.of_field(
            "invalid",
            f"region {name!r} is a {facts.provider} region: devices need a physical one",
            field="region",
            rule="R-DEV-1",
            says="not a physical region",
            valid="a physical region with central storage",
        )
    if facts.storage_mode != "central":
        raise Refused.of_field(
            "invalid",
            f"region {name!r} uses {facts.storage_mode} storage: devices need a region "
            "with central storage (create a new region for them)",
            field="region",
            rule="R-DEV-1",
            says="storage mode is not central",
            valid="a physical region with central storage",
        )
    if not facts.storage_node_active:
        raise Refused.of_field(
            "invalid",
            f"region {name!r} uses central storage: add its storage node and let it "
            "become active before adding devices",
            field="region",
            rule="R-NODE-3",
            says="no active storage node",
            valid="a central region with an active storage node",
        )


def check_config(spec: DeviceConfigSpec) -> DeviceConfigSpec:
    """The configuration's paths made canonical: the datastore path inside the datastore's
    root (R-RES-2), the output path absolute; a path needs its datastore."""
    try:
        path = contained_path(spec.datastore_path, rooted=True)
    except UnsafePath as exc:
        raise _path_refused("datastore_path", "R-RES-2", str(exc)) from None
    try:
        out = contained_path(spec.output_path, rooted=True)
    except UnsafePath as exc:
        raise _path_refused("output_path", "R-DEV-2", str(exc)) from None
    if out.rstrip("/") == "":
        raise _path_refused("output_path", "R-DEV-2", "the root directory")
    if spec.datastore is None and path != "/":
        raise _path_refused("datastore_path", "R-DEV-2", "a path without a datastore")
    return spec.model_copy(update={"datastore_path": path, "output_path": out})


def _path_refused(field: str, rule: str, why: str) -> Refused:
    return Refused.of_field(
        "invalid",
        f"{field}: {why}",
        field=field,
        rule=rule,
        says=why,
        valid="an absolute path inside its root, no '..'",
    )
