"""The names of platform objects: a job's output after its job, another account's public one
as <owner>/<name>, refusals naming the field and rule."""

from __future__ import annotations

import pytest
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_datastore.naming import addressed, checked, object_key, output_name


def test_an_output_is_named_after_its_job_then_numbered() -> None:
    assert output_name("train", []) == "train"
    assert output_name("train", ["train"]) == "train-2"
    assert output_name("train", ["train", "train-2", "train-4"]) == "train-3"
    assert output_name("train", ["train-2"]) == "train"


def test_a_name_is_the_callers_own_or_an_owners_public_one() -> None:
    assert addressed("coco", "alice") == ("alice", "coco")
    assert addressed("bob/coco", "alice") == ("bob", "coco")


@pytest.mark.parametrize("name", ["", "/coco", "bob/a/b", "../x", "a" * 201, "x.", "-x"])
def test_a_bad_name_is_refused_with_its_field_and_rule(name: str) -> None:
    with pytest.raises(Refused) as refused:
        addressed(name, "alice") if "/" in name else checked(name)
    assert refused.value.code == "invalid"
    assert [(f.field, f.rule) for f in refused.value.fields] == [("name", "R-JOB-3")]


def test_a_key_is_new_each_time_and_under_its_account() -> None:
    a, b = object_key("alice", PlatformAsset.model), object_key("alice", PlatformAsset.model)
    assert a != b and a.startswith("platform/alice/model/") and a.endswith(".zip")
