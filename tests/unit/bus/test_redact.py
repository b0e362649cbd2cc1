"""Dead-letter records never hold a secret (gpufleet_bus.redact, deadletter.dead_letter_bytes)."""

from __future__ import annotations

import hashlib
import json
from functools import cache

import pytest
from gpufleet_bus.deadletter import dead_letter_bytes
from gpufleet_bus.redact import REDACTED, body_fields, is_secret_key, redact, redact_text
from gpufleet_gcp_emulator.testing import service_account_key

SEED = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU"  # a user nkey seed's shape
JWT = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ."
    "eyJqdGkiOiJBQkMiLCJpYXQiOjE3MDAwMDAwMDAsIm5hbWUiOiJ4In0."
    "c2lnbmF0dXJlLWJ5dGVzLWhlcmU"
)
CREDS = f"""-----BEGIN NATS USER JWT-----
{JWT}
------END NATS USER JWT------

************************* IMPORTANT *************************
-----BEGIN USER NKEY SEED-----
{SEED}
------END USER NKEY SEED------
"""


@cache
def gcp_key() -> dict[str, str]:
    return service_account_key("acme-gpu", key_id="0123456789abcdef")


def secrets_of_key() -> list[str]:
    key = gcp_key()
    body = key["private_key"].split("-----")[2].strip()  # the base64 between the PEM lines
    return [key["private_key"], key["private_key_id"], body[:40], body[-40:]]


def leaks(record: object, secrets: list[str]) -> list[str]:
    text = json.dumps(record)
    raw = json.dumps(record, ensure_ascii=False).replace("\\n", "\n")
    return [s for s in secrets if s in text or s in raw or s.replace("\n", "\\n") in text]


def test_the_array_wrapped_gcp_key_of_the_issue_keeps_nothing_secret() -> None:
    """The body of the issue: enable_provider wrapped in a JSON array, refused as invalid."""
    body = [{"provider": "gcp", "payment_mode": "credits", "key_json": json.dumps(gcp_key())}]
    raw = json.dumps(body).encode()
    record = json.loads(
        dead_letter_bytes(
            "provisioner",
            "gpufleet.v1.rpc.provisioner.enable_provider.acme",
            raw,
            {"ce-type": "gpufleet.provisioner.enable_provider.v1", "gpufleet-x": "y"},
            "invalid",
            [{"field": "(message)", "rule": "schema:dict_type", "message": "bad"}],
        )
    )
    assert leaks(record, secrets_of_key()) == []
    assert record["payload"] == [
        {"provider": "gcp", "payment_mode": "credits", "key_json": REDACTED}
    ]
    assert record["account"] == "acme"
    assert record["headers"] == {"ce-type": "gpufleet.provisioner.enable_provider.v1"}


def test_the_key_itself_as_a_body_or_inside_any_string_is_redacted() -> None:
    key = gcp_key()
    as_object = redact(key)
    assert as_object["private_key"] == as_object["private_key_id"] == REDACTED
    assert as_object["client_email"] == key["client_email"]  # not a secret: kept
    # a JSON document inside a string (double-encoded, under a key that names nothing)
    nested = redact({"note": json.dumps({"wrapped": [key]})})
    assert leaks(nested, secrets_of_key()) == []
    assert json.loads(nested["note"])["wrapped"][0]["project_id"] == "acme-gpu"
    # a key pasted into free text, with its newlines escaped as JSON would
    text = "please use " + json.dumps(key["private_key"]) + " thanks"
    assert leaks(redact_text(text), secrets_of_key()) == []
    assert redact_text(text).startswith("please use ")
    # the base64 body of a key without its PEM lines
    der = key["private_key"].split("-----")[2].replace("\n", "")
    assert leaks(redact({"blob": der}), secrets_of_key()) == []


def test_a_pem_block_cut_short_is_redacted_to_the_end() -> None:
    pem = gcp_key()["private_key"]
    cut = "key: " + pem[: len(pem) // 2]
    assert redact_text(cut) == f"key: {REDACTED}"


@pytest.mark.parametrize(
    "key",
    [
        "private_key",
        "private_key_id",
        "privateKey",
        "PRIVATE-KEY",
        "password",
        "db_password",
        "secret",
        "client_secret",
        "aws_secret_access_key",
        "token",
        "hf_token",
        "join_token",
        "api_key",
        "apiKey",
        "APIKey",
        "key_json",
        "service_account_key",
        "credentials",
        "ssh_key",
        "stripe_key",
        "seed",
        "jwt",
        "Authorization",
        "sealed_secrets",  # StartWorker's box: ciphertext, but no dead letter keeps it
    ],
)
def test_keys_that_name_secrets(key: str) -> None:
    assert is_secret_key(key)
    assert redact({"a": [{key: {"deep": "x"}}]}) == {"a": [{key: REDACTED}]}


@pytest.mark.parametrize(
    "key", ["name", "provider", "client_email", "public_key", "keys", "project_id", "env"]
)
def test_keys_that_do_not(key: str) -> None:
    assert not is_secret_key(key)


def test_environment_variables_keep_their_names_not_their_values() -> None:
    spec = {
        "spec": {
            "name": "train",
            "env": {"WANDB_API_KEY": "wk-123", "EPOCHS": "3"},
            "workers": [
                {"env": ["HF_TOKEN=hf_abc", "PLAIN"]},
                {"env": [{"name": "PASSWORD", "value": "hunter2"}]},
            ],
            "mounts": [{"target": "/data", "env": "DATA_DIR"}],  # a mount's variable name
            "environment": {"python_version": "3.11", "keys": ["wandb", "huggingface"]},
        }
    }
    out = redact(spec)["spec"]
    assert out["env"] == {"WANDB_API_KEY": REDACTED, "EPOCHS": REDACTED}
    assert out["workers"][0]["env"] == [f"HF_TOKEN={REDACTED}", "PLAIN"]
    assert out["workers"][1]["env"] == [{"name": "PASSWORD", "value": REDACTED}]
    assert out["mounts"][0]["env"] == "DATA_DIR"
    assert out["environment"] == spec["spec"]["environment"]  # key types, not keys
    assert "wk-123" not in json.dumps(out) and "hunter2" not in json.dumps(out)


def test_nats_credentials_seeds_and_jwts_in_free_text() -> None:
    out = redact({"log": "connect with\n" + CREDS, "who": f"seed {SEED} and {JWT}!"})
    text = json.dumps(out)
    assert SEED not in text and JWT not in text and JWT[:60] not in text
    assert out["who"] == f"seed {REDACTED} and {REDACTED}!"
    assert out["log"].startswith("connect with\n")
    for seed in ("SO", "SA", "SU"):
        assert redact_text(seed + SEED[2:]) == REDACTED


def test_secret_pairs_in_free_text() -> None:
    text = 'oops {"password": "hunter2", "token":"t0k", name=x api_key=abc123&y=1'
    out = redact_text(text)
    assert "hunter2" not in out and "t0k" not in out and "abc123" not in out
    assert "name=x" in out and "y=1" in out


def test_a_body_that_is_not_json_keeps_only_size_hash_and_a_redacted_excerpt() -> None:
    raw = b"\xff\xfe" + b"password=hunter2 " + gcp_key()["private_key"].encode() + bytes(range(32))
    fields = body_fields(raw)
    assert fields["payload"] is None and fields["payload_encoding"] == "opaque"
    assert fields["payload_size"] == len(raw)
    assert fields["payload_sha256"] == hashlib.sha256(raw).hexdigest()
    excerpt = fields["payload_excerpt"]
    assert "hunter2" not in excerpt and "PRIVATE" not in excerpt and "MII" not in excerpt
    assert all(c.isprintable() for c in excerpt)
    assert leaks(fields, secrets_of_key()) == []
    # malformed JSON: the same, and no base64 of the bytes anywhere
    malformed = b'{"key_json": "' + json.dumps(gcp_key()).encode() + b'"'
    record = json.loads(dead_letter_bytes("p", None, malformed, None, "invalid", []))
    assert record["payload_encoding"] == "opaque" and record["account"] is None
    assert leaks(record, secrets_of_key()) == []
    assert len(json.dumps(record)) < 1200


def test_a_long_excerpt_is_cut() -> None:
    fields = body_fields(b"<" + b"x" * 10_000)
    assert len(fields["payload_excerpt"]) <= 163 and fields["payload_excerpt"].endswith("...")


def test_json_bodies_of_every_shape() -> None:
    assert body_fields(b"[1, 2]")["payload"] == [1, 2]
    assert body_fields(b'"text"')["payload"] == "text"
    assert body_fields(b"null")["payload"] is None
    assert body_fields(b'{"a": {"token": 1}}')["payload"] == {"a": {"token": REDACTED}}
    assert body_fields(b"{}")["payload_encoding"] == "json"


def test_errors_of_a_record_are_redacted_too() -> None:
    record = json.loads(
        dead_letter_bytes(
            "svc", None, b"{}", None, "poison", [{"error": f"ValueError: bad seed {SEED}"}]
        )
    )
    assert record["errors"] == [{"error": f"ValueError: bad seed {REDACTED}"}]
