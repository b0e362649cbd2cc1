"""The key store's requests (R-JOB-7): every key type has its fields, a refusal names fields
and rules but never a value, and the values stay out of reprs and dead letters."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus.redact import redact
from gpufleet_contracts import field_errors
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.jobspec import THIRD_PARTY_KEYS
from gpufleet_contracts.keys import KEY_KINDS, AttachKey, RemoveKey
from gpufleet_contracts.nodes import RegisterNode
from pydantic import ValidationError

VALUE = "v4lue-never-shown"


def test_every_third_party_key_type_has_its_fields() -> None:
    assert set(KEY_KINDS) == set(THIRD_PARTY_KEYS)
    assert all(kind.required for kind in KEY_KINDS.values())


def test_a_key_is_attached_with_its_fields_and_an_empty_optional_one_is_dropped() -> None:
    body = AttachKey(type="docker", secret={"username": "u", "password": VALUE, "registry": ""})
    assert body.secret == {"username": "u", "password": VALUE}
    assert VALUE not in repr(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "vault", "secret": {"token": VALUE}}, "type"),
        ({"type": "huggingface", "secret": {"tokn": VALUE}}, "secret"),
        ({"type": "huggingface", "secret": {}}, "secret"),
        ({"type": "docker", "secret": {"username": "u", "password": " "}}, "secret"),
        ({"type": "wandb", "secret": {"api_key": VALUE + "\x00"}}, "secret"),
        ({"type": "wandb", "secret": {"api_key": VALUE * 2000}}, "secret"),
    ],
)
def test_a_bad_key_is_refused_naming_the_field_and_rule_never_the_value(
    body: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        AttachKey.model_validate(body)
    errors = field_errors(exc.value)
    assert [(e.field, e.rule) for e in errors] == [(field, "R-JOB-7")]
    assert VALUE not in json.dumps([e.model_dump() for e in errors])


def test_remove_takes_a_known_type() -> None:
    assert RemoveKey(type="aws").type == "aws"
    with pytest.raises(ValidationError):
        RemoveKey(type="../aws")


def test_values_stay_out_of_start_workers_repr_and_of_dead_letters() -> None:
    cmd = StartWorker(
        minion_id="m",
        job_id="j",
        job_name="j",
        worker=0,
        command=["true"],
        gpu_indices=[0],
        placement_id="p",
        attached_keys={"huggingface": {"token": VALUE}},
    )
    assert VALUE not in repr(cmd)
    assert VALUE not in json.dumps(redact(json.loads(cmd.to_bytes())))
    attach = {"type": "huggingface", "secret": {"token": VALUE}}
    assert VALUE not in json.dumps(redact([attach]))


def test_a_node_registers_a_sealing_key_of_32_bytes_or_none() -> None:
    base = {
        "minion_id": "m",
        "name": "m",
        "region": "local",
        "owner": "acme",
        "hostname": "m",
        "gpus": [],
        "simulated": True,
        "inventory_source": "test",
        "agent_started_at": datetime.now(UTC),
    }
    assert RegisterNode.model_validate(base).sealing_key is None  # an older agent
    key = SealingKey.generate().public_key
    assert RegisterNode.model_validate({**base, "sealing_key": key}).sealing_key == key
    for bad in ("", "not-a-key", key[:-2] + "==", key + "AAAA"):
        with pytest.raises(ValidationError):
            RegisterNode.model_validate({**base, "sealing_key": bad})
