"""A device's attached keys on plain data (devicekeys.py): only keys a configuration the
device was told to run attaches, with that configuration's image; only its owner's; a
registry key as the pull's credential for its own registry; everything sealed to the key the
device sent, which alone opens it."""

from __future__ import annotations

import pytest
from gpufleet_auth.sealing import SealError, SealingKey
from gpufleet_contracts.devices import DeviceConfigKeys, DeviceConfigsTold, GetDeviceKeys
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.jobs import SecretFields
from gpufleet_scheduler.devicekeys import check, sealed_reply, secrets

KEY = SealingKey.generate()
IMAGE = "registry.example/cam:1"
TOLD = DeviceConfigsTold(
    minion_id="jx-1",
    owner="acme",
    configs=[
        DeviceConfigKeys(image=IMAGE, keys=["aws", "huggingface"]),
        DeviceConfigKeys(image="old:1", keys=["wasabi"]),  # the last one it ran
    ],
)
STORED = {
    "aws": {"access_key_id": "AKIA", "secret_access_key": "s3cr3t"},
    "huggingface": {"token": "hf-value"},
    "wasabi": {"access_key_id": "W", "secret_access_key": "w-value"},
    "docker": {"username": "u", "password": "docker-value", "registry": "registry.example"},
}


def asked(types: list[str], image: str = IMAGE) -> GetDeviceKeys:
    return GetDeviceKeys(image=image, types=types, public_key=KEY.public_key)


def test_keys_a_configuration_it_was_told_to_run_attaches_are_granted() -> None:
    check(asked(["aws"]), TOLD)
    check(asked(["aws", "huggingface"]), TOLD)
    check(asked(["wasabi"], "old:1"), TOLD)  # a revert goes back to it


def test_keys_of_no_configuration_of_this_device_are_not_found() -> None:
    with pytest.raises(NotFound):
        check(asked(["gcp"]), TOLD)  # attached by no configuration it was told to run
    with pytest.raises(NotFound):
        check(asked(["wasabi"]), TOLD)  # another configuration's keys, with this image
    with pytest.raises(NotFound):
        check(asked(["aws", "wasabi"]), TOLD)  # not one configuration's
    with pytest.raises(NotFound):
        check(asked(["aws"]), DeviceConfigsTold(minion_id="jx-1", owner="acme", configs=[]))


def test_a_key_its_owner_has_not_attached_is_not_found() -> None:
    with pytest.raises(NotFound) as refused:
        secrets(IMAGE, ["aws", "gcp"], STORED)
    assert "gcp" in str(refused.value) and "s3cr3t" not in str(refused.value)


def test_a_registry_key_is_the_pull_s_credential_for_its_own_registry_only() -> None:
    found = secrets(IMAGE, ["docker", "huggingface"], STORED)
    assert found.registry_auth is not None and found.registry_auth.password == "docker-value"
    assert found.attached == {"huggingface": {"token": "hf-value"}}  # never the docker key
    elsewhere = secrets("docker.io/other:1", ["docker"], STORED)
    assert elsewhere.registry_auth is None and elsewhere.attached == {}


def test_the_reply_is_sealed_to_the_device_s_key_and_says_no_value() -> None:
    reply = sealed_reply(
        ["huggingface", "aws"], secrets(IMAGE, ["aws", "huggingface"], STORED), KEY.public_key
    )
    shown = reply.model_dump_json()
    assert "s3cr3t" not in shown and "hf-value" not in shown and "AKIA" not in shown
    assert reply.types == ["aws", "huggingface"]
    opened = SecretFields.model_validate_json(KEY.open(reply.sealed.box, reply.sealed.key_id))
    assert opened.attached_keys["aws"]["secret_access_key"] == "s3cr3t"
    other = SealingKey.generate()
    with pytest.raises(SealError):
        other.open(reply.sealed.box, reply.sealed.key_id)
