"""R-PROV-2: the service-account key is validated, its identity extracted, kept encrypted."""

from __future__ import annotations

import json
from functools import cache

import pytest
from cryptography.fernet import Fernet
from gpufleet_gcp_emulator.testing import service_account_key
from gpufleet_provisioner.keys import KeyError_, SecretBox, parse_key


@cache
def pem() -> str:
    return service_account_key("acme-gpu")["private_key"]


def key_json(**over: object) -> str:
    doc: dict[str, object] = {
        "type": "service_account",
        "project_id": "acme-gpu",
        "private_key_id": "abc",
        "private_key": pem(),
        "client_email": "gpufleet@acme-gpu.iam.gserviceaccount.com",
        "client_id": "1",
    }
    doc.update(over)
    return json.dumps({k: v for k, v in doc.items() if v is not None})


def test_valid_key_yields_project_and_email() -> None:
    key = parse_key(key_json())
    assert key.project_id == "acme-gpu"
    assert key.client_email == "gpufleet@acme-gpu.iam.gserviceaccount.com"
    assert "PRIVATE" not in repr(key) and "PRIVATE" not in str(key)


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("not json", ["key"]),
        ("[1]", ["key"]),
        (key_json(type="authorized_user"), ["type"]),
        (key_json(project_id=None), ["project_id"]),
        (key_json(client_email=None, private_key=None), ["client_email", "private_key"]),
        (key_json(private_key="-----BEGIN PRIVATE KEY-----\nnope\n"), ["private_key"]),
        (key_json(client_email="nobody"), ["client_email"]),
    ],
)
def test_invalid_keys_name_every_field(text: str, fields: list[str]) -> None:
    with pytest.raises(KeyError_) as err:
        parse_key(text)
    assert [f for f, _ in err.value.problems] == fields
    assert "BEGIN" not in str(err.value)  # never the key's content


def test_sealed_key_round_trips_and_hides_the_key() -> None:
    box = SecretBox(Fernet.generate_key().decode())
    token = box.seal(parse_key(key_json()))
    assert "PRIVATE" not in token and "acme-gpu" not in token
    assert box.open(token).project_id == "acme-gpu"
    with pytest.raises(RuntimeError, match="does not decrypt"):
        SecretBox(Fernet.generate_key().decode()).open(token)


def test_without_a_configured_key_nothing_is_stored() -> None:
    box = SecretBox(None)
    assert not box.configured
    with pytest.raises(RuntimeError, match="GPUFLEET_SECRET_KEY"):
        box.seal(parse_key(key_json()))
