"""What a regional datastore may be (R-RES-1, R-RES-2, R-TEN-3), over plain data: each
refusal names its field and rule."""

from __future__ import annotations

from typing import Any

import pytest
from gpufleet_contracts.datastores import AddDatastore, DatastoreType, RegionFacts, options_problem
from gpufleet_contracts.errors import Refused
from gpufleet_datastore.shares import check_region, check_share

NFS: dict[str, Any] = {
    "region": "lab",
    "name": "nas",
    "type": "nfs",
    "address": "nas.lab.example",
    "root_path": "/export/dir2",
    "mount_options": ["vers=4.1", "soft", "timeo=50"],
}


def refused(body: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(Refused) as caught:
        check_share(AddDatastore.model_validate(body))
    field = caught.value.fields[0]
    return field.field, field.rule or ""


def test_a_plain_nfs_and_smb_datastore_pass() -> None:
    check_share(AddDatastore.model_validate(NFS))
    smb = {**NFS, "type": "smb", "root_path": "/share", "mount_options": ["vers=3.0"]}
    check_share(AddDatastore.model_validate({**smb, "username": "u", "password": "p w"}))
    check_share(AddDatastore.model_validate(smb))  # a guest share


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"address": "127.0.0.1"}, "address"),
        ({"address": "169.254.169.254"}, "address"),
        ({"address": "localhost"}, "address"),
        ({"address": "nas,vers=2"}, "address"),
        ({"address": "-o"}, "address"),
        ({"root_path": "export"}, "root_path"),
        ({"root_path": "/export/../etc"}, "root_path"),
        ({"root_path": "/export,sec=none"}, "root_path"),
        ({"root_path": "/a%2f..%2fb"}, "root_path"),
        ({"mount_options": ["exec"]}, "mount_options"),
        ({"mount_options": ["suid"]}, "mount_options"),
        ({"mount_options": ["vers=4.1,sec=none"]}, "mount_options"),
        ({"mount_options": ["hard"]}, "mount_options"),
        ({"mount_options": ["ro", "rw"]}, "mount_options"),
        ({"mount_options": ["ro", "ro"]}, "mount_options"),
        ({"username": "u", "password": "p"}, "username"),
        ({"password": "p"}, "password"),
    ],
)
def test_an_nfs_datastore_is_refused_on_its_field(change: dict[str, Any], field: str) -> None:
    assert refused({**NFS, **change}) == (field, "R-RES-2")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"root_path": "/"}, "root_path"),
        ({"mount_options": ["credentials=/etc/shadow"]}, "mount_options"),
        ({"mount_options": ["password=x"]}, "mount_options"),
        ({"mount_options": ["file_mode=777"]}, "mount_options"),
        ({"username": "u"}, "password"),
        ({"password": "p"}, "username"),
        ({"username": "u\nx", "password": "p"}, "username"),
        ({"username": "u", "password": "p\nusername=root"}, "password"),
    ],
)
def test_an_smb_datastore_is_refused_on_its_field(change: dict[str, Any], field: str) -> None:
    smb = {**NFS, "type": "smb", "root_path": "/share", "mount_options": []}
    assert refused({**smb, **change}) == (field, "R-RES-2")


def test_hard_needs_its_timeouts() -> None:
    assert options_problem(DatastoreType.nfs, ["hard", "timeo=600", "retrans=2"]) is None
    assert options_problem(DatastoreType.nfs, ["hard", "timeo=600"]) is not None


def facts(plan: str = "team", compute: int = 1) -> RegionFacts:
    return RegionFacts(region_id="a/lab", compute_nodes=compute, plan=plan)


def test_the_region_needs_a_team_plan_and_a_compute_node_or_device() -> None:
    check_region(facts(), 0, "lab")
    check_region(facts("enterprise", 0), 1, "lab")  # a device alone is enough
    for bad, devices, rule in ((facts("free"), 0, "R-TEN-3"), (facts(compute=0), 0, "R-RES-1")):
        with pytest.raises(Refused) as caught:
            check_region(bad, devices, "lab")
        assert caught.value.fields[0].rule == rule
