"""A device's checkpoints on plain data (devicecheckpoints.py): only a checkpoint a
configuration the device was told to run names, asked of the datastore as a read of the
device's owner's, for the device (never a job, never a write)."""

from __future__ import annotations

import pytest
from gpufleet_contracts.devices import DeviceConfigKeys, DeviceConfigsTold, StageDeviceCheckpoint
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_contracts.platform import GrantPlatformObject
from gpufleet_scheduler.devicecheckpoints import check, read_grant
from pydantic import ValidationError

TOLD = DeviceConfigsTold(
    minion_id="jx-1",
    owner="acme",
    configs=[
        DeviceConfigKeys(image="cam:2", keys=[], checkpoints=["yolo-weights", "other/public"]),
        DeviceConfigKeys(image="cam:1", keys=[], checkpoints=["old-weights"]),  # last it ran
    ],
)


def test_a_checkpoint_a_configuration_it_was_told_to_run_names_is_granted() -> None:
    for name in ("yolo-weights", "other/public", "old-weights"):
        check(StageDeviceCheckpoint(name=name), TOLD)


@pytest.mark.parametrize("name", ["unnamed", "Yolo-weights", "acme/yolo-weights", "yolo"])
def test_any_other_checkpoint_is_not_found(name: str) -> None:
    with pytest.raises(NotFound):
        check(StageDeviceCheckpoint(name=name), TOLD)


def test_a_device_told_nothing_gets_nothing() -> None:
    told = DeviceConfigsTold(minion_id="jx-1", owner="acme", configs=[])
    with pytest.raises(NotFound):
        check(StageDeviceCheckpoint(name="yolo-weights"), told)


def test_the_datastore_is_asked_a_read_of_the_owner_s_checkpoint_for_the_device() -> None:
    grant = read_grant(StageDeviceCheckpoint(name="yolo-weights"), TOLD)
    assert (grant.account, grant.asset, grant.name) == (
        "acme",
        PlatformAsset.checkpoint,
        "yolo-weights",
    )
    assert (grant.mode, grant.device, grant.job_id) == ("read", "jx-1", None)


@pytest.mark.parametrize(
    "extra",
    [
        {"mode": "write", "device": "jx-1"},  # a device never writes
        {"mode": "read"},  # for nobody
        {"mode": "read", "device": "jx-1", "job_id": "j-1"},  # for both
    ],
)
def test_a_grant_is_for_one_job_or_one_device_s_read(extra: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        GrantPlatformObject.model_validate(
            {"account": "acme", "asset": "checkpoint", "name": "w", **extra}
        )
    GrantPlatformObject.model_validate(
        {"account": "acme", "asset": "checkpoint", "name": "w", "mode": "write", "job_id": "j"}
    )
